"""Where this test process can run a Triton kernel: the CPU under Triton's interpreter
(``make test``, ``TRITON_INTERPRET=1`` from ``conftest.py``), CUDA compiled (``make test-gpu``)."""

import pytest
import torch

from lightning_sampled.kernels._triton import triton_interpreted

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def skip_unless_the_kernel_runs_on(device):
    """Skips where this process cannot run the Triton kernel on ``device`` (the CPU under a
    compiling process, CUDA under the interpreter)."""
    on_cpu = torch.device(device).type == "cpu"
    if on_cpu != triton_interpreted():
        pytest.skip(
            "the Triton interpreter is off in this process (TRITON_INTERPRET=0): `make test` "
            "runs the CPU kernel"
            if on_cpu
            else "the Triton interpreter is on in this process: `make test-gpu` runs the "
            "compiled kernel"
        )
