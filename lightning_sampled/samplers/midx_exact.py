"""MIDX's exact proposal (Theorem 1, Eqs. 2-5): the full softmax, decomposed over cells.

A class ``i`` in cell ``(k1, k2)`` has ``q_i = c1[k1] (+) c2[k2] + r_i``. With cell weights
``omega = sum_{j in cell} exp(z . r_j)`` (:func:`residual_terms`) in place of the cell sizes, the
first two stages draw a cell and the third draws the class from the residual softmax inside it
(Eq. 5), so that ``P1 P2 P3`` is exactly ``softmax(z . q)``. It costs ``O(N D)`` per query and
serves to verify the decomposition and for diagnostics.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..index import Cells, Quantizer
from ..kernels.codeword_logits import CodewordLogits
from .base import Sample
from .inverse_cdf import inverse_cdf_in_row


def residual_terms(
    z: Tensor,
    class_embeddings: Tensor,
    class_cells: Tensor,
    codebooks: Tensor,
    quantizer: Quantizer,
) -> tuple[Tensor, Tensor]:
    """Residual logits and the cells' log-weights ``log omega`` (Eq. 5) of queries ``z``.

    Args:
        z: ``[B, D]`` queries.
        class_embeddings: ``[N, D]`` class table of the last refresh.
        class_cells: long ``[N]`` the cell ``k1 * K + k2`` of every class, ``-1`` for classes
            left out of the index (the padding class).
        codebooks: fp32 ``[2, K, D']`` codewords.
        quantizer: the quantizer that decodes codes with ``codebooks``.

    Returns:
        ``(residual_logits, log_omega)``: fp32 ``[B, N]`` (``-inf`` for classes without a
        cell) and ``[B, K, K]`` (``-inf`` for empty cells).
    """
    k = codebooks.shape[1]
    indexed = class_cells >= 0
    codes = torch.stack([class_cells // k, class_cells % k], dim=1).clamp(min=0)
    residuals = class_embeddings.float() - quantizer.decode(codes, codebooks)
    residual_logits = (z.float() @ residuals.T).masked_fill(~indexed, -math.inf)
    cells = class_cells.clamp(min=0).expand(z.shape[0], -1)
    cell_max = torch.full((z.shape[0], k * k), -math.inf, device=z.device)
    cell_max = cell_max.scatter_reduce(1, cells, residual_logits, "amax")
    safe_max = cell_max.nan_to_num(neginf=0.0)
    shifted = (residual_logits - safe_max.gather(1, cells)).exp()
    sums = torch.zeros_like(cell_max).scatter_add(1, cells, shifted)
    log_omega = sums.log() + safe_max
    return residual_logits, log_omega.view(-1, k, k)


def draw_exact(
    logits: CodewordLogits,
    log_weights: Tensor,
    residual_logits: Tensor,
    cells: Cells,
    class_cells: Tensor,
    k1: Tensor,
    u: Tensor,
    u_cell: Tensor,
) -> Sample:
    """Draws the second codeword and the class of every draw, given its first codeword.

    Args:
        logits: the queries' :class:`CodewordLogits` (``[B, K]`` each).
        log_weights: ``[B, K, K]`` the cells' ``log omega`` (:func:`residual_terms`).
        residual_logits: ``[B, N]`` (:func:`residual_terms`).
        cells: the index's classes per cell (``K * K`` cells).
        class_cells: long ``[N]`` the cell of every class, ``-1`` for classes without one.
        k1: long ``[B, M]`` first codewords, drawn from ``P1``.
        u: ``[B, M]`` fp32 uniforms for the second codeword.
        u_cell: ``[B, M]`` fp64 uniforms for the class inside the cell.

    Returns:
        :class:`Sample` of ids ``[B, M]`` and their ``log Q`` ``[B, M]``.
    """
    k = log_weights.shape[-1]
    k2 = inverse_cdf_in_row(log_second_stage(logits.s2, log_weights).exp(), k1, u)
    ids = _residual_softmax_in_cell(
        cells, class_cells, k1 * k + k2, u_cell, residual_logits, log_weights
    )
    return Sample(ids, score_exact(logits, log_weights, residual_logits, class_cells, ids))


def _residual_softmax_in_cell(
    cells: Cells,
    class_cells: Tensor,
    cell: Tensor,
    u: Tensor,
    residual_logits: Tensor,
    log_weights: Tensor,
) -> Tensor:
    """A class drawn from ``P3(. | cell)`` (Eq. 5) for every draw: ids ``[B, M]`` from the
    cells ``cell`` ``[B, M]`` and fp64 uniforms ``u`` ``[B, M]``."""
    batch = cell.shape[0]
    num_cells = log_weights.shape[-1] ** 2  # not -1: an empty batch has no size to infer from
    members = cells.members
    member_cells = class_cells[members].expand(batch, -1)
    log_p3 = (
        residual_logits[:, members].double()
        - log_weights.reshape(batch, num_cells).gather(1, member_cells).double()
    )
    # Each non-empty cell's P3 sums to one, so the running sum reaches (cells so far) at each
    # cell's end: fp64 keeps every cell's share exact enough for 4096 cells.
    cdf = torch.cumsum(log_p3.exp(), dim=1)
    start, end = cells.offsets[cell], cells.offsets[cell + 1]
    before = torch.where(start > 0, cdf.gather(1, (start - 1).clamp(min=0)), 0.0)
    mass = cdf.gather(1, end - 1) - before
    position = torch.searchsorted(cdf, before + u * mass, right=True)
    return members[torch.minimum(torch.maximum(position, start), end - 1)]


def score_exact(
    logits: CodewordLogits,
    log_weights: Tensor,
    residual_logits: Tensor,
    class_cells: Tensor,
    ids: Tensor,
) -> Tensor:
    """``log P1(k1) + log P2(k2 | k1) + log P3(i | k1, k2)`` ``[B, M]`` of ids ``[B, M]``;
    ``-inf`` for classes without a cell (arguments as for :func:`draw_exact`)."""
    k = log_weights.shape[-1]
    batch = ids.shape[0]
    cells = class_cells[ids]
    safe = cells.clamp(min=0)
    k1 = safe // k
    log_omega = log_weights.expand(batch, k, k).reshape(batch, k * k).gather(1, safe)
    log_p1 = logits.log_p1.gather(1, k1)
    log_p2 = log_second_stage(logits.s2, log_weights).reshape(batch, k * k).gather(1, safe)
    log_p3 = residual_logits.gather(1, ids) - log_omega
    log_q = (log_p1 + log_p2 + log_p3).float()
    return log_q.masked_fill(cells < 0, -math.inf)


def log_second_stage(s2: Tensor, log_weights: Tensor) -> Tensor:
    """``log P2(k2 | k1)`` fp64 ``[B, K, K]``: each row ``k1`` a log-softmax of
    ``s2[k2] + log omega[k1, k2]`` over its cells (``-inf`` for empty cells and whole rows).

    Each row is shifted by its own largest ``s2`` before ``log omega`` is added, in fp64. With
    the query's single shift instead (that of :class:`CodewordLogits`), a row whose cells all
    sit far below the best codeword (a class row of norm 1e9 owning that codeword) adds
    ``log omega`` to ``s2 ~ -1e8``, where fp32 rounds it away: the row's ``P2`` would not sum to
    one, and ``log Q`` would not be normalised.

    Args:
        s2: ``[B, K]`` shifted second-codebook logits (``-inf`` for codewords of no class).
        log_weights: ``[B, K, K]`` the cells' ``log omega`` (``-inf`` for empty cells).
    """
    live = log_weights > -math.inf
    x = s2.double()[:, None, :].masked_fill(~live, -math.inf)
    row_max = x.amax(dim=-1, keepdim=True).nan_to_num(neginf=0.0)
    a = (x - row_max) + log_weights.double()
    row_norm = torch.logsumexp(a, dim=-1, keepdim=True)
    return a - row_norm.masked_fill(row_norm == -math.inf, 0.0)
