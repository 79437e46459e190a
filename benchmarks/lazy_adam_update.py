"""``LazyAdam``'s sparse-row update against ``torch.optim.SparseAdam``'s, side by side.

The optimizer step alone (no forward or backward) on a ``[N, D]`` table whose row-sparse gradient
touches ``R`` rows (``F.embedding(..., sparse=True)``'s gradient of ``R`` random ids, duplicates
included, uncoalesced as autograd leaves it), median of round-robin rounds.

Run: ``python -m benchmarks.lazy_adam_update [--threads 1] [--repeats 7]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lightning_sampled.optim import LazyAdam

from .common import (
    add_threads_argument,
    make_parser,
    set_threads,
    timed_optimizer_steps,
    write_results,
)

NOTES = """The optimizer step alone on the same uncoalesced sparse gradient (an embedding lookup's,
duplicates included), SparseAdam and LazyAdam alternating for {repeats} rounds; medians. Both
apply the same update (tests/optim check equality to 1e-6); LazyAdam gathers and scatters the
touched rows with index_select / index_copy_ where SparseAdam builds sparse tensors and adds
them into the dense moments and table. Run: `python -m benchmarks.lazy_adam_update`."""

SHAPES = [(200_000, 64, 102_400), (1_000_000, 64, 102_400), (1_000_000, 64, 10_240)]


def sparse_grad(table: torch.nn.Parameter, rows: int, seed: int) -> torch.Tensor:
    """The uncoalesced sparse gradient of a lookup of ``rows`` random ids."""
    ids = torch.randint(table.shape[0], (rows,), generator=torch.Generator().manual_seed(seed))
    F.embedding(ids, table, sparse=True).sum().backward()
    grad, table.grad = table.grad, None
    return grad


def main() -> None:
    parser = make_parser(__doc__)
    add_threads_argument(parser)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    set_threads(args.threads)
    rows = []
    for n, d, touched in SHAPES:
        optimizers = {}
        for name, cls in (("SparseAdam", torch.optim.SparseAdam), ("LazyAdam", LazyAdam)):
            table = torch.nn.Parameter(torch.randn(n, d))
            optimizers[name] = (table, cls([table], lr=1e-3))
        grad = sparse_grad(optimizers["LazyAdam"][0], touched, seed=0)
        built = {name: (table, optimizer, grad) for name, (table, optimizer) in optimizers.items()}
        times = timed_optimizer_steps(built, args.repeats)
        base = sorted(times["SparseAdam"])[len(times["SparseAdam"]) // 2]
        for name, values in times.items():
            median = sorted(values)[len(values) // 2]
            rows.append(
                {
                    "N": n,
                    "D": d,
                    "ids_per_step": touched,
                    "optimizer": name,
                    "median_ms": round(1e3 * median, 2),
                    "speedup_vs_sparse_adam": round(base / median, 2),
                    "threads": args.threads,
                }
            )
            print(rows[-1], flush=True)
    write_results(
        "lazy_adam_update",
        rows,
        title="LazyAdam vs SparseAdam: one sparse-row optimizer step",
        notes=NOTES.format(repeats=args.repeats),
    )


if __name__ == "__main__":
    main()
