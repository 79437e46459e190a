"""Shared test setup.

Triton has no CPU backend: kernels run under its interpreter, which must be switched on before any
kernel module is imported.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


import faiss  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from kernel_runs import needs_cuda  # noqa: E402


@pytest.fixture(autouse=True)
def one_faiss_thread():
    """faiss' OpenMP threads spin against other processes on a shared 2-core machine (a 5k-point
    k-means took 0.6 s instead of 0.025 s): tests run it single-threaded."""
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(before)


@pytest.fixture
def one_torch_thread():
    """Small matmuls and gathers: intra-op threads only add contention on a loaded 2-core machine
    (7 s instead of 0.05 s per test at a load of 14). Modules opt in with
    ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, needs_cuda])])
def device(request):
    """The device a kernel test runs on: the CPU, and CUDA where there is one (``gpu``)."""
    return torch.device(request.param)
