"""The cells of a two-codebook inverted multi-index and a CSR layout of the classes in each.

Cell ``c = k1 * K + k2`` holds the classes coded ``(k1, k2)``. ``members`` lists the classes grouped
by cell (in increasing class id inside a cell) and ``offsets[c] : offsets[c + 1]`` is cell ``c``'s
slice of it, so a class can be drawn uniformly from a cell in ``O(1)`` without ever building a
``cells x max_cell_size`` table.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


class Cells(NamedTuple):
    """CSR layout of classes per cell.

    Attributes:
        counts: long ``[K * K]``: ``|Omega_{k1, k2}|`` at ``k1 * K + k2``.
        offsets: long ``[K * K + 1]``: cell ``c`` holds ``members[offsets[c]:offsets[c + 1]]``.
        members: long ``[n]``: the indexed classes, grouped by cell.
    """

    counts: Tensor
    offsets: Tensor
    members: Tensor


def cell_of(codes: Tensor, codebook_size: int) -> Tensor:
    """Cell ids ``k1 * K + k2`` ``[n]`` of codes ``[n, 2]``."""
    return codes[:, 0] * codebook_size + codes[:, 1]


def build_cells(class_cells: Tensor, num_cells: int) -> Cells:
    """Groups classes by cell.

    Args:
        class_cells: long ``[N]``: the cell of every class, ``-1`` for classes left out of the
            index (the padding class).
        num_cells: ``K * K``.

    Returns:
        :class:`Cells` whose ``members`` are the classes with a cell, grouped by cell.
    """
    indexed = (class_cells >= 0).nonzero().squeeze(1)
    cells = class_cells.index_select(0, indexed)
    order = torch.sort(cells, stable=True).indices
    counts = torch.bincount(cells, minlength=num_cells)
    offsets = torch.zeros(num_cells + 1, dtype=torch.long, device=class_cells.device)
    offsets[1:] = torch.cumsum(counts, dim=0)
    return Cells(counts, offsets, indexed.index_select(0, order))
