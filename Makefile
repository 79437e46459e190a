# Every target installs what it needs first (scripts/setup.sh is idempotent).
PY := .venv/bin/python
export HF_DATASETS_OFFLINE := 1
export HF_HUB_OFFLINE := 1
export WANDB_MODE ?= offline

.PHONY: setup test test-gpu demo bench bench-train-step lint

setup:
	bash scripts/setup.sh

test: setup
	$(PY) -m pytest -q

# The kernel and CUDA-path tests on a GPU machine, with Triton compiled (TRITON_INTERPRET=0).
# Triton's interpreter is on or off for a whole process (it is read when Triton is imported), so
# the kernel's CPU cases, which need it, skip here and run under `make test`.
test-gpu: setup
	$(PY) -c "import sys, torch; sys.exit(not torch.cuda.is_available() and 'test-gpu needs CUDA')"
	TRITON_INTERPRET=0 $(PY) -m pytest -q -p no:cacheprovider -rs tests/kernels \
	    tests/callbacks/test_rng_checkpoint.py

demo: setup
	$(PY) -m recipes.demo

bench: setup
	$(PY) -m benchmarks.head_step

bench-train-step: setup
	OMP_NUM_THREADS=1 THP_MEM_ALLOC_ENABLE=1 $(PY) -m benchmarks.train_step --name train_step_huge_pages

lint: setup
	$(PY) -m ruff check lightning_sampled tests benchmarks recipes
	$(PY) -m ruff format --check lightning_sampled tests benchmarks recipes
