# Every target installs what it needs first (scripts/setup.sh is idempotent).
PY := .venv/bin/python
export HF_DATASETS_OFFLINE := 1
export HF_HUB_OFFLINE := 1
export WANDB_MODE ?= offline

.PHONY: setup test demo bench bench-train-step lint

setup:
	bash scripts/setup.sh

test: setup
	$(PY) -m pytest -q

demo: setup
	$(PY) -m recipes.demo

bench: setup
	$(PY) -m benchmarks.head_step

bench-train-step: setup
	OMP_NUM_THREADS=1 THP_MEM_ALLOC_ENABLE=1 $(PY) -m benchmarks.train_step --name train_step_huge_pages

lint: setup
	$(PY) -m ruff check lightning_sampled tests benchmarks recipes
	$(PY) -m ruff format --check lightning_sampled tests benchmarks recipes
