"""What finding the in-batch candidates in fixed shapes costs: one training step of
``SampledSoftmaxHead(in_batch_negatives=True)`` with the candidates sorted (``[T, T]`` logits, no
``torch.unique``: no host sync on a GPU, no graph break under ``torch.compile``; ``[T, N]`` where
``N < T``) against the
same step with the distinct targets of ``torch.unique`` (``[T, U]`` logits).

The head finds its candidates by :func:`lightning_sampled.ops.in_batch.batch_candidates`:
with ``in_batch_candidates="auto"``, sorted on a GPU at any ``T`` and under ``torch.compile``
on the CPU up to :data:`~lightning_sampled.ops.in_batch.FIXED_SHAPE_POSITIONS` positions,
distinct elsewhere.
Here both builders run at every ``T`` (``--positions``), forced by ``in_batch_candidates=
"sorted"`` and ``"distinct"`` on two heads with the same initial table, on ``T`` targets drawn
from a Zipf law over
``N`` classes (``p(i) ∝ 1 / (i + 1)``, as ``benchmarks/head_step.py``), ``D``-dimensional queries,
for pure in-batch negatives (``num_negatives=0``) and mixed ones (100 uniform draws per query
beside them). A step is the forward and backward of the head (no optimizer), on ``--device``
(the CPU with ``--threads`` threads, or a GPU, synchronised around each step); the builders
alternate round by round (``--repeats`` rounds after one
warm-up each), so that the load of other processes hits both alike, and the median is reported
with the ratio sorted / distinct of the same rounds. ``U`` is the number of distinct targets.

On the CPU the head keeps ``torch.unique`` (the cheaper there); on a GPU the sorted
candidates also spare the host sync that ``torch.unique`` makes, which a step's time on an
otherwise idle stream shows only in part.

Run: ``python -m benchmarks.in_batch_step [--positions 256 1120 4096] [--classes 100000]
[--dim 128] [--repeats 9] [--threads 1] [--device cpu|cuda] [--background TEXT]``; results in
``benchmarks/results/<--name>.{csv,md}`` (default ``in_batch_step``).
"""

from __future__ import annotations

import argparse

import torch

from lightning_sampled.heads import SampledSoftmaxHead
from lightning_sampled.ops.in_batch import FIXED_SHAPE_POSITIONS

from ._shapes import head_step, zipf_batch
from .common import add_timing_arguments, make_parser, medians_against, run_and_write, timed_rounds

BUILDERS = ("sorted", "distinct")
#: head name -> drawn negatives per query beside the batch's targets
HEADS = {"in_batch": 0, "mixed": 100}


def make_head(num_classes: int, dim: int, negatives: int, builder: str) -> SampledSoftmaxHead:
    """The in-batch head with ``negatives`` uniform draws per query and its candidates found by
    ``builder``; its table seeded alike for every builder."""
    torch.manual_seed(0)
    return SampledSoftmaxHead(
        num_classes,
        dim,
        num_negatives=negatives,
        in_batch_negatives=True,
        in_batch_candidates=builder,
    )


def check_same_loss(heads: dict[str, SampledSoftmaxHead], z: torch.Tensor, target: torch.Tensor):
    """Raises ``RuntimeError`` unless the builders' heads (without draws) give one loss."""
    with torch.no_grad():
        losses = [head(z, target) for head in heads.values()]
    if not torch.allclose(*losses, rtol=1e-5, atol=1e-6):
        raise RuntimeError(f"the builders disagree: losses {[float(x) for x in losses]}")


def measure(args: argparse.Namespace) -> list[dict]:
    """One row per number of positions, head and builder: median step seconds and the ratio
    to the distinct builder's median of the same rounds."""
    rows = []
    device = torch.device(args.device)
    generator = torch.Generator().manual_seed(0)
    for positions in args.positions:
        target, z, distinct = zipf_batch(positions, args.classes, args.dim, generator, device)
        for head_name, negatives in HEADS.items():
            heads = {
                b: make_head(args.classes, args.dim, negatives, b).to(device) for b in BUILDERS
            }
            if negatives == 0:  # no draws: the two builders give one loss
                check_same_loss(heads, z, target)
            fns = {name: head_step(head, z, target) for name, head in heads.items()}
            medians = medians_against(timed_rounds(fns, args.repeats, device), "distinct")
            for name, (median, ratio) in medians.items():
                rows.append(
                    {
                        "device": args.device,
                        "positions": positions,
                        "distinct_targets": distinct,
                        "head": head_name,
                        "candidates": name,
                        "logit_columns": positions if name == "sorted" else distinct,
                        "median_ms": 1e3 * median,
                        "vs_distinct": ratio,
                    }
                )
            print(
                f"T={positions} U={distinct} {head_name}: sorted "
                f"{1e3 * medians['sorted'][0]:.2f} ms, distinct "
                f"{1e3 * medians['distinct'][0]:.2f} ms",
                flush=True,
            )
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = make_parser(__doc__)
    parser.add_argument("--positions", type=int, nargs="+", default=[256, 1120, 4096])
    parser.add_argument("--classes", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=128)
    add_timing_arguments(parser, repeats=9, name="in_batch_step")
    args = parser.parse_args(argv)
    if min(*args.positions, args.classes, args.dim, args.repeats, args.threads) < 1:
        parser.error("--positions, --classes, --dim, --repeats and --threads must be >= 1")
    return args


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    notes = (
        f"One forward and backward of `SampledSoftmaxHead(in_batch_negatives=True)` ("
        f"`num_negatives` 0 or 100 uniform), N = {args.classes:,} classes, D = {args.dim}, "
        f"Zipf targets; median of {args.repeats} rounds, the two builders alternating; "
        f"`vs_distinct`: the ratio to `torch.unique`'s distinct candidates in the same rounds. "
        f"The head sorts at any T on a GPU, up to {FIXED_SHAPE_POSITIONS:,} positions under "
        "torch.compile on the CPU. Command: `python -m "
        f"benchmarks.in_batch_step --positions {' '.join(map(str, args.positions))} --classes "
        f"{args.classes} --dim {args.dim} --repeats {args.repeats} --threads {args.threads} "
        f"--device {args.device}`."
    )
    return run_and_write(
        args,
        measure,
        title="In-batch candidates: sorted in fixed shapes against torch.unique",
        notes=notes,
    )


if __name__ == "__main__":
    main()
