"""The price of the default configuration: one training step of ``SampledSoftmaxHead`` with the
batch's other targets as further negatives (``in_batch_negatives="auto"``, the default since
issue 31) against the same head without them (``in_batch_negatives=False``, the plain sampled
softmax), at the batch shapes of the recipes.

Each shape (``--shapes``, :data:`SHAPES`) is a recipe's batch: ``T`` scored positions, ``N``
classes, ``D`` dimensions and ``M`` uniform draws per query, the targets drawn from a Zipf law
over the classes (``p(i) ∝ 1 / (i + 1)``, as ``benchmarks/head_step.py``), so that the batch holds
``U`` distinct targets. The default adds one ``[T, U]`` product (and its correction) to the plain
head's ``[T, M]`` one; ``U`` grows with ``T`` and, for a large catalog, approaches it. Both heads
start from the same table and take the row-sparse gradient where the recipe does
(``sparse_grad``). A step is the forward and backward of the head alone (no encoder, no optimizer):
what the whole step of a recipe adds to this is the same for both, so the recipes' own step
ratios are smaller (``benchmarks/results/REPORT.md``, section 11). The two heads alternate round by
round (:func:`benchmarks.common.timed_rounds`), so that other processes' load hits both
alike, and the median of ``--repeats`` rounds is reported with the ratio default / plain.

``--whole-block`` adds the default head scoring every row in one block (``default, one block``:
no :data:`~lightning_sampled.ops.chunked.MAX_BLOCK_ELEMENTS` bound, so no activation
checkpointing either), against which the bounded blocks' recomputation is priced.

``--limits K ...`` adds the default head with ``max_in_batch_draws=K`` (named ``default K``): each
row's candidates are the targets of ``K`` other positions drawn for it, ``[T, K]`` gathered
vectors instead of the ``[T, U]`` block; a limit at or above ``T`` changes nothing, so it is
timed only below ``T``. ``--groups g ...`` adds each limit with groups of ``g`` consecutive rows
sharing their draws (``in_batch_group_size``, named ``default K g{g}``): one ``[g, D] x [D, K]``
product per group instead of ``K`` gathered vectors per row.

``--columns`` adds the default head with the batch's targets scored as ``[T, U]`` columns beside
the draws, a block of rows at a time (``default, columns``), as it scores them where it cannot
pool them into one column (a proposal that depends on the query, such as MIDX, or a limit):
against ``default`` it prices the pooling
(:meth:`~lightning_sampled.heads.SampledSoftmaxHead.pooled`).

``products`` is the floor of what the default adds: the three ``[T, U, D]`` matrix products of
its in-batch block alone (the logits ``z W_U^T``, then ``G W_U`` and ``G^T z`` for the gradients
of the queries and of the ``U`` candidate rows), on tensors made beforehand, timed in the same
rounds. Issue 52's target is ``default - plain <= 1.3 x products`` at every shape.

``--memory`` adds each head's peak memory (``peak_mb``): the growth of one step over what the
process held before it, after a warm-up step, on CUDA by the allocator's statistics, on the CPU
by the peak resident set of a fresh process per head (:func:`benchmarks.common.in_fresh_process`,
glibc's mmap threshold lowered so that large frees go back to the kernel), and its ratio to the
plain head's (``memory_vs_plain``). Issue 52's target is ``default <= 1.5 x plain`` at every shape.
The Markdown ends with the targets, "met" or "NOT met", computed from the run's own rows.

Run: ``python -m benchmarks.default_cost [--shapes ptb gcide ml1m synthetic_1m] [--limits 256
1024] [--groups 32 128] [--whole-block] [--columns] [--memory] [--repeats 7] [--threads 1]
[--device cpu|cuda] [--background TEXT]``;
results in ``benchmarks/results/default_cost.{csv,md}``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import NamedTuple

import torch

from lightning_sampled.heads import SampledSoftmaxHead
from lightning_sampled.ops import chunked

from ._shapes import head_step, zipf_batch
from .common import (
    add_timing_arguments,
    in_fresh_process,
    make_parser,
    medians_against,
    peak_extra_bytes,
    run_and_write,
    timed_rounds,
)


class Shape(NamedTuple):
    """A recipe's batch: ``positions`` (T), ``classes`` (N), ``dim`` (D), ``negatives`` (M)
    uniform draws per query, and whether the class table's gradient is row-sparse."""

    recipe: str
    positions: int
    classes: int
    dim: int
    negatives: int
    sparse: bool


#: the recipes' batches (``recipes/configs``): PTB 20 x 35 tokens, GCIDE 32 x 35 over 108,620
#: words (row-sparse), MovieLens-1M 128 users x 200 items (SASRec, GRU4Rec), and the 1M-item
#: SASRec 128 x 50 (row-sparse)
SHAPES = {
    "ptb": Shape("lstm_ptb", 700, 10_000, 200, 20, False),
    "gcide": Shape("lstm_gcide", 1_120, 108_620, 256, 20, True),
    "ml1m": Shape("sasrec_ml-1m", 25_600, 3_706, 64, 100, False),
    "synthetic_1m": Shape("sasrec_synthetic-1m", 6_400, 1_000_000, 64, 20, True),
}
#: head name -> ``in_batch_negatives``
HEADS = {"default": "auto", "plain": False}
#: the in-batch block's matrix products alone (:func:`products_of`)
PRODUCTS = "products"
#: issue 52's targets: (default - plain) / products, and default / plain peak memory
TIME_TARGET = 1.3
MEMORY_TARGET = 1.5


def make_head(
    shape: Shape, in_batch: bool | str, limit: int | None = None, group_size: int = 1
) -> SampledSoftmaxHead:
    """The recipe's sampled head with uniform draws (at most ``limit`` in-batch ones, shared by
    groups of ``group_size`` rows), its table seeded alike for every head."""
    torch.manual_seed(0)
    return SampledSoftmaxHead(
        shape.classes,
        shape.dim,
        num_negatives=shape.negatives,
        in_batch_negatives=in_batch,
        sparse_grad=shape.sparse,
        max_in_batch_draws=limit,
        in_batch_group_size=group_size,
    )


def heads_of(
    shape: Shape, limits: list[int], groups: list[int] = ()
) -> dict[str, SampledSoftmaxHead]:
    """The default and the plain head, and the default under each limit below ``T``, alone and
    with each group size below ``T``."""
    heads = {name: make_head(shape, in_batch) for name, in_batch in HEADS.items()}
    for limit in limits:
        if limit < shape.positions:
            heads[f"default {limit}"] = make_head(shape, "auto", limit)
            for group in groups:
                if 1 < group < shape.positions:
                    heads[f"default {limit} g{group}"] = make_head(shape, "auto", limit, group)
    return heads


def batch_of(shape: Shape, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The shape's batch (:func:`~benchmarks._shapes.zipf_batch`), the same in every process:
    ``(target [T], z [T, D], distinct targets U)``."""
    generator = torch.Generator().manual_seed(0)
    return zipf_batch(shape.positions, shape.classes, shape.dim, generator, device)


def products_of(
    positions: int, distinct: int, dim: int, device: torch.device
) -> Callable[[], None]:
    """The three ``[T, U, D]`` products of an in-batch block, on tensors made here: the logits
    ``z W^T`` ``[T, U]``, and from a gradient ``G`` ``[T, U]`` the queries' ``G W`` ``[T, D]``
    and the candidate rows' ``G^T z`` ``[U, D]``."""
    generator = torch.Generator().manual_seed(1)
    z, w = (torch.randn(n, dim, generator=generator).to(device) for n in (positions, distinct))
    g = torch.randn(positions, distinct, generator=generator).to(device)

    def run() -> None:
        torch.mm(z, w.T)
        torch.mm(g, w)
        torch.mm(g.T, z)

    return run


def step_peak_mb(shape: Shape, head: str, device: str) -> float:
    """Peak memory (MiB) of one step of the shape's ``head`` (a name of :func:`heads_of`, with
    ``", one block"`` for :func:`in_one_block` or ``", columns"`` for :func:`in_columns`) over
    what was held before it, after a warm-up step
    (:func:`benchmarks.common.peak_extra_bytes`)."""
    target, z, _ = batch_of(shape, torch.device(device))
    name, _, rest = head.partition(", ")
    kind, *bounds = name.split()  # "default", "default 256" or "default 256 g32"
    limit = int(bounds[0]) if bounds else None
    group = int(bounds[1].removeprefix("g")) if len(bounds) > 1 else 1
    made = make_head(shape, HEADS[kind], limit, group).to(device)
    step = head_step(made, z, target)
    if rest:
        step = VARIANTS[rest](step)
    step()
    return peak_extra_bytes(step, device) / 2**20


def peak_mb(shape: Shape, head: str, device: str) -> float:
    """:func:`step_peak_mb`, on the CPU in a fresh process (its own peak resident set)."""
    if device != "cpu":
        return step_peak_mb(shape, head, device)
    env = {"MALLOC_MMAP_THRESHOLD_": "131072"}
    return in_fresh_process("benchmarks.default_cost", "step_peak_mb", shape, head, device, env=env)


def in_one_block(step: Callable[[], None]) -> Callable[[], None]:
    """``step`` with no bound on the entries of a block of scored rows."""

    def run() -> None:
        bound = chunked.MAX_BLOCK_ELEMENTS
        chunked.MAX_BLOCK_ELEMENTS = 2**62
        try:
            step()
        finally:
            chunked.MAX_BLOCK_ELEMENTS = bound

    return run


def in_columns(step: Callable[[], None]) -> Callable[[], None]:
    """``step`` with the batch's targets scored as ``[T, U]`` columns, not pooled."""

    def run() -> None:
        pooled = SampledSoftmaxHead.pooled
        SampledSoftmaxHead.pooled = lambda self, z, negatives: negatives
        try:
            step()
        finally:
            SampledSoftmaxHead.pooled = pooled

    return run


#: the default head's variants by the name that follows ``"default, "``
VARIANTS = {"one block": in_one_block, "columns": in_columns}


def measure(args: argparse.Namespace) -> list[dict]:
    """One row per shape and head: median step seconds and the ratio to the plain head's."""
    rows = []
    device = torch.device(args.device)
    for name in args.shapes:
        shape = SHAPES[name]
        target, z, distinct = batch_of(shape, device)
        fns = {
            name: head_step(head.to(device), z, target)
            for name, head in heads_of(shape, args.limits, args.groups).items()
        }
        for variant, wanted in (("one block", args.whole_block), ("columns", args.columns)):
            if wanted:
                made = make_head(shape, "auto").to(device)
                fns[f"default, {variant}"] = VARIANTS[variant](head_step(made, z, target))
        fns[PRODUCTS] = products_of(shape.positions, distinct, shape.dim, device)
        medians = medians_against(timed_rounds(fns, args.repeats, device), "plain")
        peaks = {}
        if args.memory:
            peaks = {head: peak_mb(shape, head, args.device) for head in fns if head != PRODUCTS}
        for head, (median, ratio) in medians.items():
            memory = {}
            if args.memory:
                known = head in peaks
                memory = {
                    "peak_mb": peaks[head] if known else "",
                    "memory_vs_plain": peaks[head] / peaks["plain"] if known else "",
                }
            rows.append(
                {
                    "device": args.device,
                    **shape._asdict(),
                    "distinct_targets": distinct,
                    "head": head,
                    "median_ms": 1e3 * median,
                    "vs_plain": ratio,
                    **memory,
                }
            )
        times = ", ".join(f"{head} {1e3 * median:.1f} ms" for head, (median, _) in medians.items())
        print(f"{name}: T={shape.positions} U={distinct}: {times}", flush=True)
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = make_parser(__doc__)
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument(
        "--limits", nargs="*", type=int, default=[256, 1024], help="max_in_batch_draws to time"
    )
    parser.add_argument(
        "--groups", nargs="*", type=int, default=[], help="in_batch_group_size of each limit"
    )
    parser.add_argument(
        "--whole-block",
        action="store_true",
        help="also time the default scoring every row in one block (no MAX_BLOCK_ELEMENTS)",
    )
    parser.add_argument(
        "--columns",
        action="store_true",
        help="also time the default scoring the batch's targets as [T, U] columns (not pooled)",
    )
    parser.add_argument(
        "--memory", action="store_true", help="also measure each head's peak memory of a step"
    )
    add_timing_arguments(parser, repeats=7, name="default_cost")
    args = parser.parse_args(argv)
    if min(args.repeats, args.threads, *args.limits, *args.groups) < 1:
        parser.error("--repeats, --threads, --limits and --groups must be >= 1")
    return args


def targets(rows: list[dict]) -> list[str]:
    """Issue 52's targets at each shape of ``rows`` (:func:`measure`'s), "met" or "NOT met":
    ``default - plain <= TIME_TARGET x products`` and, where measured, ``default <=
    MEMORY_TARGET x plain`` in peak memory."""
    lines = []
    for recipe in dict.fromkeys(r["recipe"] for r in rows):
        at = {r["head"]: r for r in rows if r["recipe"] == recipe}
        extra = at["default"]["median_ms"] - at["plain"]["median_ms"]
        ratio = extra / at[PRODUCTS]["median_ms"]
        lines.append(
            f"- {recipe}, time: (default - plain) / products = {extra:.1f} / "
            f"{at[PRODUCTS]['median_ms']:.1f} ms = {ratio:.2f} (target <= {TIME_TARGET}): "
            + ("met" if ratio <= TIME_TARGET else "NOT met")
        )
        if at["default"].get("memory_vs_plain", "") != "":
            memory = at["default"]["memory_vs_plain"]
            lines.append(
                f"- {recipe}, memory: default / plain peak = {at['default']['peak_mb']:.1f} / "
                f"{at['plain']['peak_mb']:.1f} MiB = {memory:.2f} (target <= {MEMORY_TARGET}): "
                + ("met" if memory <= MEMORY_TARGET else "NOT met")
            )
    return lines


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    notes = (
        "One forward and backward of `SampledSoftmaxHead` with uniform draws, the default "
        'configuration (`in_batch_negatives="auto"`: the batch\'s other targets join the draws) '
        "against the plain head (`in_batch_negatives=False`), at the recipes' batch shapes, Zipf "
        "targets; `default K`: the default with `max_in_batch_draws=K` (where K < T: each row the "
        "targets of K other positions drawn for it; `default K gG`: groups of G rows share their K "
        "draws); `default, "
        "one block`: the default with no bound on a block of scored rows; `default, columns`: "
        "the default scoring the batch's targets as `[T, U]` columns, not pooled into one (as "
        "with a proposal that depends on the query); `products`: the three "
        "`[T, U, D]` matrix products of the default's in-batch block alone; median of "
        f"{args.repeats} rounds, the heads alternating; `vs_plain`: the ratio to the plain head "
        "in the same rounds"
        + (
            "; `peak_mb`: a step's peak memory over what was held before it (on the CPU the "
            "peak resident set of a fresh process per head)"
            if args.memory
            else ""
        )
        + ". Command: `python -m benchmarks.default_cost --shapes "
        f"{' '.join(args.shapes)} --limits {' '.join(map(str, args.limits))}"
        f"{' --groups ' + ' '.join(map(str, args.groups)) if args.groups else ''}"
        f"{' --whole-block' if args.whole_block else ''}{' --columns' if args.columns else ''}"
        f"{' --memory' if args.memory else ''} "
        f"--repeats {args.repeats} --threads {args.threads} --device {args.device}`."
    )
    return run_and_write(
        args,
        measure,
        title="The default configuration's price: in-batch negatives beside the draws",
        notes=lambda rows: "\n".join([notes, "", "## Targets (issue 52)", "", *targets(rows)]),
    )


if __name__ == "__main__":
    main()
