"""Exact softmax cross-entropy through the fused Triton passes of
:mod:`lightning_sampled.kernels.linear_cross_entropy`: the forward never writes a logit, the
backward one ``[T, C]`` block of logit gradients per class chunk.

Same inputs, outputs and semantics as :class:`~lightning_sampled.ops.chunked.ChunkedCrossEntropy`
(label smoothing over the classes other than ``padding_idx``, cosine scores with ``normalize``,
fp32 log-normalisers), with the matmuls of the two products that use the logit gradients
(``dz = G W`` and ``dW = G^T z``) left to cuBLAS. Each class's gradient row is complete within its
chunk (every query is summed there), so the table's gradient is written once, in the table's dtype,
without an fp32 ``[N, D]`` accumulator.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..kernels.linear_cross_entropy import lse_partials_triton, softmax_grad_triton
from .chunked import (
    class_chunks,
    compute_dtype,
    smoothed_cross_entropy,
    smoothing_share,
    unit_rows,
    unit_rows_vjp,
)

#: elements of one block of logit gradients (32 MiB in bf16)
FUSED_BLOCK_ELEMENTS = 2**24


def fused_chunk_size(chunk_size: int | None, num_rows: int, num_classes: int) -> int:
    """Classes per backward block: ``chunk_size`` if given, else as many as keep a ``[T, C]``
    block within :data:`FUSED_BLOCK_ELEMENTS`, a multiple of 128 (the kernel's tile)."""
    if chunk_size is None:
        chunk_size = max(128, (FUSED_BLOCK_ELEMENTS // max(num_rows, 1)) // 128 * 128)
    return min(chunk_size, num_classes)


def inverse_norms(weight: Tensor) -> Tensor:
    """fp32 ``[N]`` ``1 / max(||w_c||, 1e-12)``: the factors that turn ``z . w_c`` into
    ``z . unit_rows(w)_c`` (:func:`~lightning_sampled.ops.chunked.unit_rows`' ``eps``), the
    norms taken in fp32 (fp64 for an fp64 table), without a widened copy of the table."""
    wide = torch.promote_types(weight.dtype, torch.float32)
    norms = torch.linalg.vector_norm(weight.detach(), dim=1, dtype=wide)
    return norms.clamp_min(1e-12).reciprocal().float()


class FusedCrossEntropy(torch.autograd.Function):
    """Per-row exact cross-entropy ``[T]`` (fp32) of ``softmax(z W^T + b)`` by the fused kernels.

    Forward inputs: ``z`` ``[T, D]``, ``weight`` ``[N, D]``, ``bias`` ``[N]`` or ``None``,
    ``target`` long ``[T]``, ``chunk_size`` (classes per backward block, or ``None``),
    ``padding_idx``, ``normalize``, ``label_smoothing``: as in ``ChunkedCrossEntropy``.
    """

    @staticmethod
    def forward(ctx, z, weight, bias, target, chunk_size, padding_idx, normalize, label_smoothing):
        dtype = compute_dtype(z)
        scale = inverse_norms(weight) if normalize else None
        lse, target_logit, logit_sum = lse_partials_triton(
            z, weight, bias, scale, target, padding_idx, dtype, with_logit_sum=label_smoothing > 0
        )
        ctx.save_for_backward(z, weight, bias, target, lse, scale)
        ctx.chunk_size, ctx.padding_idx, ctx.dtype = chunk_size, padding_idx, dtype
        ctx.label_smoothing = label_smoothing
        return smoothed_cross_entropy(
            lse, target_logit, logit_sum, label_smoothing, weight.shape[0], padding_idx
        )

    @staticmethod
    def backward(ctx, grad_out):
        z, weight, bias, target, lse, scale = ctx.saved_tensors
        need_z, need_w, need_b = ctx.needs_input_grad[:3]
        dtype, eps, padding_idx = ctx.dtype, ctx.label_smoothing, ctx.padding_idx
        num_rows, num_classes = z.shape[0], weight.shape[0]
        smoothing = smoothing_share(eps, num_classes, padding_idx)
        z_c = z.to(dtype)
        grad_z = torch.zeros(z.shape, device=z.device, dtype=torch.float32) if need_z else None
        grad_w = torch.empty_like(weight) if need_w else None
        grad_b = torch.empty(num_classes, device=z.device, dtype=torch.float32) if need_b else None
        chunk = fused_chunk_size(ctx.chunk_size, num_rows, num_classes)
        with torch.autocast(z.device.type, enabled=False):
            for start, end in class_chunks(num_classes, chunk):
                grad_logits = softmax_grad_triton(
                    z, weight, bias, scale, target, lse, grad_out, start, end, padding_idx,
                    1.0 - eps, smoothing, dtype, dtype,
                )  # fmt: skip
                rows = weight[start:end]
                if scale is not None:  # scores of the unit rows: d/dz and d/du first
                    rows = unit_rows(rows)
                if need_z:
                    grad_z += (grad_logits @ rows.to(dtype)).float()
                if need_w:
                    grad_rows = grad_logits.T @ z_c
                    if scale is not None:
                        grad_rows = unit_rows_vjp(weight[start:end], grad_rows)
                    grad_w[start:end] = grad_rows
                if need_b:
                    grad_b[start:end] = grad_logits.sum(dim=0, dtype=torch.float32)
        return (
            None if grad_z is None else grad_z.to(z.dtype),
            grad_w,
            None if grad_b is None else grad_b.to(bias.dtype),
            None,
            None,
            None,
            None,
            None,
        )


def fused_nll(
    z: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    target: Tensor,
    chunk_size: int | None,
    padding_idx: int | None = None,
    *,
    normalize: bool = False,
    label_smoothing: float = 0.0,
) -> Tensor:
    """Exact per-row (label-smoothed) cross-entropy ``[T]`` (fp32) by :class:`FusedCrossEntropy`;
    the arguments of :func:`~lightning_sampled.ops.chunked.chunked_nll`, except that
    ``chunk_size`` may be ``None`` (:func:`fused_chunk_size`)."""
    return FusedCrossEntropy.apply(
        z, weight, bias, target, chunk_size, padding_idx, normalize, label_smoothing
    )
