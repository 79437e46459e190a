"""The implementations :class:`~lightning_sampled.heads.FullSoftmaxHead` can compute its exact
cross-entropy with, and which one ``backend="auto"`` picks.

- ``"torch"``: :func:`~lightning_sampled.ops.chunked.chunked_nll`, plain torch in class chunks
  (every device, every option, fp64 included).
- ``"triton"``: :func:`~lightning_sampled.ops.fused.fused_nll`, the fused Triton passes (CUDA;
  CPU only under Triton's interpreter), every option; products in bf16, fp16 or fp32 (fp64
  products take the torch path: Triton's dot does not compile fp64 for Hopper).
- ``"cut_cross_entropy"``: a hand-off to Cut Cross-Entropy (``pip install cut-cross-entropy``),
  its Triton implementation on CUDA (``impl="cce"``), ``"torch_compile"`` elsewhere. It filters
  small gradients: its default ``filter_eps="high"`` skips the blocks of the backward whose softmax
  entries all fall below bf16's resolution (``2^-12``), which it states loses nothing at bf16;
  the hand-off keeps that default. No bias, ``padding_idx``, ``normalize`` or label smoothing;
  on CUDA bf16 / fp16 products only (its backward refuses fp32).
- ``"linear_cross_entropy"``: a hand-off to torch's ``F.linear_cross_entropy`` with its chunked
  path (``options=nn.LinearCrossEntropyOptions()``; torch >= 2.13), which does not filter. Bias;
  no ``padding_idx``, ``normalize`` or label smoothing (with which torch leaves its chunked path
  for the whole ``[T, N]`` logits).

``"auto"`` is ``"triton"`` for CUDA queries whose matmul dtype is bf16, fp16 or fp32 when Triton
is installed, ``"torch"`` otherwise, and also under ``torch.compile`` (the fused kernels are
launched from an ``autograd.Function``, which dynamo does not trace through), where the torch
path's loops over the class chunks are custom ops that inductor calls as they are, so that a
compiled step, like an eager one, holds one ``[T, chunk_size]`` block of logits at a time.
"""

from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..ops.chunked import compute_dtype

#: the values of ``FullSoftmaxHead(backend=...)``
EXACT_BACKENDS = ("auto", "torch", "triton", "cut_cross_entropy", "linear_cross_entropy")
#: the options each hand-off cannot take
_HANDOFF_LIMITS = {
    "cut_cross_entropy": ("bias", "padding_idx", "normalize", "label_smoothing"),
    "linear_cross_entropy": ("padding_idx", "normalize", "label_smoothing"),
}


#: whether Triton can be imported, read once (``resolve_backend`` runs inside compiled code)
TRITON_INSTALLED = importlib.util.find_spec("triton") is not None
#: matmul dtypes the fused kernel computes in (Triton's dot does not compile fp64 for Hopper)
FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: matmul dtypes Cut Cross-Entropy's CUDA backward takes
CCE_CUDA_DTYPES = (torch.bfloat16, torch.float16)


def backend_missing(backend: str) -> str | None:
    """Why ``backend`` cannot run in this environment, or ``None`` where it can."""
    if backend == "triton" and not TRITON_INSTALLED:
        return "it needs Triton (pip install triton; Linux only)"
    if backend == "cut_cross_entropy" and importlib.util.find_spec("cut_cross_entropy") is None:
        return "it needs Cut Cross-Entropy (pip install cut-cross-entropy)"
    if backend == "linear_cross_entropy" and not hasattr(F, "linear_cross_entropy"):
        return f"torch {torch.__version__} has no F.linear_cross_entropy (torch >= 2.13 has)"
    return None


def check_exact_backend(
    backend: str,
    *,
    bias: bool,
    padding_idx: int | None,
    normalize: bool,
    label_smoothing: float,
    sharded: bool = False,
) -> str:
    """``backend`` if it is one of :data:`EXACT_BACKENDS`, can run here and supports the head's
    options; ``ValueError`` saying which of these fails otherwise. A sharded head runs the
    chunked torch path over its rows (``"auto"`` or ``"torch"``)."""
    if backend not in EXACT_BACKENDS:
        raise ValueError(f"backend must be one of {list(EXACT_BACKENDS)}, got {backend!r}")
    if sharded and backend not in ("auto", "torch"):
        raise ValueError(
            f"backend={backend!r} does not support sharded=True: a table split across ranks "
            f"is scored by the chunked torch path, whose per-rank sums the ranks combine; use "
            f"backend='auto' or 'torch'"
        )
    missing = backend_missing(backend)
    if missing:
        raise ValueError(f"backend={backend!r} cannot run here: {missing}")
    used = dict(
        bias=bias,
        padding_idx=padding_idx is not None,
        normalize=normalize,
        label_smoothing=bool(label_smoothing),
    )
    unsupported = [name for name in _HANDOFF_LIMITS.get(backend, ()) if used[name]]
    if unsupported:
        raise ValueError(
            f"backend={backend!r} does not support {', '.join(unsupported)}; use backend="
            f"'triton' or 'torch', which support every option"
        )
    return backend


def resolve_backend(backend: str, z: Tensor) -> str:
    """The backend that computes the loss of queries ``z`` (module docstring): ``backend``
    itself, but ``"torch"`` for fp64 products on ``"triton"``; for ``"auto"`` the fused kernel
    for CUDA queries, outside ``torch.compile`` (module docstring)."""
    fused_dtype = compute_dtype(z) in FUSED_DTYPES
    if backend == "triton":
        return backend if fused_dtype else "torch"
    if backend != "auto":
        return backend
    compiling = torch.compiler.is_compiling()
    fused = z.is_cuda and fused_dtype and TRITON_INSTALLED and not compiling
    return "triton" if fused else "torch"


def handoff_nll(
    backend: str,
    z: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    target: Tensor,
) -> Tensor:
    """Per-row exact cross-entropy ``[T]`` (fp32) by the peer ``backend`` names, its matmuls in
    :func:`~lightning_sampled.ops.chunked.compute_dtype` of ``z``."""
    dtype = compute_dtype(z)
    if backend == "cut_cross_entropy" and z.is_cuda and dtype not in CCE_CUDA_DTYPES:
        raise ValueError(
            f"backend='cut_cross_entropy' computes gradients for bf16 / fp16 products only, got "
            f"{dtype}: train under autocast (Lightning's precision='bf16-mixed') or use "
            f"backend='triton'"
        )
    z_c, w_c = z.to(dtype), weight.to(dtype)
    with torch.autocast(z.device.type, enabled=False):
        if backend == "cut_cross_entropy":
            from cut_cross_entropy import linear_cross_entropy

            impl = "cce" if z.is_cuda else "torch_compile"
            loss = linear_cross_entropy(z_c, w_c, target, reduction="none", impl=impl)
        else:
            loss = F.linear_cross_entropy(
                z_c,
                w_c,
                target,
                linear_bias=None if bias is None else bias.to(dtype),
                reduction="none",
                options=nn.LinearCrossEntropyOptions(),
            )
    return loss.float()
