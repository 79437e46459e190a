"""Exact softmax over a class table, computed in class chunks.

Nothing here holds more than ``[T, chunk_size]`` logits: the cross-entropy is a custom autograd
function that keeps only the per-row log-normaliser from its forward pass and recomputes each
chunk's logits in backward (the approach of Cut Cross-Entropy and Liger's fused linear
cross-entropy). The log-sum-exp and all gradient accumulators are fp32 whatever the compute dtype.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import Tensor


def class_chunks(num_classes: int, chunk_size: int) -> Iterator[tuple[int, int]]:
    """Yields ``(start, end)`` bounds that cover ``[0, num_classes)`` in steps of ``chunk_size``."""
    for start in range(0, num_classes, chunk_size):
        yield start, min(start + chunk_size, num_classes)


def compute_dtype(z: Tensor) -> torch.dtype:
    """The matmul dtype: the autocast dtype when autocast is on for ``z``'s device, else fp32."""
    device_type = z.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return torch.float32 if z.dtype in (torch.float16, torch.bfloat16) else z.dtype


def chunk_logits(
    z: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    start: int,
    end: int,
    padding_idx: int | None,
    dtype: torch.dtype,
) -> Tensor:
    """fp32 logits ``[T, end - start]`` of rows ``z`` ``[T, D]`` against classes ``[start, end)``.

    The matmul runs in ``dtype``; the padding class (if inside the chunk) gets ``-inf``.
    """
    with torch.autocast(z.device.type, enabled=False):
        logits = (z.to(dtype) @ weight[start:end].to(dtype).T).float()
    if bias is not None:
        logits = logits + bias[start:end].float()
    if padding_idx is not None and start <= padding_idx < end:
        logits[:, padding_idx - start] = -math.inf
    return logits


class ChunkedCrossEntropy(torch.autograd.Function):
    """Per-row exact negative log-likelihood ``lse(z W^T + b) - (z W^T + b)_y`` in class chunks.

    Forward inputs: ``z`` ``[T, D]``, ``weight`` ``[N, D]``, ``bias`` ``[N]`` or ``None``,
    ``target`` long ``[T]``, ``chunk_size``, ``padding_idx``. Output: fp32 ``[T]``.
    """

    @staticmethod
    def forward(ctx, z, weight, bias, target, chunk_size, padding_idx):
        dtype = compute_dtype(z)
        num_rows, num_classes = z.shape[0], weight.shape[0]
        rows = torch.arange(num_rows, device=z.device)
        chunk_lse = []
        target_logit = torch.zeros(num_rows, device=z.device, dtype=torch.float32)
        with torch.no_grad():
            for start, end in class_chunks(num_classes, chunk_size):
                logits = chunk_logits(z, weight, bias, start, end, padding_idx, dtype)
                chunk_lse.append(torch.logsumexp(logits, dim=1))
                inside = (target >= start) & (target < end)
                local = (target - start).clamp(0, end - start - 1)
                target_logit = torch.where(inside, logits[rows, local], target_logit)
            lse = torch.logsumexp(torch.stack(chunk_lse, dim=1), dim=1)
        ctx.save_for_backward(z, weight, bias, target, lse)
        ctx.chunk_size, ctx.padding_idx, ctx.dtype = chunk_size, padding_idx, dtype
        return lse - target_logit

    @staticmethod
    def backward(ctx, grad_out):
        z, weight, bias, target, lse = ctx.saved_tensors
        need_z, need_w, need_b = ctx.needs_input_grad[:3]
        dtype = ctx.dtype
        grad_out = grad_out.float()
        num_rows, num_classes = z.shape[0], weight.shape[0]
        rows = torch.arange(num_rows, device=z.device)
        grad_z = torch.zeros(z.shape, device=z.device, dtype=torch.float32) if need_z else None
        grad_w = torch.zeros(weight.shape, device=z.device, dtype=torch.float32) if need_w else None
        grad_b = torch.zeros(num_classes, device=z.device, dtype=torch.float32) if need_b else None
        z_c = z.to(dtype)
        with torch.autocast(z.device.type, enabled=False):
            for start, end in class_chunks(num_classes, ctx.chunk_size):
                logits = chunk_logits(z, weight, bias, start, end, ctx.padding_idx, dtype)
                # d loss_t / d logit_tc = g_t * (softmax_tc - [c == y_t])
                grad_logits = torch.exp(logits - lse[:, None]) * grad_out[:, None]
                inside = (target >= start) & (target < end)
                grad_logits[rows[inside], target[inside] - start] -= grad_out[inside]
                if need_z:
                    grad_z += (grad_logits.to(dtype) @ weight[start:end].to(dtype)).float()
                if need_w:
                    grad_w[start:end] = (grad_logits.to(dtype).T @ z_c).float()
                if need_b:
                    grad_b[start:end] = grad_logits.sum(dim=0)
        return (
            None if grad_z is None else grad_z.to(z.dtype),
            None if grad_w is None else grad_w.to(weight.dtype),
            None if grad_b is None else grad_b.to(bias.dtype),
            None,
            None,
            None,
        )


def chunked_nll(
    z: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    target: Tensor,
    chunk_size: int,
    padding_idx: int | None = None,
) -> Tensor:
    """Exact per-row NLL ``[T]`` (fp32) of ``target`` ``[T]`` under ``softmax(z W^T + b)``."""
    return ChunkedCrossEntropy.apply(z, weight, bias, target, chunk_size, padding_idx)


@torch.no_grad()
def chunked_topk(
    z: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    k: int,
    chunk_size: int,
    padding_idx: int | None = None,
    exclude: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Exact top-``k`` classes of each row of ``z`` ``[T, D]`` by a running merge over chunks.

    Args:
        exclude: optional long ``[T, E]`` class ids to skip per row; negative entries are padding.

    Returns:
        ``(values, indices)``, fp32 ``[T, k]`` and long ``[T, k]``, in decreasing score order.
    """
    dtype = compute_dtype(z)
    num_rows, num_classes = z.shape[0], weight.shape[0]
    best_v = torch.full((num_rows, 0), -math.inf, device=z.device)
    best_i = torch.zeros((num_rows, 0), dtype=torch.long, device=z.device)
    for start, end in class_chunks(num_classes, chunk_size):
        logits = chunk_logits(z, weight, bias, start, end, padding_idx, dtype)
        if exclude is not None:
            hit = (exclude >= start) & (exclude < end)
            row_idx = torch.arange(num_rows, device=z.device)[:, None].expand_as(exclude)
            logits[row_idx[hit], exclude[hit] - start] = -math.inf
        ids = torch.arange(start, end, device=z.device).expand(num_rows, -1)
        merged_v = torch.cat([best_v, logits], dim=1)
        merged_i = torch.cat([best_i, ids], dim=1)
        best_v, pos = merged_v.topk(min(k, merged_v.shape[1]), dim=1)
        best_i = merged_i.gather(1, pos)
    return best_v, best_i
