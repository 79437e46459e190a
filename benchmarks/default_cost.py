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

``--limits K ...`` adds the default head with ``max_in_batch_draws=K`` (named ``default K``): the
targets of ``K`` positions drawn at random are the in-batch candidates, ``[T, <= K]`` instead
of ``[T, U]``; a limit at or above ``T`` changes nothing, so it is timed only below ``T``.

Run: ``python -m benchmarks.default_cost [--shapes ptb gcide ml1m synthetic_1m] [--limits 256
1024] [--whole-block] [--repeats 7] [--threads 1] [--device cpu|cuda] [--background TEXT]``;
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
from .common import add_timing_arguments, make_parser, medians_against, run_and_write, timed_rounds


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


def make_head(shape: Shape, in_batch: bool | str, limit: int | None = None) -> SampledSoftmaxHead:
    """The recipe's sampled head with uniform draws (at most ``limit`` in-batch ones), its
    table seeded alike for every head."""
    torch.manual_seed(0)
    return SampledSoftmaxHead(
        shape.classes,
        shape.dim,
        num_negatives=shape.negatives,
        in_batch_negatives=in_batch,
        sparse_grad=shape.sparse,
        max_in_batch_draws=limit,
    )


def heads_of(shape: Shape, limits: list[int]) -> dict[str, SampledSoftmaxHead]:
    """The default and the plain head, and the default under each limit below ``T``."""
    heads = {name: make_head(shape, in_batch) for name, in_batch in HEADS.items()}
    for limit in limits:
        if limit < shape.positions:
            heads[f"default {limit}"] = make_head(shape, "auto", limit)
    return heads


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


def measure(args: argparse.Namespace) -> list[dict]:
    """One row per shape and head: median step seconds and the ratio to the plain head's."""
    rows = []
    device = torch.device(args.device)
    generator = torch.Generator().manual_seed(0)
    for name in args.shapes:
        shape = SHAPES[name]
        target, z, distinct = zipf_batch(
            shape.positions, shape.classes, shape.dim, generator, device
        )
        fns = {
            name: head_step(head.to(device), z, target)
            for name, head in heads_of(shape, args.limits).items()
        }
        if args.whole_block:
            whole = make_head(shape, "auto").to(device)
            fns["default, one block"] = in_one_block(head_step(whole, z, target))
        medians = medians_against(timed_rounds(fns, args.repeats, device), "plain")
        for head, (median, ratio) in medians.items():
            rows.append(
                {
                    "device": args.device,
                    **shape._asdict(),
                    "distinct_targets": distinct,
                    "head": head,
                    "median_ms": 1e3 * median,
                    "vs_plain": ratio,
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
        "--whole-block",
        action="store_true",
        help="also time the default scoring every row in one block (no MAX_BLOCK_ELEMENTS)",
    )
    add_timing_arguments(parser, repeats=7, name="default_cost")
    args = parser.parse_args(argv)
    if min(args.repeats, args.threads, *args.limits) < 1:
        parser.error("--repeats, --threads and --limits must be >= 1")
    return args


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    notes = (
        "One forward and backward of `SampledSoftmaxHead` with uniform draws, the default "
        'configuration (`in_batch_negatives="auto"`: the batch\'s other targets join the draws) '
        "against the plain head (`in_batch_negatives=False`), at the recipes' batch shapes, Zipf "
        "targets; `default K`: the default with `max_in_batch_draws=K` (where K < T); `default, "
        "one block`: the default with no bound on a block of scored rows; median of "
        f"{args.repeats} rounds, the heads alternating; `vs_plain`: the ratio to the plain head "
        "in the same rounds. Command: `python -m benchmarks.default_cost --shapes "
        f"{' '.join(args.shapes)} --limits {' '.join(map(str, args.limits))}"
        f"{' --whole-block' if args.whole_block else ''} --repeats "
        f"{args.repeats} --threads {args.threads} --device {args.device}`."
    )
    return run_and_write(
        args,
        measure,
        title="The default configuration's price: in-batch negatives beside the draws",
        notes=notes,
    )


if __name__ == "__main__":
    main()
