"""Triton, when installed, and the checks every kernel of this package makes before it launches.

Triton has no CPU backend: on CPU tensors a kernel runs under Triton's interpreter, which
``TRITON_INTERPRET=1`` switches on for the whole process when Triton is imported
(:func:`triton_interpreted`). One process cannot run both modes: ``triton.jit`` picks the mode
when it decorates, Triton's own library functions (``tl.max``, ``tl.sum``) included, and an
interpreted kernel fails on them if they were compiled, and vice versa.
"""

from __future__ import annotations

from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # Triton ships for Linux only; the torch references serve everywhere else.
    triton = None
    tl = None

if triton is not None:

    @triton.jit
    def _probe():
        """Never launched: its type says whether ``triton.jit`` compiles or interprets."""
        pass


def triton_interpreted() -> bool:
    """Whether this process runs Triton kernels under Triton's interpreter (it was imported with
    ``TRITON_INTERPRET=1``): then on tensors of any device, copied to the host; otherwise
    compiled, on GPU tensors only. ``False`` without Triton."""
    return triton is not None and not isinstance(_probe, triton.runtime.jit.JITFunction)


def check_kernel_runs_on(
    name: str, tensor: Tensor, *, installed: bool, interpreted: bool, reference: str
) -> None:
    """Raises ``RuntimeError`` where kernel ``name`` cannot run on ``tensor``'s device: without
    Triton (``installed`` false), or on CPU tensors when this process compiles (``interpreted``
    false). ``reference`` names the torch function to use instead. The caller passes its own
    view of both flags, so that a test can switch them off in the kernel's module."""
    if not installed:
        raise RuntimeError(f"{name} needs Triton, which is not installed; use {reference}")
    if tensor.device.type == "cpu" and not interpreted:
        raise RuntimeError(
            f"{name} got CPU tensors, but Triton has no CPU backend and this process imported "
            f"it without TRITON_INTERPRET=1 (its interpreter); pass GPU tensors, use "
            f"{reference}, or set TRITON_INTERPRET=1 before importing"
        )
