"""MIDX's fast proposal (Theorem 2, Eq. 6): uniform inside a cell.

Given the first codewords ``k1`` drawn from ``P1``, a draw takes ``k2 ~ P2(. | k1)`` with cell
weights ``|Omega_{k1,k2}|`` (building only the rows of ``P2`` that the draws use:
:mod:`~lightning_sampled.samplers.conditional_draw`), then a class uniformly from the cell. The
proposal is ``Q(i | z) = exp(o_i - r~_i) / sum_j exp(o_j - r~_j)`` with ``r~_i = z . r_i``, and
its ``log Q`` needs only the codeword logits (:func:`score_fast`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..index import Cells
from ..kernels.codeword_logits import CodewordLogits, codeword_weights
from .base import Sample, lookup
from .conditional_draw import draw_from_used_rows


def log_cell_sizes(counts: Tensor, codebook_size: int) -> Tensor:
    """``log |Omega|`` ``[K, K]`` fp32 from the cell sizes ``counts`` ``[K * K]``, ``-inf`` for
    empty cells: the fast proposal's cell log-weights, the same for every query."""
    return counts.view(codebook_size, codebook_size).float().log()


def draw_fast(
    logits: CodewordLogits, cells: Cells, k1: Tensor, u: Tensor, u_cell: Tensor
) -> Sample:
    """Draws the second codeword and the class of every draw, given its first codeword.

    Args:
        logits: the queries' :class:`CodewordLogits` (``[B, K]`` each).
        cells: the index's classes per cell (``K * K`` cells).
        k1: long ``[B, M]`` first codewords, drawn from ``P1``.
        u: ``[B, M]`` fp32 uniforms for the second codeword.
        u_cell: ``[B, M]`` fp64 uniforms for the class inside the cell.

    Returns:
        :class:`Sample` of ids ``[B, M]`` and their ``log Q`` ``[B, M]``.
    """
    k = logits.s2.shape[1]
    # P2(k2 | k1) ∝ |Omega[k1, k2]| exp(s2[k2]): the fp64 weights of log_psi, so a row whose
    # weights all underflow has P1 = 0 and is never drawn
    weights = codeword_weights(logits.s2)
    k2 = draw_from_used_rows(cells.counts.view(k, k), weights, k1, u)
    ids = _uniform_in_cell(cells, k1 * k + k2, u_cell)
    return Sample(ids, _fast_log_q(logits, k1, k2))


def _uniform_in_cell(cells: Cells, cell: Tensor, u: Tensor) -> Tensor:
    """A class drawn uniformly from each ``cell`` ``[B, M]`` with uniforms ``u`` (fp64)."""
    start = lookup(cells.offsets, cell)
    count = lookup(cells.counts, cell)
    offset = torch.minimum((u * count).long(), count - 1)
    return lookup(cells.members, start + offset)


def score_fast(logits: CodewordLogits, class_cells: Tensor, ids: Tensor) -> Tensor:
    """``log Q`` ``[B, M]`` of ids ``[B, M]``; ``-inf`` for classes without a cell.

    Args:
        logits: the queries' :class:`CodewordLogits` (``[B, K]`` each).
        class_cells: long ``[N]`` the cell ``k1 * K + k2`` of every class, ``-1`` for classes
            left out of the index (the padding class).
        ids: long ``[B, M]`` class ids.
    """
    k = logits.s2.shape[1]
    cells = class_cells[ids]
    k1, k2 = cells.clamp(min=0) // k, cells.clamp(min=0) % k
    return _fast_log_q(logits, k1, k2).masked_fill(cells < 0, -math.inf)


def _fast_log_q(logits: CodewordLogits, k1: Tensor, k2: Tensor) -> Tensor:
    """``log Q`` ``[B, M]`` of a class in cell ``(k1, k2)`` (each long ``[B, M]``):
    ``log P1(k1) + log P2(k2 | k1) - log|Omega[k1, k2]| = log_p1[k1] + s2[k2] - log_psi[k1]``, in
    the shifted units of :class:`CodewordLogits` (no term of the size of the raw logits, which
    would leave ``log Q`` unnormalised in fp32 for huge queries), ``-inf`` in rows ``k1`` of
    probability ``0``."""
    log_psi = logits.log_psi.gather(1, k1)
    log_q = logits.log_p1.gather(1, k1) + logits.s2.gather(1, k2) - log_psi
    return log_q.masked_fill(log_psi == -math.inf, -math.inf)
