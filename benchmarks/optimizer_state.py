"""Memory and step time of ``LazyAdam``'s lean table-state options beside today's ``LazyAdam``.

For each option (table dtype, ``table_state``, ``state_dtype``) and each ``[N, D]`` class table,
one sparse step over a few touched rows (``F.embedding(..., sparse=True)``'s gradient of random
ids) creates the optimizer state; the bytes are then read from the tensors themselves
(``untyped_storage().nbytes()`` of the table and of every state tensor, the step counter
included). A table whose predicted bytes exceed ``--max-gb`` is not allocated: its bytes per row
are those measured at the largest ``N`` that fits (the same ``D`` and option), times ``N``, and
the row says ``extrapolated``. Then the step time of each option on one sparse gradient that
touches ``--ids`` random ids, round-robin over the options for ``--repeats`` rounds, medians.

Targets (issue 27, item 6): the row-wise state <= 0.1x of its table; a bf16 table with row-wise
state <= 0.6x the memory of an fp32 table with today's LazyAdam.

Run: ``python -m benchmarks.optimizer_state [--sizes 1e6x64 1e6x128 1e7x64 1e7x128] [--max-gb
8] [--ids 10240 102400] [--time-size 1e6x64] [--repeats 7] [--threads 1]``. It rewrites
``results/optimizer_state.{md,csv}`` (``--name``) and keeps the Markdown's sections from
``## Quality`` on (the training runs, written by hand), so that a rerun does not lose them.
"""

from __future__ import annotations

import argparse
import gc
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from lightning_sampled.optim import LazyAdam

from .common import (
    add_background_argument,
    add_threads_argument,
    make_parser,
    measured_load,
    result_path,
    set_threads,
    timed_optimizer_steps,
    write_results,
)

#: the section of the results' Markdown that a rerun keeps (written by hand)
KEPT_SECTION = "## Quality"
GIB = 2**30


@dataclass(frozen=True)
class Option:
    """One way to hold a class table and its optimizer state."""

    name: str
    table_dtype: torch.dtype = torch.float32
    kwargs: dict = field(default_factory=dict)

    @property
    def row_wise(self) -> bool:
        return self.kwargs.get("table_state") == "row_wise_adagrad"


BF16 = torch.bfloat16
ROW_WISE = {"table_state": "row_wise_adagrad"}
OPTIONS = [
    Option("LazyAdam (today: fp32 table, Adam)"),
    Option("fp32 table, Adam, bf16 moments", kwargs={"state_dtype": BF16}),
    Option("fp32 table, row-wise Adagrad", kwargs=ROW_WISE),
    Option("bf16 table, Adam, bf16 moments", BF16, {"state_dtype": BF16}),
    Option("bf16 table, row-wise Adagrad", BF16, ROW_WISE),
    Option("bf16 table, row-wise Adagrad, bf16 state", BF16, {**ROW_WISE, "state_dtype": BF16}),
]
BASELINE = OPTIONS[0]
BF16_ROW_WISE = OPTIONS[4]


def parse_size(text: str) -> tuple[int, int]:
    """``"1e6x64"`` -> ``(1000000, 64)``."""
    n, d = text.lower().split("x")
    return int(float(n)), int(d)


def sparse_grad(table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The uncoalesced sparse gradient (in the table's dtype) of a lookup of ``ids``."""
    leaf = table.detach().requires_grad_()
    F.embedding(ids, leaf, sparse=True).sum().backward()
    return leaf.grad


def random_ids(n: int, count: int, seed: int) -> torch.Tensor:
    return torch.randint(n, (count,), generator=torch.Generator().manual_seed(seed))


def build(option: Option, n: int, d: int) -> tuple[torch.nn.Parameter, LazyAdam]:
    """An ``[n, d]`` table of ``option``'s dtype (allocated, not initialised) and its optimizer."""
    table = torch.nn.Parameter(torch.empty(n, d, dtype=option.table_dtype))
    return table, LazyAdam([table], lr=1e-3, **option.kwargs)


def nbytes(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().nbytes()


def measure_bytes(option: Option, n: int, d: int, touched: int) -> tuple[int, int]:
    """``(table bytes, state bytes)`` after one sparse step over ``touched`` random ids."""
    table, optimizer = build(option, n, d)
    table.data[: min(n, touched)].normal_()  # the rows a step may read: finite values
    table.grad = sparse_grad(table, random_ids(min(n, touched), touched, seed=0))
    optimizer.step()
    state = optimizer.state[table]
    state_bytes = sum(nbytes(v) for v in state.values() if isinstance(v, torch.Tensor))
    return nbytes(table), state_bytes


def predicted_bytes(option: Option, n: int, d: int) -> int:
    """The bytes ``option`` allocates for an ``[n, d]`` table and its state (to decide whether
    it fits ``--max-gb``; the reported bytes are measured)."""
    table = n * d * option.table_dtype.itemsize
    state_item = option.kwargs.get("state_dtype", torch.float32).itemsize
    return table + (n if option.row_wise else 2 * n * d) * state_item


def memory_rows(
    sizes: list[tuple[int, int]], max_bytes: float, touched: int
) -> list[dict[str, object]]:
    """One row per (size, option): measured bytes, or bytes per row measured at the largest
    ``N`` that fits times ``N`` (``extrapolated``); ratios to the table and to today's
    LazyAdam at that size."""
    rows: list[dict[str, object]] = []
    per_row: dict[tuple[str, int], tuple[float, float, int]] = {}
    for n, d in sorted(sizes):
        baseline_total = None
        for option in OPTIONS:
            if predicted_bytes(option, n, d) <= max_bytes:
                table_bytes, state_bytes = measure_bytes(option, n, d, touched)
                free_large(table_bytes + state_bytes)
                per_row[(option.name, d)] = (table_bytes / n, state_bytes / n, n)
                how = "measured"
            elif (option.name, d) in per_row:
                table_row, state_row, at = per_row[(option.name, d)]
                table_bytes, state_bytes = round(table_row * n), round(state_row * n)
                how = f"extrapolated from N = {at:.0e}"
            else:
                continue
            total = table_bytes + state_bytes
            baseline_total = total if option is BASELINE else baseline_total
            rows.append(
                {
                    "N": n,
                    "D": d,
                    "option": option.name,
                    "table GB": round(table_bytes / 1e9, 4),
                    "state GB": round(state_bytes / 1e9, 4),
                    "total GB": round(total / 1e9, 4),
                    "table B/row": round(table_bytes / n, 2),
                    "state B/row": round(state_bytes / n, 2),
                    "state / table": round(state_bytes / table_bytes, 4),
                    "total / LazyAdam": (
                        round(total / baseline_total, 4) if baseline_total else "n/a"
                    ),
                    "bytes": how,
                }
            )
            print(rows[-1], flush=True)
    return rows


def time_rows(
    n: int, d: int, ids_per_step: list[int], repeats: int, threads: int
) -> list[dict[str, object]]:
    """Median seconds of one sparse step of each option on the same ids, round-robin."""
    rows: list[dict[str, object]] = []
    for count in ids_per_step:
        built = {}
        for option in OPTIONS:
            table, optimizer = build(option, n, d)
            table.data.normal_(generator=torch.Generator().manual_seed(1))
            grad = sparse_grad(table, random_ids(n, count, seed=2))
            built[option.name] = (table, optimizer, grad)
        # the warm-up round creates the state: not timed
        times = timed_optimizer_steps(built, repeats, warmup=1)
        base = _median(times[BASELINE.name])
        where = {"N": n, "D": d, "ids_per_step": count}
        for name, values in times.items():
            median = _median(values)
            rows.append({**where, "option": name, "median_ms": round(1e3 * median, 2)})
            rows[-1].update({"vs LazyAdam": round(median / base, 2), "threads": threads})
            print(rows[-1], flush=True)
        del built
        free_large(n * d * 12 * len(OPTIONS))
    return rows


def free_large(num_bytes: int) -> None:
    """Collects garbage after ``num_bytes`` >= 256 MiB were dropped: an optimizer sits in a
    reference cycle, so its table and state wait for the collector (0.4 s a call here, too slow
    to run after every small table)."""
    if num_bytes >= 1 << 28:
        gc.collect()


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def targets(memory: list[dict[str, object]]) -> list[str]:
    """The issue's two targets as Markdown list items, each "met" / "NOT met" with the worst
    measured (or extrapolated) case."""
    row_wise = [r for r in memory if "row-wise" in str(r["option"])]
    lean = [r for r in memory if r["option"] == BF16_ROW_WISE.name]
    return [
        *_target(row_wise, "state / table", 0.1, "row-wise state <= 0.1x of its table"),
        *_target(
            lean,
            "total / LazyAdam",
            0.6,
            "bf16 table + row-wise state <= 0.6x the memory of an fp32 table + LazyAdam",
        ),
    ]


def _target(rows: list[dict[str, object]], column: str, bound: float, text: str) -> list[str]:
    """``["- met: TEXT; worst ...x (...)"]`` (or ``NOT met``) for the largest ``column`` of
    ``rows``, or ``[]`` without rows."""
    if not rows:
        return []
    worst = max(rows, key=lambda r: float(r[column]))
    verdict = "met" if float(worst[column]) <= bound else "NOT met"
    where = f"{worst['option']}, N = {worst['N']:.0e}, D = {worst['D']}"
    return [f"- {verdict}: {text}; worst {worst[column]}x ({where})"]


def kept_section(name: str) -> str:
    """The existing results Markdown from :data:`KEPT_SECTION` on, or ``""``."""
    path = result_path(name, ".md")
    text = path.read_text() if path.exists() else ""
    return text[text.index(KEPT_SECTION) :] if KEPT_SECTION in text else ""


def markdown(rows: list[dict[str, object]]) -> str:
    columns = list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(str(row[c]) for c in columns) + " |")
    return "\n".join(lines)


def notes(args: argparse.Namespace, memory: list[dict], timing: list[dict]) -> str:
    text = [
        "## Targets",
        "",
        *targets(memory),
        "",
        f"Bytes: `untyped_storage().nbytes()` of the table and of every optimizer-state tensor "
        f"(the step counter included) after one sparse step over {args.touched} random ids; "
        f"tables whose predicted bytes exceed {args.max_gb} GiB are not allocated and are "
        f"extrapolated from the bytes per row measured at the largest N that fits (column "
        f"`bytes`). Per row: today's LazyAdam holds 12 D bytes (an fp32 table and two fp32 "
        f"moments), row-wise Adagrad 4 D + 4 (fp32 table) or 2 D + 4 (bf16 table).",
        "",
        "## Step time",
        "",
        f"One sparse step on the same uncoalesced gradient (`F.embedding(..., sparse=True)` of "
        f"`ids_per_step` random ids), the options alternating for {args.repeats} rounds after "
        f"one untimed round that creates the state; medians. A bf16 table's rows are updated in "
        f"fp32 and written back with stochastic rounding (random bits for every written entry).",
        "",
        markdown(timing) if timing else "(not measured)",
        "",
        f"Run: `python -m benchmarks.optimizer_state --sizes {' '.join(args.sizes)} --max-gb "
        f"{args.max_gb} --ids {' '.join(map(str, args.ids))} --time-size {args.time_size} "
        f"--repeats {args.repeats} --threads {args.threads}`.",
    ]
    kept = kept_section(args.name)
    return "\n".join(text) + ("\n\n" + kept if kept else "")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = make_parser(__doc__)
    parser.add_argument("--sizes", nargs="+", default=["1e6x64", "1e6x128", "1e7x64", "1e7x128"])
    parser.add_argument("--max-gb", type=float, default=8.0, help="GiB one option may allocate")
    parser.add_argument("--touched", type=int, default=1024, help="ids of the memory step")
    parser.add_argument("--ids", type=int, nargs="*", default=[10_240, 102_400])
    parser.add_argument("--time-size", default="1e6x64", help="the table of the timed steps")
    parser.add_argument("--repeats", type=int, default=7)
    add_threads_argument(parser)
    parser.add_argument("--name", default="optimizer_state", help="results file stem or path")
    add_background_argument(parser)
    args = parser.parse_args(argv)
    try:
        args.parsed_sizes = [parse_size(s) for s in args.sizes]
        args.parsed_time_size = parse_size(args.time_size)
    except ValueError:
        parser.error(f"sizes are NxD, such as 1e6x64; got {args.sizes} and {args.time_size}")
    for name in ("max_gb", "touched", "repeats", "threads"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    set_threads(args.threads)
    with measured_load(args.background) as load:
        memory = memory_rows(args.parsed_sizes, args.max_gb * GIB, args.touched)
        timing = time_rows(*args.parsed_time_size, args.ids, args.repeats, args.threads)
    write_results(
        args.name,
        memory,
        title="Lean optimizer state for the class table: memory per row and step time",
        header=load.header,
        notes=notes(args, memory, timing),
    )


if __name__ == "__main__":
    main()
