"""A head's new class table, and the deferred table of a sharded head.

Every new table is ``U(-1 / sqrt(D), 1 / sqrt(D))``, or ``N(0, s^2)`` with the head's
``init_std=s``. An unsharded head draws it at once from
torch's global generator. A sharded head (``sharded=True``) does not hold it before it knows its
rows: it gets a table on the ``meta`` device (no memory) and a seed, one draw from torch's global
generator, and :meth:`~lightning_sampled.heads.OutputHead.shard` creates the rows when the process
group is up: on each rank only its own ``[N_r, D]`` rows, in one process the whole table. So a
head built in a LightningModule's ``__init__``, before Lightning starts the process group, never
holds the whole ``[N, D]`` table on any rank (``W`` copies of it at once on a node, ``O(W N D)``
host memory, would not fit at ``N = 1e8``).

The rows come from :func:`seeded_rows`: the table is drawn block of classes by block of classes,
each block from a generator seeded by ``(seed, block)``, and a rank keeps the rows of its classes.
The table is thus the same at any world size (a run of 1 process and one of 2, seeded alike, start
from the same model), and creating a rank's rows takes ``O(N D)`` time but only ``O(B D)`` memory
beyond them (``B`` classes per block).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .._random import mixed_seed

#: classes per block of :func:`seeded_rows`: the peak memory beyond a rank's rows, ``B D`` floats
BLOCK_ROWS = 65_536


def fill_new_rows(
    rows: Tensor, init_std: float | None, generator: torch.Generator | None = None
) -> Tensor:
    """Fills new table rows ``[K, D]`` in place and returns them: ``U(-1 / sqrt(D),
    1 / sqrt(D))``, or ``N(0, init_std^2)``; from ``generator`` (``None``: torch's global one)."""
    if init_std is None:
        bound = 1.0 / math.sqrt(rows.shape[-1])
        return rows.uniform_(-bound, bound, generator=generator)
    return rows.normal_(0.0, init_std, generator=generator)


def new_table(num_classes: int, dim: int, sharded: bool, init_std: float | None) -> nn.Parameter:
    """A new class table ``[N, D]`` (:func:`fill_new_rows`): drawn now from torch's global
    generator, or, ``sharded``, deferred on the ``meta`` device until :func:`seeded_rows`
    creates its rows."""
    if sharded:
        return nn.Parameter(torch.empty(num_classes, dim, device="meta"))
    return nn.Parameter(fill_new_rows(torch.empty(num_classes, dim), init_std))


def new_table_seed() -> int:
    """The seed of a deferred table: one draw from torch's global CPU generator (the same on
    every rank of a run seeded alike, as ``seed_everything`` seeds them)."""
    return int(torch.randint(2**62, ()).item())


def seeded_rows(
    seed: int, num_classes: int, dim: int, ids: Tensor, init_std: float | None = None
) -> Tensor:
    """Rows ``[K, D]`` (fp32, on torch's default device) of the table that ``seed`` and
    ``init_std`` (:func:`fill_new_rows`) define, for the class ids ``ids`` (long ``[K]``,
    ascending, in ``[0, N)``): the same rows whichever other ids a call asks for.

    Block ``b`` (classes ``[b B, (b + 1) B)``, :data:`BLOCK_ROWS`) is drawn whole from a CPU
    generator seeded by ``(seed, b)``, and the rows of ``ids`` in it are copied out.
    """
    ids = ids.cpu()
    ascending = bool((ids[1:] > ids[:-1]).all())
    if ids.numel() and not (ascending and 0 <= int(ids[0]) and int(ids[-1]) < num_classes):
        raise ValueError(f"ids must be ascending class ids in [0, {num_classes})")
    rows = torch.empty(ids.numel(), dim)
    block = torch.empty(BLOCK_ROWS, dim)
    starts = torch.arange(0, num_classes, BLOCK_ROWS)
    bounds = torch.searchsorted(ids, torch.cat([starts, torch.tensor([num_classes])]))
    for index, start in enumerate(starts.tolist()):
        first, last = int(bounds[index]), int(bounds[index + 1])
        if first == last:
            continue
        size = min(BLOCK_ROWS, num_classes - start)
        generator = torch.Generator().manual_seed(mixed_seed(seed, index))
        fill_new_rows(block[:size], init_std, generator)
        rows[first:last] = block[ids[first:last] - start]
    return rows.to(torch.empty(0).device)
