"""Codeword logits and the log-normalisers of MIDX's first two stages.

For queries split into two parts ``z1`` ``[B, D1]`` and ``z2`` ``[B, D2]`` (the two halves under
product quantisation, the whole query twice under residual quantisation), codebooks ``c1``
``[K, D1]`` and ``c2`` ``[K, D2]`` and the log cell sizes ``log|Omega|`` ``[K, K]`` (``-inf`` for
empty cells), the MIDX proposal of Eq. (6) needs

- ``s1 = z1 c1^T`` and ``s2 = z2 c2^T``, the codeword logits ``[B, K]``;
- ``log_psi[b, k1] = logsumexp_k2(log|Omega[k1, k2]| + s2[b, k2])``, the log-normaliser of
  ``P2(. | k1)`` ``[B, K]`` (``-inf`` when row ``k1`` has no class);
- ``log_p1[b, k1] = log_softmax_k1(s1[b, k1] + log_psi[b, k1])``, the first stage ``[B, K]``.

The proposal depends on each codebook's logits only up to a per-query constant, so both are
returned *shifted*: a codeword without any class (an empty row of cells for ``c1``, an empty
column for ``c2``) gets ``-inf``, and the others are shifted so that their maximum is ``0``. This
keeps every quantity the sampler combines small where it matters: with logits of ``1e30`` (a
finite but huge query) ``s1 + s2 - log Z`` would lose every digit below ``1e23`` in fp32, and a
dead codeword's logit would set the scale for the live ones. Logits beyond ``+-2^126`` (overflow
of ``z . c`` in fp32) are clamped first, so that no difference is ``inf - inf``. A row of cells
whose weight ``psi`` falls below ``e^-700`` of the best live second codeword's is treated as
empty (``log_psi = -inf``, ``P1 = 0``): beyond that MIDX's fp64 draw of the second codeword
(:func:`codeword_weights`) would see only zeros in that row.

:func:`codeword_logits_reference` computes them with plain torch ops; :func:`codeword_logits_triton`
computes ``s1``, ``s2`` and ``log_psi`` in one kernel launch (one program per block of queries);
:func:`codeword_logits` picks one of them by its ``backend`` (one of :data:`BACKENDS`):
``"auto"``, the kernel for CUDA tensors when Triton is installed (and the cell weights are one
``[K, K]`` table), the reference otherwise; ``"torch"``, always the reference; ``"triton"``,
always the kernel. Everything is accumulated in fp32 whatever the input dtype.

Triton has no CPU backend: on CPU tensors the kernel runs under Triton's interpreter
(:func:`~lightning_sampled.kernels._triton.triton_interpreted` says why one process runs one mode).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ._triton import check_kernel_runs_on, tl, triton, triton_interpreted

LOGIT_BOUND = 2.0**126  # |logit| clamp: differences of two clamped logits stay finite in fp32
MIN_LOG_ROW_WEIGHT = -700.0  # rows of cells below e^-700 of the best live codeword get P1 = 0
BACKENDS = ("auto", "torch", "triton")  # the implementations codeword_logits can pick


class CodewordLogits(NamedTuple):
    """The query-dependent part of the MIDX proposal, all fp32 (see the module docstring).

    Attributes:
        s1: ``[B, K]`` shifted logits of the first codebook (``-inf`` for codewords of no class).
        s2: ``[B, K]`` shifted logits of the second codebook (``-inf`` for codewords of no class).
        log_psi: ``[B, K]`` log-normaliser of ``P2(. | k1)`` for every ``k1``, in the units of
            ``s2``.
        log_p1: ``[B, K]`` log-probability of the first codeword, ``P1``.
    """

    s1: Tensor
    s2: Tensor
    log_psi: Tensor
    log_p1: Tensor


def live_codewords(log_counts: Tensor) -> tuple[Tensor, Tensor]:
    """Which codewords hold a class: bool ``([..., K], [..., K])`` for the first codebook (rows
    of ``log_counts`` ``[..., K, K]`` with a finite entry) and the second (columns)."""
    nonempty = log_counts > -torch.inf
    return nonempty.any(dim=-1), nonempty.any(dim=-2)


def shifted_logits(z: Tensor, codebook: Tensor, live: Tensor) -> Tensor:
    """``z codebook^T`` in fp32 ``[B, K]``, clamped to ``+-2^126``, ``-inf`` where ``live``
    (``[K]`` or ``[B, K]``) is false, shifted so that each row's maximum is ``0``."""
    s = (z.float() @ codebook.float().T).clamp(-LOGIT_BOUND, LOGIT_BOUND)
    s = s.masked_fill(~live, -torch.inf)
    return s - s.amax(dim=1, keepdim=True)


def codeword_logits_reference(
    z1: Tensor, z2: Tensor, c1: Tensor, c2: Tensor, log_counts: Tensor
) -> CodewordLogits:
    """Plain-torch :class:`CodewordLogits` (see the module docstring for the shapes).

    ``log_counts`` may also be per-query cell log-weights ``[B, K, K]`` (MIDX's exact mode, where
    the weight of a cell is the sum of its classes' exponentiated residual logits); those rows
    are normalised by an exact log-sum-exp, without the ``e^-700`` cut.
    """
    live1, live2 = live_codewords(log_counts)
    s1 = shifted_logits(z1, c1, live1)
    s2 = shifted_logits(z2, c2, live2)
    if log_counts.dim() == 2:
        log_psi = log_cell_normalisers(s2, log_counts)
    else:
        log_psi = torch.logsumexp(s2[:, None, :] + log_counts.float(), dim=-1)
    return with_first_stage(s1, s2, log_psi)


def with_first_stage(s1: Tensor, s2: Tensor, log_psi: Tensor) -> CodewordLogits:
    """:class:`CodewordLogits` with ``log_p1 = log_softmax(s1 + log_psi)`` ``[B, K]``."""
    return CodewordLogits(s1, s2, log_psi, torch.log_softmax(s1 + log_psi, dim=-1))


def log_cell_normalisers(s2: Tensor, log_counts: Tensor) -> Tensor:
    """``log_psi[b, k1] = log sum_k2 |Omega[k1, k2]| exp(s2[b, k2])`` as one ``[B, K] x [K, K]``
    product, without a ``[B, K, K]`` tensor.

    ``exp(s2)`` is taken in fp64 (``s2`` is shifted: its maximum is ``0``); rows below
    ``e^-700`` get ``-inf``, as in the kernel.

    Args:
        s2: ``[B, K]`` shifted second-codebook logits.
        log_counts: ``[K, K]`` log cell sizes (``-inf`` for empty cells).

    Returns:
        fp32 ``[B, K]``; ``-inf`` for rows ``k1`` without any class.
    """
    log_psi = (codeword_weights(s2) @ log_counts.double().exp().T).log().float()
    return log_psi.masked_fill(log_psi < MIN_LOG_ROW_WEIGHT, -torch.inf)


def codeword_weights(s2: Tensor) -> Tensor:
    """``exp(s2)`` per query, fp64 ``[B, K]``, for shifted logits ``s2``: the second stage's
    codeword weights, shared by :func:`log_cell_normalisers` and MIDX's draw so that both see
    the same zeros."""
    return s2.double().exp()


def check_backend(backend: str) -> str:
    """``backend`` if it is one of :data:`BACKENDS`, else ``ValueError`` naming it."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
    return backend


def codeword_logits(
    z1: Tensor, z2: Tensor, c1: Tensor, c2: Tensor, log_counts: Tensor, *, backend: str = "auto"
) -> CodewordLogits:
    """:class:`CodewordLogits` through the implementation ``backend`` names.

    Args:
        z1: ``[B, D1]`` first query parts.
        z2: ``[B, D2]`` second query parts.
        c1: ``[K, D1]`` first codebook.
        c2: ``[K, D2]`` second codebook.
        log_counts: ``[K, K]`` log cell sizes (``-inf`` for empty cells), or per-query cell
            log-weights ``[B, K, K]`` (see :func:`codeword_logits_reference`).
        backend: one of :data:`BACKENDS`. ``"auto"``: the Triton kernel when Triton is installed,
            the tensors are on CUDA and ``log_counts`` is one ``[K, K]`` table; the torch
            reference otherwise (CPU tensors, no Triton, per-query weights ``[B, K, K]``).
            ``"torch"``: always the reference. ``"triton"``: always the kernel (its errors
            included: see :func:`codeword_logits_triton`).

    Raises:
        ValueError: ``backend`` is not one of :data:`BACKENDS`.
    """
    if check_backend(backend) == "triton" or (
        backend == "auto" and z1.is_cuda and triton is not None and log_counts.dim() == 2
    ):
        return codeword_logits_triton(z1, z2, c1, c2, log_counts)
    return codeword_logits_reference(z1, z2, c1, c2, log_counts)


def codeword_logits_triton(
    z1: Tensor, z2: Tensor, c1: Tensor, c2: Tensor, log_counts: Tensor, *, block_b: int = 16
) -> CodewordLogits:
    """:class:`CodewordLogits` (GPU tensors, or any under ``TRITON_INTERPRET=1``:
    :func:`triton_interpreted`): ``s1``, ``s2`` and ``log_psi`` in one Triton launch, then
    ``log_p1``, a ``[B, K]`` log-softmax.

    Args:
        z1: ``[B, D1]`` first query parts (any float dtype; the last dim must be contiguous or is
            made so).
        z2: ``[B, D2]`` second query parts.
        c1: ``[K, D1]`` first codebook.
        c2: ``[K, D2]`` second codebook.
        log_counts: ``[K, K]`` fp32 log cell sizes, ``-inf`` for empty cells.
        block_b: queries per program (at least 16, a power of two).

    Raises:
        RuntimeError: without Triton, or for CPU tensors with the interpreter off.
        ValueError: ``log_counts`` is not one ``[K, K]`` table (the kernel has no per-query
            cell weights).
    """
    if log_counts.dim() != 2:
        raise ValueError(
            "codeword_logits_triton takes log_counts of shape [K, K] (one table for every "
            f"query), got {tuple(log_counts.shape)}; per-query weights take the torch reference"
        )
    check_kernel_runs_on(
        "codeword_logits_triton",
        z1,
        installed=triton is not None,
        interpreted=triton_interpreted(),
        reference="codeword_logits_reference",
    )
    z1, z2, c1, c2 = (t if t.stride(-1) == 1 else t.contiguous() for t in (z1, z2, c1, c2))
    log_counts = log_counts.float().contiguous()
    live1, live2 = (live.to(torch.int8) for live in live_codewords(log_counts))
    num_queries, num_codewords = z1.shape[0], c1.shape[0]
    device = z1.device
    s1 = torch.empty(num_queries, num_codewords, device=device, dtype=torch.float32)
    s2 = torch.empty_like(s1)
    log_psi = torch.empty_like(s1)
    if num_queries > 0:
        block_k = max(16, triton.next_power_of_2(num_codewords))
        block_d = max(16, min(64, triton.next_power_of_2(max(z1.shape[1], z2.shape[1]))))
        grid = (triton.cdiv(num_queries, block_b),)
        _codeword_logits_kernel[grid](
            z1, z2, c1, c2, log_counts, live1, live2, s1, s2, log_psi,
            num_queries, num_codewords, z1.shape[1], z2.shape[1],
            z1.stride(0), z2.stride(0), c1.stride(0), c2.stride(0), log_counts.stride(0),
            LOGIT_BOUND, MIN_LOG_ROW_WEIGHT,
            BLOCK_B=block_b, BLOCK_K=block_k, BLOCK_D=block_d,
        )  # fmt: skip
    return with_first_stage(s1, s2, log_psi)


if triton is not None:

    @triton.jit
    def _codebook_logits(
        z_ptr, c_ptr, live_ptr, rows, cols, B, K, D, stride_z, stride_c, bound,
        BLOCK_B: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
    ):  # fmt: skip
        """fp32 ``[BLOCK_B, BLOCK_K]`` tile of shifted ``z c^T`` for query ``rows``, codewords
        ``cols`` (clamped, ``-inf`` for dead codewords, row maximum ``0``)."""
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
        live = tl.load(live_ptr + cols, mask=cols < K, other=0) != 0
        acc = tl.minimum(tl.maximum(acc, -bound), bound)
        acc = tl.where(live[None, :], acc, float("-inf"))
        return acc - tl.max(acc, axis=1)[:, None]

    @triton.jit
    def _codeword_logits_kernel(
        z1_ptr, z2_ptr, c1_ptr, c2_ptr, lc_ptr, live1_ptr, live2_ptr, s1_ptr, s2_ptr, psi_ptr,
        B, K, D1, D2, stride_z1, stride_z2, stride_c1, stride_c2, stride_lc,
        bound, min_log_row_weight,
        BLOCK_B: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
    ):  # fmt: skip
        rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
        cols = tl.arange(0, BLOCK_K)
        row_ok = rows < B
        col_ok = cols < K
        out_mask = row_ok[:, None] & col_ok[None, :]
        out_offsets = rows[:, None] * K + cols[None, :]
        s1 = _codebook_logits(
            z1_ptr, c1_ptr, live1_ptr, rows, cols, B, K, D1, stride_z1, stride_c1, bound,
            BLOCK_B, BLOCK_K, BLOCK_D,
        )  # fmt: skip
        s2 = _codebook_logits(
            z2_ptr, c2_ptr, live2_ptr, rows, cols, B, K, D2, stride_z2, stride_c2, bound,
            BLOCK_B, BLOCK_K, BLOCK_D,
        )  # fmt: skip
        tl.store(s1_ptr + out_offsets, s1, mask=out_mask)
        tl.store(s2_ptr + out_offsets, s2, mask=out_mask)
        # log_psi, one row of cells at a time: a log-sum-exp over k2 of s2 + log|Omega[k1, :]|.
        for k1 in range(0, K):
            lc = tl.load(lc_ptr + k1 * stride_lc + cols, mask=col_ok, other=float("-inf"))
            t = s2 + lc[None, :]
            t_max = tl.max(t, axis=1)
            t_max = tl.where(t_max == float("-inf"), 0.0, t_max)
            psi = tl.log(tl.sum(tl.exp(t - t_max[:, None]), axis=1)) + t_max
            psi = tl.where(psi < min_log_row_weight, float("-inf"), psi)
            tl.store(psi_ptr + rows * K + k1, psi, mask=row_ok)
