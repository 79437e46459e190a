"""Draws from per-query conditional tables that are never materialised whole.

MIDX's fast second stage draws ``k2 ~ P(. | k1) ∝ counts[k1, k2] * w[b, k2]`` for each of ``M``
first codewords ``k1`` of each query ``b``. A query's draws hit at most ``min(M, K)`` distinct
rows; every draw is found by a binary search of its own row of running sums. Two ways to build
the rows, ``O(B * min(M, K) * K)`` work at worst either way:

- fixed rows: each query gets its whole table ``[K, K]`` when ``M >= K``, else one row per draw
  ``[M, K]``. Every size follows from the shapes, never from the draws, so the draw makes no host
  sync (no ``nonzero``, no data-dependent chunks) and runs unchanged on CUDA streams and under
  ``torch.compile``. On a GPU a chunk is 2^25 entries (256 MB of fp64), so that a step launches a
  few kernels, not hundreds.
- distinct rows (eager CPU with ``M < K``): only the rows a query's draws use, found by a
  ``nonzero`` of a ``[B, K]`` presence table. ``P1`` is peaked, so a query uses far fewer than
  ``M`` rows (19 of 100 draws at K = 128 for a trained-like query): 2.4-2.5x faster than fixed
  rows there, and a host sync costs nothing on the CPU.

On the CPU a chunk is small (2 MB of fp64), so that the searches, whose reads are random across a
chunk's rows, hit the cache: at MIDX's shape in a GRU4Rec step (14,400 queries x 100 draws,
K = 32) chunks of 2^18 entries draw 2.3-3x faster than chunks of 2^22, and 2^16 or 2^20 are
slower again.
"""

from __future__ import annotations

import torch
from torch import Tensor

_ENTRIES_PER_CHUNK = 1 << 18  # on the CPU
_CUDA_ENTRIES_PER_CHUNK = 1 << 25


def draw_from_used_rows(counts: Tensor, weights: Tensor, rows: Tensor, u: Tensor) -> Tensor:
    """Draws a column ``j ~ counts[r, j] * weights[b, j]`` for each row ``r = rows[b, m]``.

    The rows are built as running sums in fp64 (a row whose weights are all below fp32's range
    can still have a positive probability), normalised to end at exactly 1, and each draw
    searches its own row for ``u``. Zero-weight columns have empty intervals and are never
    drawn. No host sync.

    Args:
        counts: ``[K, K]`` non-negative row weights (MIDX: cell sizes).
        weights: ``[B, K]`` non-negative fp64 column weights per query.
        rows: long ``[B, M]`` the row of each draw; every ``(b, rows[b, m])`` row must have a
            positive total.
        u: ``[B, M]`` fp32 uniforms in ``[0, 1)``.

    Returns:
        long ``[B, M]`` columns in ``[0, K)``.
    """
    batch, draws = rows.shape
    k = counts.shape[1]
    per_draw = draws < k  # one row per draw, else the query's whole table
    if per_draw and host_syncs_are_free(rows):
        return _draw_from_distinct_rows(counts, weights, rows, u)
    rows_per_query = draws if per_draw else k
    entries = _CUDA_ENTRIES_PER_CHUNK if rows.is_cuda else _ENTRIES_PER_CHUNK
    chunk = max(1, entries // (rows_per_query * k))
    counts = counts.double()
    out = torch.empty_like(rows)
    for start in range(0, batch, chunk):
        stop = min(start + chunk, batch)
        r = rows[start:stop]
        if per_draw:  # row (query, draw) of the chunk's [C, M, K] table
            table = counts.index_select(0, r.reshape(-1)).view(stop - start, draws, k)
            row_of = torch.arange(r.numel(), device=r.device).view(r.shape)
        else:  # row (query, k1) of the chunk's [C, K, K] table
            table = counts.expand(stop - start, k, k)
            row_of = torch.arange(stop - start, device=r.device)[:, None] * k + r
        table = table.mul(weights[start:stop, None, :]).cumsum_(2)
        table.div_(table[:, :, -1:].clone())  # each row ends at exactly 1.0 > u
        row_start = row_of.mul_(k)
        found = _first_above(table.view(-1), row_start, k, u[start:stop].double())
        out[start:stop] = found - row_start
    return out


def host_syncs_are_free(rows: Tensor) -> bool:
    """Eager CPU tensors: reading a count back costs nothing, so the distinct-rows draw may."""
    return not rows.is_cuda and not torch.compiler.is_compiling()


def _draw_from_distinct_rows(counts: Tensor, weights: Tensor, rows: Tensor, u: Tensor) -> Tensor:
    """:func:`draw_from_used_rows` building only the distinct ``(b, r)`` rows the draws use,
    found from a ``[B, K]`` presence table (no sort); chunks of queries by their used rows."""
    batch, _ = rows.shape
    k = counts.shape[1]
    used = torch.zeros(batch, k, dtype=torch.bool, device=rows.device)
    used.scatter_(1, rows, True)
    counts = counts.double()
    out = torch.empty_like(rows)
    start = 0
    for stop in _query_chunks(used.sum(1), k):
        pairs = used[start:stop].nonzero()  # [P, 2] (query in chunk, row), sorted
        pair_of = torch.cumsum(used[start:stop].reshape(-1), 0).sub_(1).view(stop - start, k)
        table = counts.index_select(0, pairs[:, 1])
        table.mul_(weights.index_select(0, start + pairs[:, 0])).cumsum_(1)
        table.div_(table[:, -1:].clone())  # each row ends at exactly 1.0 > u
        row_start = pair_of.gather(1, rows[start:stop]).mul_(k)
        found = _first_above(table.view(-1), row_start, k, u[start:stop].double())
        out[start:stop] = found - row_start
        start = stop
    return out


def _query_chunks(per_query: Tensor, k: int) -> list[int]:
    """Ends of consecutive query chunks whose used rows hold at most ``_ENTRIES_PER_CHUNK``
    entries each (a chunk holds at least one query)."""
    entries = torch.cumsum(per_query * k, 0)
    ends = []
    done = 0
    while done < per_query.numel():
        limit = (entries[done - 1] if done else 0) + _ENTRIES_PER_CHUNK
        stop = int(torch.searchsorted(entries, limit, right=True))
        stop = max(stop, done + 1)
        ends.append(stop)
        done = stop
    return ends


def _first_above(flat: Tensor, base: Tensor, length: int, v: Tensor) -> Tensor:
    """The first position ``p`` in ``[base, base + length)`` of sorted ``flat`` with
    ``flat[p] > v``, by a branch-free binary search of ``ceil(log2 length)`` gathers (each draw
    only reads its own row, which stays in cache across the draws of one query).

    Args:
        flat: ``[L]`` float64, sorted within each searched range, whose last entry exceeds ``v``.
        base: long ``[...]`` range starts.
        length: the range length.
        v: ``[...]`` float64 values.

    Returns:
        long ``[...]`` positions.
    """
    shape = base.shape
    base = base.reshape(-1).clone()
    v = v.reshape(-1)
    n = length
    while n > 1:
        half = n // 2
        base.add_(flat.index_select(0, base + (half - 1)) <= v, alpha=half)
        n -= half
    return base.view(shape)
