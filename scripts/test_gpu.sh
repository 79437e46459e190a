#!/usr/bin/env bash
# The kernel and CUDA-path tests (the Triton kernels compiled, the fused exact head, compiled heads,
# CUDA RNG state, no host sync in a head's training step) on a GPU machine.
# `make test-gpu` runs this with .venv's python after scripts/setup.sh; on a machine whose python
# already holds what the package needs (a GPU image without network), run
# `PY=python3 bash scripts/test_gpu.sh` directly.
# Triton's interpreter is on or off for a whole process (it is read when Triton is imported), so
# the kernels' CPU cases, which need it, skip here and run under `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
"$PY" -c "import sys, torch; sys.exit(not torch.cuda.is_available() and 'test-gpu needs CUDA')"
# GPU_TESTS narrows the run to some of these paths (scripts/gpu_check.sh runs the kernels first).
GPU_TESTS=${GPU_TESTS:-tests/kernels tests/heads/test_exact_backends.py tests/heads/test_compile.py \
tests/callbacks/test_rng_checkpoint.py tests/gpu}
# shellcheck disable=SC2086
# -m gpu: the CUDA cases only; their CPU cases (which need the interpreter) run under `make test`
TRITON_INTERPRET=0 "$PY" -m pytest -q -p no:cacheprovider -rs -m gpu "$@" $GPU_TESTS
