"""The two passes of an exact softmax cross-entropy over a linear layer, fused with its matmul.

For queries ``z`` ``[T, D]`` and class vectors ``w`` ``[N, D]`` the logits are
``o[t, c] = s_c (z_t . w_c) + b_c`` (``s_c`` an optional per-class scale, e.g. ``1 / ||w_c||`` for
cosine scores; ``b`` an optional bias), with ``o[:, padding_idx] = -inf``. The loss of an exact
(label-smoothed) cross-entropy needs three numbers per query, and its gradient one block of
``d loss / d o`` at a time:

- :func:`lse_partials_triton`: ``lse_t = log sum_c exp(o[t, c])`` and, for label smoothing,
  ``sum_{c != padding_idx} o[t, c]``, fp32 ``[T]`` each, in one launch that never writes a logit:
  each program owns a block of queries and a range of classes, keeps a running max and sum of
  exponentials (an online log-sum-exp) and the torch side merges the ranges' partials; the
  target's logit ``o[t, y_t]`` is one row product per query (:func:`target_logits`).
- :func:`softmax_grad_triton`: for classes ``[start, end)``,
  ``G[t, c] = g_t (exp(o[t, c] - lse_t) - h [c == y_t] - e [c != padding_idx])``, the gradient of
  ``sum_t g_t loss_t`` with respect to the logits (``h = 1 - eps``, ``e = eps / N'``), written in
  the dtype of the matmuls that consume it; one ``[T, end - start]`` block per launch.

The matmuls run in ``dot_dtype`` (bf16, fp16 or fp32; not fp64, which Triton's ``tl.dot`` does not
compile for Hopper; the inputs are cast while they are loaded, so an fp32 table under bf16
autocast is never copied) and accumulate in fp32; fp32 products use IEEE fp32, like torch's
default (no TF32). Every output is fp32.
:func:`lse_partials_reference` and
:func:`softmax_grad_reference` compute the same with plain torch ops (the ``[T, N]`` logits in
memory), for tests and for devices without Triton.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ._triton import check_kernel_runs_on, tl, triton, triton_interpreted

#: dtypes the kernels' matmuls run in
DOT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def logits_reference(
    z: Tensor, weight: Tensor, bias: Tensor | None, scale: Tensor | None, padding_idx: int | None,
    dot_dtype: torch.dtype,
) -> Tensor:  # fmt: skip
    """fp32 logits ``[T, N]`` as the kernels define them (module docstring): the operands
    rounded to ``dot_dtype``, their products summed in fp32 (as tensor cores do)."""
    with torch.autocast(z.device.type, enabled=False):
        logits = z.to(dot_dtype).float() @ weight.to(dot_dtype).float().T
    if scale is not None:
        logits = logits * scale.float()
    if bias is not None:
        logits = logits + bias.float()
    if padding_idx is not None:
        logits[:, padding_idx] = -math.inf
    return logits


def lse_partials_reference(
    z: Tensor, weight: Tensor, bias: Tensor | None, scale: Tensor | None, target: Tensor,
    padding_idx: int | None, dot_dtype: torch.dtype,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """``(lse, target_logit, logit_sum)``, fp32 ``[T]`` each (module docstring), from the whole
    ``[T, N]`` logits."""
    logits = logits_reference(z, weight, bias, scale, padding_idx, dot_dtype)
    target_logit = logits.gather(1, target[:, None])[:, 0]
    scored = logits if padding_idx is None else logits.index_fill(1, _ids(padding_idx, z), 0.0)
    return torch.logsumexp(logits, dim=1), target_logit, scored.sum(dim=1)


def softmax_grad_reference(
    z: Tensor, weight: Tensor, bias: Tensor | None, scale: Tensor | None, target: Tensor,
    lse: Tensor, row_grad: Tensor, start: int, end: int, padding_idx: int | None, hit: float,
    smoothing: float, out_dtype: torch.dtype, dot_dtype: torch.dtype,
) -> Tensor:  # fmt: skip
    """``G`` ``[T, end - start]`` in ``out_dtype`` (module docstring) for classes
    ``[start, end)``, from the whole ``[T, N]`` logits."""
    logits = logits_reference(z, weight, bias, scale, padding_idx, dot_dtype)[:, start:end]
    probs = (logits - torch.where(torch.isfinite(lse), lse, 0.0)[:, None]).exp()
    classes = torch.arange(start, end, device=z.device)
    grad = probs - hit * (classes[None, :] == target[:, None]).float()
    if smoothing:
        grad = grad - smoothing * (classes != (-1 if padding_idx is None else padding_idx)).float()
    return (grad * row_grad.float()[:, None]).to(out_dtype)


def _ids(index: int, like: Tensor) -> Tensor:
    return torch.tensor([index], device=like.device)


def lse_partials_triton(
    z: Tensor, weight: Tensor, bias: Tensor | None, scale: Tensor | None, target: Tensor,
    padding_idx: int | None, dot_dtype: torch.dtype, *, num_splits: int | None = None,
    with_logit_sum: bool = True,
) -> tuple[Tensor, Tensor, Tensor | None]:  # fmt: skip
    """:func:`lse_partials_reference` in one Triton launch that never writes a logit (the target
    logits, one row each, by :func:`target_logits`).

    Args:
        z: ``[T, D]`` queries (any float dtype; rows must have a unit stride or are made so).
        weight: ``[N, D]`` class vectors (likewise).
        bias: ``[N]`` or ``None``.
        scale: fp32 ``[N]`` per-class factors of ``z . w_c``, or ``None``.
        target: long ``[T]`` class ids in ``[0, N)``.
        padding_idx: a class whose logit is ``-inf``, or ``None``.
        dot_dtype: one of :data:`DOT_DTYPES`.
        num_splits: class ranges per block of queries, merged afterwards (default: enough
            programs to fill the device, :func:`default_splits`).
        with_logit_sum: whether to sum the logits too (label smoothing needs them; the sum
            costs one more reduction per tile).

    Returns:
        ``(lse, target_logit, logit_sum)``, fp32 ``[T]`` each; ``logit_sum`` is ``None``
        without ``with_logit_sum``.

    Raises:
        RuntimeError: without Triton, or for CPU tensors with the interpreter off.
    """
    _check_runs(z, dot_dtype, "lse_partials_triton", "lse_partials_reference")
    z, weight = _unit_stride(z), _unit_stride(weight)
    num_rows, num_classes = z.shape[0], weight.shape[0]
    cfg = block_config(z, dot_dtype)
    blocks_t = triton.cdiv(num_rows, cfg["BLOCK_T"])
    blocks_n = triton.cdiv(num_classes, cfg["BLOCK_N"])
    splits = min(blocks_n, num_splits or default_splits(z.device, blocks_t, blocks_n))
    classes_per_split = triton.cdiv(blocks_n, splits) * cfg["BLOCK_N"]
    splits = triton.cdiv(num_classes, classes_per_split)
    f32 = dict(device=z.device, dtype=torch.float32)
    row_max = torch.empty(splits, num_rows, **f32)
    exp_sum, logit_sum = torch.empty_like(row_max), torch.empty_like(row_max)
    if num_rows:
        _lse_partials_kernel[(blocks_t, splits)](
            z, weight, _or(bias, z), _or(scale, z), row_max, exp_sum, logit_sum,
            num_rows, num_classes, z.shape[1], z.stride(0), weight.stride(0),
            classes_per_split, -1 if padding_idx is None else padding_idx,
            HAS_BIAS=bias is not None, HAS_SCALE=scale is not None, WITH_SUM=with_logit_sum,
            **_dot_settings(dot_dtype), **cfg,
        )  # fmt: skip
    lse = torch.logsumexp(row_max + exp_sum.log(), dim=0)
    target_logit = target_logits(z, weight, bias, scale, target, padding_idx, dot_dtype)
    return lse, target_logit, logit_sum.sum(dim=0) if with_logit_sum else None


def target_logits(
    z: Tensor, weight: Tensor, bias: Tensor | None, scale: Tensor | None, target: Tensor,
    padding_idx: int | None, dot_dtype: torch.dtype,
) -> Tensor:  # fmt: skip
    """fp32 ``[T]`` logits ``o[t, y_t]`` (module docstring), one row product per query: the
    operands rounded to ``dot_dtype``, the products summed in fp32."""
    rows = weight[target].to(dot_dtype).float()
    with torch.autocast(z.device.type, enabled=False):
        logit = (z.to(dot_dtype).float() * rows).sum(dim=1)
    if scale is not None:
        logit = logit * scale[target].float()
    if bias is not None:
        logit = logit + bias[target].float()
    if padding_idx is not None:
        logit = logit.masked_fill(target == padding_idx, -math.inf)
    return logit


def softmax_grad_triton(
    z: Tensor, weight: Tensor, bias: Tensor | None, scale: Tensor | None, target: Tensor,
    lse: Tensor, row_grad: Tensor, start: int, end: int, padding_idx: int | None, hit: float,
    smoothing: float, out_dtype: torch.dtype, dot_dtype: torch.dtype,
) -> Tensor:  # fmt: skip
    """:func:`softmax_grad_reference` for classes ``[start, end)`` in one Triton launch (one
    program per ``BLOCK_T x BLOCK_N`` tile).

    Args:
        lse: fp32 ``[T]`` log-normalisers from :func:`lse_partials_triton`.
        row_grad: ``[T]`` the gradient of the objective with respect to each row's loss.
        hit: the weight of the target's one-hot term (``1 - label_smoothing``).
        smoothing: the uniform term per class (``label_smoothing / N'``).
        out_dtype: dtype of the returned block.
        Others: as in :func:`lse_partials_triton`.

    Returns:
        ``[T, end - start]`` in ``out_dtype``.
    """
    _check_runs(z, dot_dtype, "softmax_grad_triton", "softmax_grad_reference")
    z, weight = _unit_stride(z), _unit_stride(weight)
    num_rows, width = z.shape[0], end - start
    out = torch.empty(num_rows, width, device=z.device, dtype=out_dtype)
    cfg = block_config(z, dot_dtype)
    if num_rows and width:
        grid = (triton.cdiv(num_rows, cfg["BLOCK_T"]), triton.cdiv(width, cfg["BLOCK_N"]))
        _softmax_grad_kernel[grid](
            z, weight, _or(bias, z), _or(scale, z), target, lse.float().contiguous(),
            row_grad.float().contiguous(), out, num_rows, start, end, z.shape[1], z.stride(0),
            weight.stride(0), -1 if padding_idx is None else padding_idx, float(hit),
            float(smoothing), HAS_BIAS=bias is not None, HAS_SCALE=scale is not None,
            **_dot_settings(dot_dtype), **cfg,
        )  # fmt: skip
    return out


def block_config(z: Tensor, dot_dtype: torch.dtype) -> dict[str, int]:
    """Tile sizes and launch settings: Hopper-sized tiles for compiled kernels (shallower depth
    tiles for fp32, whose operands take twice the shared memory), small ones under the
    interpreter (whose cost grows with the tile, not with the work the mask leaves)."""
    if z.device.type == "cpu":  # the interpreter
        return dict(BLOCK_T=16, BLOCK_N=32, BLOCK_D=16, num_warps=4, num_stages=1)
    block_d = 32 if dot_dtype == torch.float32 else 64
    return dict(BLOCK_T=128, BLOCK_N=128, BLOCK_D=block_d, num_warps=8, num_stages=3)


def default_splits(device: torch.device, blocks_t: int, blocks_n: int) -> int:
    """Class ranges per block of queries so that about four programs run per multiprocessor
    (the queries alone leave most of a GPU idle at small ``T``); 2 under the interpreter, so
    that the merge of partials is exercised."""
    if device.type != "cuda":
        return min(2, blocks_n)
    programs = 4 * torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(blocks_n, math.ceil(programs / max(blocks_t, 1))))


def _check_runs(z: Tensor, dot_dtype: torch.dtype, name: str, reference: str) -> None:
    if dot_dtype not in DOT_DTYPES:
        raise ValueError(f"{name} runs its matmuls in one of {DOT_DTYPES}, got {dot_dtype}")
    check_kernel_runs_on(
        name, z, installed=triton is not None, interpreted=triton_interpreted(), reference=reference
    )


def _unit_stride(x: Tensor) -> Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _or(x: Tensor | None, placeholder: Tensor) -> Tensor:
    """``x``, or a tensor the kernel never reads where it is ``None`` (its ``HAS_*`` is off)."""
    return placeholder if x is None else x


def _dot_settings(dot_dtype: torch.dtype) -> dict:
    """The kernels' matmul settings: the operands' dtype; fp32 products in IEEE fp32 unless
    torch itself allows TF32 for matmuls (its flag); under the interpreter, half-precision
    operands rounded and then multiplied in fp32 (its half-precision ``tl.dot`` is wrong)."""
    dtypes = {
        torch.float32: tl.float32,
        torch.bfloat16: tl.bfloat16,
        torch.float16: tl.float16,
    }
    return dict(
        DOT_DTYPE=dtypes[dot_dtype],
        WIDEN_DOT=triton_interpreted() and dot_dtype != torch.float32,
        PRECISION="tf32"
        if dot_dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32
        else "ieee",
    )


if triton is not None:

    @triton.jit
    def _logits_tile(
        z_ptr, w_ptr, bias_ptr, scale_ptr, rows, cols, T, col_end, D, stride_z, stride_w,
        padding_idx, HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr, DOT_DTYPE: tl.constexpr,
        WIDEN_DOT: tl.constexpr, PRECISION: tl.constexpr,
        BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    ):  # fmt: skip
        """fp32 ``[BLOCK_T, BLOCK_N]`` logits of query ``rows`` and class ``cols`` (``-inf`` for
        columns at or beyond ``col_end`` and for ``padding_idx``)."""
        acc = tl.zeros((BLOCK_T, BLOCK_N), dtype=tl.float32)
        row_ok = rows < T
        col_ok = cols < col_end
        for d0 in range(0, D, BLOCK_D):
            d = d0 + tl.arange(0, BLOCK_D)
            d_ok = d < D
            z = tl.load(
                z_ptr + rows[:, None].to(tl.int64) * stride_z + d[None, :],
                mask=row_ok[:, None] & d_ok[None, :],
                other=0.0,
            ).to(DOT_DTYPE)
            w = tl.load(
                w_ptr + cols[:, None].to(tl.int64) * stride_w + d[None, :],
                mask=col_ok[:, None] & d_ok[None, :],
                other=0.0,
            ).to(DOT_DTYPE)
            if WIDEN_DOT:  # the interpreter's half-precision dot is wrong: round, then fp32
                z = z.to(tl.float32)
                w = w.to(tl.float32)
            acc = tl.dot(z, tl.trans(w), acc, input_precision=PRECISION)
        if HAS_SCALE:
            acc = acc * tl.load(scale_ptr + cols, mask=col_ok, other=1.0)[None, :]
        if HAS_BIAS:
            acc = acc + tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        scored = col_ok & (cols != padding_idx)
        return tl.where(scored[None, :], acc, float("-inf"))

    @triton.jit
    def _lse_partials_kernel(
        z_ptr, w_ptr, bias_ptr, scale_ptr, max_ptr, sum_ptr, lsum_ptr,
        T, N, D, stride_z, stride_w, classes_per_split, padding_idx,
        HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr, WITH_SUM: tl.constexpr,
        DOT_DTYPE: tl.constexpr,
        WIDEN_DOT: tl.constexpr, PRECISION: tl.constexpr,
        BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    ):  # fmt: skip
        rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        split = tl.program_id(1)
        row_ok = rows < T
        n_start = split * classes_per_split
        n_end = tl.minimum(n_start + classes_per_split, N)
        run_max = tl.full((BLOCK_T,), float("-inf"), dtype=tl.float32)
        run_sum = tl.zeros((BLOCK_T,), dtype=tl.float32)
        lsum = tl.zeros((BLOCK_T,), dtype=tl.float32)
        for n0 in range(n_start, n_end, BLOCK_N):
            cols = n0 + tl.arange(0, BLOCK_N)
            logits = _logits_tile(
                z_ptr, w_ptr, bias_ptr, scale_ptr, rows, cols, T, n_end, D, stride_z, stride_w,
                padding_idx, HAS_BIAS, HAS_SCALE, DOT_DTYPE, WIDEN_DOT, PRECISION,
                BLOCK_T, BLOCK_N, BLOCK_D,
            )  # fmt: skip
            new_max = tl.maximum(run_max, tl.max(logits, axis=1))
            shift = tl.where(new_max == float("-inf"), 0.0, new_max)
            run_sum = run_sum * tl.exp(run_max - shift) + tl.sum(
                tl.exp(logits - shift[:, None]), axis=1
            )
            run_max = new_max
            if WITH_SUM:
                finite = (cols[None, :] < n_end) & (cols[None, :] != padding_idx)
                lsum += tl.sum(tl.where(finite, logits, 0.0), axis=1)
        out = split * T + rows
        tl.store(max_ptr + out, run_max, mask=row_ok)
        tl.store(sum_ptr + out, run_sum, mask=row_ok)
        tl.store(lsum_ptr + out, lsum, mask=row_ok)

    @triton.jit
    def _softmax_grad_kernel(
        z_ptr, w_ptr, bias_ptr, scale_ptr, target_ptr, lse_ptr, g_ptr, out_ptr,
        T, start, end, D, stride_z, stride_w, padding_idx, hit, smoothing,
        HAS_BIAS: tl.constexpr, HAS_SCALE: tl.constexpr, DOT_DTYPE: tl.constexpr,
        WIDEN_DOT: tl.constexpr, PRECISION: tl.constexpr,
        BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    ):  # fmt: skip
        rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        cols = start + tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < T
        logits = _logits_tile(
            z_ptr, w_ptr, bias_ptr, scale_ptr, rows, cols, T, end, D, stride_z, stride_w,
            padding_idx, HAS_BIAS, HAS_SCALE, DOT_DTYPE, WIDEN_DOT, PRECISION,
            BLOCK_T, BLOCK_N, BLOCK_D,
        )  # fmt: skip
        lse = tl.load(lse_ptr + rows, mask=row_ok, other=0.0)
        lse = tl.where(lse == float("-inf"), 0.0, lse)
        y = tl.load(target_ptr + rows, mask=row_ok, other=-1)
        g = tl.load(g_ptr + rows, mask=row_ok, other=0.0)
        grad = tl.exp(logits - lse[:, None])
        grad = grad - tl.where(cols[None, :] == y[:, None], hit, 0.0)
        scored = (cols < end) & (cols != padding_idx)
        grad = grad - tl.where(scored[None, :], smoothing, 0.0)
        grad = grad * g[:, None]
        col_ok = cols < end
        tl.store(
            out_ptr + rows[:, None].to(tl.int64) * (end - start) + (cols - start)[None, :],
            grad.to(out_ptr.dtype.element_ty),
            mask=row_ok[:, None] & col_ok[None, :],
        )
