"""Codeword logits and the log-normalisers of MIDX's first two stages, in one Triton launch.

For queries split into two parts ``z1`` ``[B, D1]`` and ``z2`` ``[B, D2]`` (the two halves under
product quantisation, the whole query twice under residual quantisation), codebooks ``c1``
``[K, D1]`` and ``c2`` ``[K, D2]`` and the log cell sizes ``log|Omega|`` ``[K, K]`` (``-inf`` for
empty cells), the MIDX proposal of Eq. (6) needs

- ``s1 = z1 c1^T`` and ``s2 = z2 c2^T``, the codeword logits ``[B, K]``;
- ``log_psi[b, k1] = logsumexp_k2(log|Omega[k1, k2]| + s2[b, k2])``, the log-normaliser of
  ``P2(. | k1)`` ``[B, K]`` (``-inf`` when row ``k1`` has no class);
- ``log_z[b] = logsumexp_k1(s1[b, k1] + log_psi[b, k1])``, the log-normaliser of ``P1`` and of the
  whole proposal ``[B]``.

:func:`codeword_logits_reference` computes them with plain torch ops; :func:`codeword_logits_triton`
in one kernel launch (one program per block of queries); :func:`codeword_logits` picks the kernel on
CUDA and the reference elsewhere. Everything is accumulated in fp32 whatever the input dtype.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # Triton ships for Linux only; the reference serves everywhere else.
    triton = None


class CodewordLogits(NamedTuple):
    """The query-dependent part of the MIDX proposal, all fp32.

    Attributes:
        s1: ``[B, K]`` logits of the first codebook.
        s2: ``[B, K]`` logits of the second codebook.
        log_psi: ``[B, K]`` log-normaliser of ``P2(. | k1)`` for every ``k1``.
        log_z: ``[B]`` log-normaliser of ``P1``.
    """

    s1: Tensor
    s2: Tensor
    log_psi: Tensor
    log_z: Tensor


def codeword_logits_reference(
    z1: Tensor, z2: Tensor, c1: Tensor, c2: Tensor, log_counts: Tensor
) -> CodewordLogits:
    """Plain-torch :class:`CodewordLogits` (see the module docstring for the shapes).

    ``log_counts`` may also be per-query cell log-weights ``[B, K, K]`` (MIDX's exact mode, where
    the weight of a cell is the sum of its classes' exponentiated residual logits).
    """
    s1 = z1.float() @ c1.float().T
    s2 = z2.float() @ c2.float().T
    if log_counts.dim() == 2:
        log_psi = log_cell_normalisers(s2, log_counts)
    else:
        log_psi = torch.logsumexp(s2[:, None, :] + log_counts.float(), dim=-1)
    log_z = torch.logsumexp(s1 + log_psi, dim=-1)
    return CodewordLogits(s1, s2, log_psi, log_z)


def log_cell_normalisers(s2: Tensor, log_counts: Tensor) -> Tensor:
    """``log_psi[b, k1] = log sum_k2 |Omega[k1, k2]| exp(s2[b, k2])`` as one ``[B, K] x [K, K]``
    product, without a ``[B, K, K]`` tensor.

    ``exp(s2 - max_k2 s2)`` is taken in fp64, so a row of cells underflows to ``-inf`` only when
    its share is below ``e^-700`` of the row maximum's, where the fp32 result would be ``-inf``
    anyway.

    Args:
        s2: ``[B, K]`` second-codebook logits.
        log_counts: ``[K, K]`` log cell sizes (``-inf`` for empty cells).

    Returns:
        fp32 ``[B, K]``; ``-inf`` for rows ``k1`` without any class.
    """
    top = s2.amax(dim=1, keepdim=True).double()
    return ((codeword_weights(s2) @ log_counts.double().exp().T).log() + top).float()


def codeword_weights(s2: Tensor) -> Tensor:
    """``exp(s2 - max_k s2)`` per query, fp64 ``[B, K]``: the second stage's codeword weights,
    shared by :func:`log_cell_normalisers` and MIDX's draw so that both see the same zeros."""
    return (s2.double() - s2.amax(dim=1, keepdim=True).double()).exp()


def codeword_logits(
    z1: Tensor, z2: Tensor, c1: Tensor, c2: Tensor, log_counts: Tensor
) -> CodewordLogits:
    """:class:`CodewordLogits` through the Triton kernel on CUDA, the torch reference elsewhere."""
    if z1.is_cuda and triton is not None:
        return codeword_logits_triton(z1, z2, c1, c2, log_counts)
    return codeword_logits_reference(z1, z2, c1, c2, log_counts)


def codeword_logits_triton(
    z1: Tensor, z2: Tensor, c1: Tensor, c2: Tensor, log_counts: Tensor, *, block_b: int = 16
) -> CodewordLogits:
    """:class:`CodewordLogits` in one Triton launch (needs CUDA or ``TRITON_INTERPRET=1``).

    Args:
        z1: ``[B, D1]`` first query parts (any float dtype; the last dim must be contiguous or is
            made so).
        z2: ``[B, D2]`` second query parts.
        c1: ``[K, D1]`` first codebook.
        c2: ``[K, D2]`` second codebook.
        log_counts: ``[K, K]`` fp32 log cell sizes, ``-inf`` for empty cells.
        block_b: queries per program (at least 16, a power of two).
    """
    if triton is None:
        raise RuntimeError("codeword_logits_triton needs Triton, which is not installed")
    z1, z2, c1, c2 = (t if t.stride(-1) == 1 else t.contiguous() for t in (z1, z2, c1, c2))
    log_counts = log_counts.float().contiguous()
    num_queries, num_codewords = z1.shape[0], c1.shape[0]
    device = z1.device
    s1 = torch.empty(num_queries, num_codewords, device=device, dtype=torch.float32)
    s2 = torch.empty_like(s1)
    log_psi = torch.empty_like(s1)
    log_z = torch.empty(num_queries, device=device, dtype=torch.float32)
    if num_queries == 0:
        return CodewordLogits(s1, s2, log_psi, log_z)
    block_k = max(16, triton.next_power_of_2(num_codewords))
    block_d = max(16, min(64, triton.next_power_of_2(max(z1.shape[1], z2.shape[1]))))
    grid = (triton.cdiv(num_queries, block_b),)
    _codeword_logits_kernel[grid](
        z1, z2, c1, c2, log_counts, s1, s2, log_psi, log_z,
        num_queries, num_codewords, z1.shape[1], z2.shape[1],
        z1.stride(0), z2.stride(0), c1.stride(0), c2.stride(0), log_counts.stride(0),
        BLOCK_B=block_b, BLOCK_K=block_k, BLOCK_D=block_d,
    )  # fmt: skip
    return CodewordLogits(s1, s2, log_psi, log_z)


if triton is not None:

    @triton.jit
    def _codebook_logits(
        z_ptr, c_ptr, rows, cols, B, K, D, stride_z, stride_c,
        BLOCK_B: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
    ):  # fmt: skip
        """fp32 ``[BLOCK_B, BLOCK_K]`` tile of ``z c^T`` for query ``rows``, codewords ``cols``."""
        acc = tl.zeros((BLOCK_B, BLOCK_K), dtype=tl.float32)
        for d0 in range(0, D, BLOCK_D):
            d = d0 + tl.arange(0, BLOCK_D)
            z = tl.load(
                z_ptr + rows[:, None] * stride_z + d[None, :],
                mask=(rows[:, None] < B) & (d[None, :] < D),
                other=0.0,
            ).to(tl.float32)
            c_t = tl.load(
                c_ptr + cols[None, :] * stride_c + d[:, None],
                mask=(cols[None, :] < K) & (d[:, None] < D),
                other=0.0,
            ).to(tl.float32)
            acc += tl.dot(z, c_t, input_precision="ieee")
        return acc

    @triton.jit
    def _codeword_logits_kernel(
        z1_ptr, z2_ptr, c1_ptr, c2_ptr, lc_ptr, s1_ptr, s2_ptr, psi_ptr, lz_ptr,
        B, K, D1, D2, stride_z1, stride_z2, stride_c1, stride_c2, stride_lc,
        BLOCK_B: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
    ):  # fmt: skip
        rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
        cols = tl.arange(0, BLOCK_K)
        row_ok = rows < B
        col_ok = cols < K
        out_mask = row_ok[:, None] & col_ok[None, :]
        out_offsets = rows[:, None] * K + cols[None, :]
        s1 = _codebook_logits(
            z1_ptr, c1_ptr, rows, cols, B, K, D1, stride_z1, stride_c1, BLOCK_B, BLOCK_K, BLOCK_D
        )
        s2 = _codebook_logits(
            z2_ptr, c2_ptr, rows, cols, B, K, D2, stride_z2, stride_c2, BLOCK_B, BLOCK_K, BLOCK_D
        )
        tl.store(s1_ptr + out_offsets, s1, mask=out_mask)
        tl.store(s2_ptr + out_offsets, s2, mask=out_mask)
        s2 = tl.where(col_ok[None, :], s2, float("-inf"))
        # Online log-sum-exp over k1 of s1[:, k1] + log_psi[:, k1], one row of cells at a time.
        run_max = tl.full((BLOCK_B,), float("-inf"), dtype=tl.float32)
        run_sum = tl.zeros((BLOCK_B,), dtype=tl.float32)
        for k1 in range(0, K):
            lc = tl.load(lc_ptr + k1 * stride_lc + cols, mask=col_ok, other=float("-inf"))
            t = s2 + lc[None, :]
            t_max = tl.max(t, axis=1)
            t_max = tl.where(t_max == float("-inf"), 0.0, t_max)
            psi = tl.log(tl.sum(tl.exp(t - t_max[:, None]), axis=1)) + t_max
            tl.store(psi_ptr + rows * K + k1, psi, mask=row_ok)
            x = tl.sum(tl.where(cols[None, :] == k1, s1, 0.0), axis=1) + psi
            new_max = tl.maximum(run_max, x)
            safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
            run_sum = run_sum * tl.exp(run_max - safe_max) + tl.exp(x - safe_max)
            run_max = new_max
        safe_max = tl.where(run_max == float("-inf"), 0.0, run_max)
        tl.store(lz_ptr + rows, tl.log(run_sum) + safe_max, mask=row_ok)
