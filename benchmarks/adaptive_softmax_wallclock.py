"""AdaptiveSoftmax's wall clock against the dense top-1 (issue 55), with its dense fall-back.

Per head shape ``(n, d)`` and regime, one CPU thread, fp32:

- ``flat``: ``A`` iid ``N(0, 1/d)``, ``x`` iid ``N(0, 1)``: every logit about ``N(0, 1)``, top
  probability about ``1e-3``; the normalisation needs every arm to a few percent, so sampling
  would read nearly all of ``A``;
- ``peaked``: the same ``A``; each query a class row ``A_i`` scaled so that its top probability is
  0.58 (bisection on the scale), plus ``N(0, 0.3^2 / d)`` noise: the issue's "query aligned with
  one row", a trained language-model head's regime;
- ``paper (b)``: the paper's synthetic dataset (b) (``n = 100``, ``A`` iid ``N(0, 1/d^2)``,
  ``x = sign(A_1)``; ``benchmarks.adaptive_softmax``), where sampling needs few entries.

Dense is ``torch.softmax(x @ A.T).topk(1)``. The two alternate call by call
(:func:`benchmarks.common.timed_rounds`): at batch 1 over ``--repeats`` queries, the medians per
query; at batch 64 over ``--batch-repeats`` calls. ``dense_share`` is the share of queries the
fall-back answered densely (``samples_used >= n d``), ``entries`` the mean fraction of the ``n d``
products computed per query (``samples_used / (n d)``), ``cache_lines`` the mean fraction of
``A``'s 64-byte lines read per query at batch 1 (from the reads of the transposed copy and of
``A`` by the dense product, counted on ``--line-queries`` queries), ``success`` the share of
``--success-queries`` queries (in calls of 16) whose top-1 is exact with its probability within
``1 +- eps``, against ``1 - delta``. ``eps = 0.3``, ``delta = 0.1``, uncalibrated (factors 1).

The Markdown ends with issue 55's targets, "met" or "NOT met", computed from the run's rows.

Run from the repository root::

    .venv/bin/python -m benchmarks.adaptive_softmax_wallclock [--background TEXT]
    .venv/bin/python -m benchmarks.adaptive_softmax_wallclock --quick   # a smoke run
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from benchmarks.adaptive_softmax import synthetic_instance
from benchmarks.common import (
    add_background_argument,
    add_threads_argument,
    log,
    make_parser,
    run_and_write,
    timed_rounds,
)
from lightning_sampled.inference import (
    AdaptiveSoftmax,
    adaptive_success,
    arm_estimates,
    exact_topk_softmax,
)

EPS, DELTA = 0.3, 0.1
PEAKED_TOP_PROBABILITY = 0.58
LINE_BYTES = 64
#: issue 55's targets: the peaked regime at batch 1 and d >= 1,024; the flat regime at every batch
PEAKED_TARGET, FLAT_TARGET, PEAKED_MIN_DIM = 1.0, 1.2, 1024


def flat_queries(weight: Tensor, count: int, generator: torch.Generator) -> Tensor:
    """``[count, d]`` iid ``N(0, 1)`` queries."""
    return torch.randn(count, weight.shape[1], generator=generator)


def peaked_queries(weight: Tensor, count: int, generator: torch.Generator) -> Tensor:
    """``[count, d]`` queries ``s A_i + noise`` for random rows ``i``, each scale ``s`` found by
    bisection so that the top probability is :data:`PEAKED_TOP_PROBABILITY`."""
    dim = weight.shape[1]
    rows = weight[torch.randint(0, weight.shape[0], (count,), generator=generator)]
    noise = 0.3 * torch.randn(count, dim, generator=generator) / math.sqrt(dim)
    low, high = torch.zeros(count, 1), torch.full((count, 1), 64.0)
    for _ in range(40):
        middle = (low + high) / 2
        top = torch.softmax((middle * rows + noise) @ weight.T, dim=1).amax(1, keepdim=True)
        low = torch.where(top < PEAKED_TOP_PROBABILITY, middle, low)
        high = torch.where(top < PEAKED_TOP_PROBABILITY, high, middle)
    return high * rows + noise


def paper_instance(dim: int, count: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """The paper's dataset (b) at ``d``: ``A [100, d]`` and ``count`` copies of its query."""
    weight, x = synthetic_instance("b", dim, generator)
    return weight, x.expand(count, dim).contiguous()


@contextmanager
def counted_lines(module: AdaptiveSoftmax):
    """Counts the distinct 64-byte lines of ``A^T`` the module reads while inside (its two read
    functions patched); yields a list that holds the count once the block ends."""
    columns, _ = module._columns()
    per_line = LINE_BYTES // columns.element_size()
    lines: list[Tensor] = []
    read_entries, read_rows = arm_estimates.read_entries, arm_estimates.read_rows

    def entries(cols: Tensor, flat_index: Tensor) -> Tensor:
        lines.append(flat_index.reshape(-1).long() // per_line)
        return read_entries(cols, flat_index)

    def rows(cols: Tensor, coordinates: Tensor) -> Tensor:
        starts = coordinates.reshape(-1, 1).long() * cols.shape[1]
        offsets = torch.arange(0, cols.shape[1], per_line)
        lines.append(((starts + offsets) // per_line).reshape(-1))
        return read_rows(cols, coordinates)

    arm_estimates.read_entries, arm_estimates.read_rows = entries, rows
    count: list[int] = []
    try:
        yield count
    finally:
        arm_estimates.read_entries, arm_estimates.read_rows = read_entries, read_rows
        count.append(int(torch.cat(lines).unique().numel()) if lines else 0)


def line_fraction(module: AdaptiveSoftmax, queries: Tensor, weight: Tensor) -> float:
    """Mean fraction of ``A``'s lines read per query, one query per call: the sampled reads of
    the transposed copy, plus all of ``A`` where the query was answered densely."""
    total = weight.numel() * weight.element_size() / LINE_BYTES
    fractions = []
    for x in queries:
        with counted_lines(module) as count:
            result = module.topk(x[None])
        dense = int(result.samples_used) >= weight.numel()
        fractions.append(min(1.0, (count[0] + dense * total) / total))
    return statistics.fmean(fractions)


def success_rate(module: AdaptiveSoftmax, weight: Tensor, queries: Tensor) -> float:
    """Share of ``queries`` (in calls of 16) whose top-1 is exact with its probability within
    ``1 +- eps``."""
    results = [module.topk(chunk) for chunk in queries.split(16)]
    indices = torch.cat([result.indices for result in results])
    probs = torch.cat([result.probs for result in results])
    exact = exact_topk_softmax(weight, queries, 1)
    _, success = adaptive_success(indices, probs, exact, EPS)
    return float(success.double().mean())


def measure_case(name: str, weight: Tensor, queries: Tensor, args: Any) -> list[dict[str, Any]]:
    """The rows of one head and regime: batch 1 and batch 64, each call of AdaptiveSoftmax
    after a dense top-1 of the same queries (:func:`timed_rounds`), the queries changing from
    round to round."""
    module = AdaptiveSoftmax(weight, eps=EPS, delta=DELTA, seed=args.seed)
    n, d = weight.shape
    success = success_rate(module, weight, queries)
    rows = []
    for batch, repeats in ((1, args.repeats), (64, args.batch_repeats)):
        calls = [queries[(i * batch) % queries.shape[0] :][:batch] for i in range(repeats + 1)]
        state, results = {"call": 0}, []

        def dense(calls=calls, state=state) -> Any:
            return torch.softmax(calls[state["call"]] @ weight.T, dim=-1).topk(1)

        def adaptive(calls=calls, state=state, results=results) -> None:
            results.append(module.topk(calls[state["call"]]))
            state["call"] += 1

        times = timed_rounds({"dense": dense, "adaptive": adaptive}, repeats)
        dense_s, adaptive_s = (statistics.median(times[key]) for key in ("dense", "adaptive"))
        used = torch.cat([result.samples_used.reshape(-1) for result in results]).double()
        row = {
            "case": name,
            "n": n,
            "d": d,
            "batch": batch,
            "dense_ms_per_query": 1e3 * dense_s / batch,
            "adaptive_ms_per_query": 1e3 * adaptive_s / batch,
            "vs_dense": adaptive_s / dense_s,
            "dense_share": float((used >= n * d).double().mean()),
            "entries": float((used / (n * d)).mean()),
            "cache_lines": (
                line_fraction(module, queries[: args.line_queries], weight) if batch == 1 else ""
            ),
            "success": success,
            "queries": queries.shape[0],
        }
        rows.append(row)
        log(
            f"{name} ({n}, {d}) batch {batch}: dense {row['dense_ms_per_query']:.2f} ms/query, "
            f"adaptive {row['adaptive_ms_per_query']:.2f} (x{row['vs_dense']:.2f}), dense share "
            f"{row['dense_share']:.2f}, success {success:.3f}"
        )
    return rows


def measure(args: Any) -> list[dict[str, Any]]:
    """Every head shape and regime of the module docstring."""
    generator = torch.Generator().manual_seed(args.seed)
    rows = []
    for dim in args.dims:
        weight = torch.randn(args.classes, dim, generator=generator) / math.sqrt(dim)
        for regime, make in (("flat", flat_queries), ("peaked", peaked_queries)):
            queries = make(weight, args.success_queries, generator)
            rows += measure_case(regime, weight, queries, args)
    for dim in args.paper_dims:
        weight, queries = paper_instance(dim, args.success_queries, generator)
        rows += measure_case("paper (b)", weight, queries, args)
    return rows


def targets(rows: list[dict[str, Any]]) -> str:
    """Issue 55's targets, each "met" or "NOT met", from the rows."""
    lines = ["## Targets (issue 55)", ""]
    for row in rows:
        where = f"{row['case']}, (n, d) = ({row['n']}, {row['d']}), batch {row['batch']}"
        if row["case"] == "peaked" and row["batch"] == 1 and row["d"] >= PEAKED_MIN_DIM:
            bound = PEAKED_TARGET
        elif row["case"] == "flat":
            bound = FLAT_TARGET
        else:
            bound = None
        if bound is not None:
            verdict = "met" if row["vs_dense"] <= bound else "NOT met"
            lines.append(
                f"- {where}: adaptive / dense = {row['vs_dense']:.2f} (target <= {bound}): "
                f"{verdict}"
            )
        if row["batch"] == 1:
            verdict = "met" if row["success"] >= 1 - DELTA else "NOT met"
            lines.append(
                f"- {row['case']}, (n, d) = ({row['n']}, {row['d']}): success "
                f"{row['success']:.3f} over {row['queries']} queries (target >= {1 - DELTA}): "
                f"{verdict}"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    parser = make_parser(__doc__)
    parser.add_argument("--classes", type=int, default=32_000)
    parser.add_argument("--dims", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--paper-dims", type=int, nargs="*", default=[65_536])
    parser.add_argument("--repeats", type=int, default=25, help="batch-1 rounds")
    parser.add_argument("--batch-repeats", type=int, default=5, help="batch-64 rounds")
    parser.add_argument("--success-queries", type=int, default=512)
    parser.add_argument("--line-queries", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default="adaptive_softmax_wallclock")
    parser.add_argument("--quick", action="store_true", help="a smoke run of small shapes")
    add_threads_argument(parser)
    add_background_argument(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.classes, args.dims, args.paper_dims = 2_000, [256], [4096]
        args.repeats, args.batch_repeats, args.success_queries = 2, 1, 64
        args.line_queries = 2
        if args.name == parser.get_default("name"):
            args.name = "adaptive_softmax_wallclock_quick"
    return run_and_write(
        args,
        measure,
        title="AdaptiveSoftmax wall clock against the dense top-1, with the dense fall-back",
        notes=lambda rows: targets(rows) + "\n\n" + (__doc__ or "").split("\n\n", 1)[1],
        columns=[
            "case",
            "n",
            "d",
            "batch",
            "dense_ms_per_query",
            "adaptive_ms_per_query",
            "vs_dense",
            "dense_share",
            "entries",
            "cache_lines",
            "success",
        ],
    )


if __name__ == "__main__":
    main()
