#!/usr/bin/env bash
# The GPU issues' device checks, one entry point with a switch per issue:
#   bash scripts/gpu_check.sh [28] [29] [30] [31] [52]
# 28: `make test-gpu`'s tests, then the exact-head rows of benchmarks/head_step.py (bf16) against
#     plain cross-entropy, torch's F.linear_cross_entropy and Cut Cross-Entropy.
# 29: sampled training on the GPU (benchmarks/gpu_step.py): MIDX vs uniform, the index refresh,
#     the whole step against N, fused dense Adam, compiled vs eager.
# 30: time to quality at equal wall clock (benchmarks/time_to_quality.py), on data prepared on the
#     CPU into .gpu_data/ (python -m benchmarks.time_to_quality --prepare .gpu_data).
# 31: the default configuration (in-batch negatives) on the GPU: the in-batch heads' host-sync
#     checks, its price against the plain head (benchmarks/default_cost.py, with
#     max_in_batch_draws 256 and 1024), and the estimator grid's default runs still missing
#     (seeds 0-2, resumed from benchmarks/results/estimator_grid; data from
#     python -m benchmarks.estimator_grid --prepare .gpu_data).
# 52: the default's price on the GPU: the pooled in-batch column against the [T, U] columns at
#     the recipes' shapes and the in-batch heads' host-sync checks, then benchmarks/default_cost.py
#     on CUDA (the default, the plain head, the bounded form and the products alone, peak memory).
# Meant for a machine without network whose python3 has torch, Triton and Lightning: the packages it
# lacks travel as wheels in .whl/ (faiss-cpu, cut-cross-entropy, jsonargparse and its two needs) and
# are installed into /tmp/site. Results go to $OUT (default: ./gpu_results): log.txt, and
# results.tgz with every CSV / Markdown / PNG (the device tool returns at most 8 files).
# Dry run on a CPU machine: `GPU_CHECK_DRY=1 bash scripts/gpu_check.sh 28 29 30` (tiny sizes);
# GPU_CHECK_SHAPES narrows 28's head_step shapes (default: A B C).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_results}
RESULTS=$OUT/results
mkdir -p "$RESULTS"
exec > >(tee -a "$OUT/log.txt") 2>&1
PY=${PY:-python3}
DRY=${GPU_CHECK_DRY:-0}
export PYTHONUNBUFFERED=1 WANDB_MODE=offline HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1

if [ -d .whl ] && [ "$DRY" != 1 ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || { echo "wheel install failed"; exit 1; }
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
# the device's copy may carry a stale .git: .gpu_commit (written here before a run) comes first
COMMIT=$(cat .gpu_commit 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown)
echo "== commit $COMMIT, $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null \
    | tee "$RESULTS/gpu.txt"
"$PY" - <<'PY' | tee -a "$RESULTS/gpu.txt"
import importlib.util, torch, torch.nn.functional as F
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if importlib.util.find_spec("triton"):
    import triton; print("triton", triton.__version__)
print("F.linear_cross_entropy", hasattr(F, "linear_cross_entropy"))
for name in ("faiss", "cut_cross_entropy", "jsonargparse", "lightning", "torchmetrics"):
    print(name, "ok" if importlib.util.find_spec(name) else "MISSING")
PY

# part NAME SECONDS COMMAND...: runs one part under a time limit; a failure is logged, not fatal
part() {
    local name=$1 limit=$2; shift 2
    echo "== $name (limit ${limit}s) $(date -u +%T)"
    local start=$SECONDS
    timeout "$limit" "$@"
    echo "== $name: exit $? after $((SECONDS - start))s"
}

if [ "$DRY" = 1 ]; then
    SIZES_A="--batch 64 --dim 32 --sizes 3000"; SIZES_B=$SIZES_A; SIZES_C="--batch 64 --dim 32 --sizes 2000 4000"
    HEAD_DEVICE=cpu
else
    SIZES_A="--batch 8192 --dim 2048 --sizes 262144"
    SIZES_B="--batch 25600 --dim 64 --sizes 1000000"
    SIZES_C="--batch 8192 --dim 128 --sizes 100000 1000000 10000000"
    HEAD_DEVICE=cuda
fi
EXACT="plain_cross_entropy linear_cross_entropy cut_cross_entropy full_softmax_head full_softmax_head_chunked"

for issue in "$@"; do
    case $issue in
    28)
        # `make test-gpu`'s tests in two runs: the kernels and the exact head first (the rows
        # below rest on them), the compiled heads, RNG state and host-sync checks after 29.
        if [ "$DRY" != 1 ]; then
            part test-gpu-kernels 150 env PY="$PY" GPU_TESTS="tests/kernels \
                tests/heads/test_exact_backends.py" bash scripts/test_gpu.sh -v --timeout 60 \
                --junitxml="$RESULTS/test_gpu_kernels.xml"
        fi
        for shape in ${GPU_CHECK_SHAPES:-A B C}; do
            sizes=SIZES_$shape
            # shellcheck disable=SC2086
            part "head_step $shape" 100 "$PY" -m benchmarks.head_step --device $HEAD_DEVICE \
                --dtype bfloat16 --repeats 5 ${!sizes} --methods $EXACT \
                --background "GPU check for issue 28" --commit "$COMMIT" \
                --name "$RESULTS/gpu_head_$shape"
        done
        ;;
    29)
        if [ "$DRY" = 1 ]; then
            part gpu_step 300 "$PY" -m benchmarks.gpu_step --tiny --out "$RESULTS" --commit "$COMMIT"
        else
            part gpu_step 150 "$PY" -m benchmarks.gpu_step --out "$RESULTS" --commit "$COMMIT"
        fi
        ;;
    30)
        if [ "$DRY" = 1 ]; then
            part time_to_quality 300 "$PY" -m benchmarks.time_to_quality --tiny --budget-s 2 \
                --data .gpu_data --out "$RESULTS" --commit "$COMMIT"
        else
            part time_to_quality 280 "$PY" -m benchmarks.time_to_quality --budget-s 12 \
                --deadline-s 230 --data .gpu_data --out "$RESULTS" --commit "$COMMIT"
        fi
        ;;
    31)
        if [ "$DRY" = 1 ]; then
            part default_cost 120 "$PY" -m benchmarks.default_cost --shapes ptb --limits 256 \
                --repeats 2 --device cpu --name "$RESULTS/default_cost_cuda"
            part estimator_grid 300 "$PY" -m benchmarks.estimator_grid --tiny --device cpu \
                --data .gpu_data --out "$RESULTS/estimator_grid" --tasks ptb \
                --conventions corrected_all+batch --references --seeds 0 --commit "$COMMIT"
        else
            part test-gpu-in-batch 100 env PY="$PY" GPU_TESTS="tests/gpu/test_no_host_sync.py" \
                bash scripts/test_gpu.sh -v --timeout 60 -k "in_batch or mixed" \
                --junitxml="$RESULTS/test_gpu_in_batch.xml"
            part default_cost 90 "$PY" -m benchmarks.default_cost --limits 256 1024 \
                --repeats 7 --device cuda --background "GPU check for issue 31" \
                --name "$RESULTS/default_cost_cuda"
            cp -r benchmarks/results/estimator_grid "$RESULTS/estimator_grid"
            part estimator_grid 380 "$PY" -m benchmarks.estimator_grid --data .gpu_data \
                --out "$RESULTS/estimator_grid" --resume --conventions corrected_all+batch \
                --seeds 0 1 2 --workers 16 --deadline-s 250 --commit "$COMMIT"
        fi
        ;;
    52)
        if [ "$DRY" = 1 ]; then
            part default_cost 300 "$PY" -m benchmarks.default_cost --shapes ptb --limits 256 \
                --groups 32 --memory --repeats 2 --device cpu --name "$RESULTS/default_cost_cuda"
        else
            part test-gpu-pooled 200 env PY="$PY" GPU_TESTS="tests/heads/test_pooled_in_batch.py \
                tests/gpu/test_no_host_sync.py" bash scripts/test_gpu.sh -v --timeout 90 \
                -k "cuda or in_batch" --junitxml="$RESULTS/test_gpu_pooled.xml"
            part default_cost 200 "$PY" -m benchmarks.default_cost --limits 256 1024 \
                --groups 32 200 --memory --repeats 7 --device cuda \
                --background "GPU check for issue 52" --name "$RESULTS/default_cost_cuda"
        fi
        ;;
    *) echo "unknown issue $issue (28, 29, 30, 31 or 52)" ;;
    esac
done
if [[ " $* " == *" 28 "* ]] && [ "$DRY" != 1 ]; then
    part test-gpu-rest 150 env PY="$PY" GPU_TESTS="tests/heads/test_compile.py \
        tests/callbacks/test_rng_checkpoint.py tests/gpu" bash scripts/test_gpu.sh -v \
        --timeout 60 --junitxml="$RESULTS/test_gpu_rest.xml"
fi
# the device tool returns at most 8 files: one archive (and log.txt) instead of the folder
tar czf "$OUT/results.tgz" -C "$OUT" results && rm -rf "$RESULTS" &&
    echo "== results.tgz: $(tar tzf "$OUT/results.tgz" | wc -l) entries"
