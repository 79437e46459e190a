# Every target installs what it needs first (scripts/setup.sh is idempotent).
PY := .venv/bin/python
export HF_DATASETS_OFFLINE := 1
export HF_HUB_OFFLINE := 1
export WANDB_MODE ?= offline

.PHONY: setup test test-gpu demo bench bench-full bench-train-step report lint

setup:
	bash scripts/setup.sh

test: setup
	$(PY) -m pytest -q

# The kernel and CUDA-path tests on a GPU machine, Triton compiled (scripts/test_gpu.sh says which).
test-gpu: setup
	PY=$(PY) bash scripts/test_gpu.sh

demo: setup
	$(PY) -m recipes.demo

# The quick subset (about 13 minutes on the 2-core CPU machine), then the report.
bench: setup
	$(PY) -m benchmarks.head_step --threads 1
	$(MAKE) report

# Every benchmark behind benchmarks/results/REPORT.md (hours), then the report. The recipes'
# trainings (recipes/RESULTS.md) are not run here: the report names their commands.
bench-full: setup
	$(PY) -m benchmarks.head_step --threads 1
	$(PY) -m benchmarks.head_step --threads 1 --sizes 100000 10000000 --name head_step_1e7 \
	    --methods adaptive_log_softmax full_softmax_head uniform_sparse uniform_shared_sparse \
	    unigram_sparse log_uniform_sparse in_batch_sparse midx_pq_sparse midx_rq_sparse \
	    midx_learn_sparse tapas_sparse ove_sparse cane_sparse
	$(PY) -m benchmarks.sampler_time --threads 1
	$(PY) -m benchmarks.cane --threads 1 --repeats 5
	$(PY) -m benchmarks.cane_topk --threads 1 --repeats 3
	$(PY) -m benchmarks.cane_synthetic
	$(PY) -m benchmarks.tapas_synthetic
	$(PY) -m benchmarks.ove_nonparametric
	$(PY) -m benchmarks.adaptive_softmax
	$(PY) -m benchmarks.adaptive_softmax_trained
	$(PY) -m benchmarks.lazy_adam_update
	OMP_NUM_THREADS=1 $(PY) -m benchmarks.train_step
	$(PY) -m benchmarks.ddp_scaling
	$(MAKE) report

# Assembles benchmarks/results/REPORT.md from the result files (seconds; measures nothing) and
# copies its headline table into the README.
report:
	$(PY) -m benchmarks.report --readme README.md

bench-train-step: setup
	OMP_NUM_THREADS=1 THP_MEM_ALLOC_ENABLE=1 $(PY) -m benchmarks.train_step --name train_step_huge_pages

lint: setup
	$(PY) -m ruff check lightning_sampled tests benchmarks recipes
	$(PY) -m ruff format --check lightning_sampled tests benchmarks recipes
