"""benchmarks.gpu_step: the issue-29 GPU script runs end to end at toy sizes on the CPU, in a
process where the packages the GPU machine lacks cannot be imported, and writes its two files
with a Targets line per target (compile is left out here: inductor takes a minute on the CPU)."""

import csv
import re

from gpu_machine import MISSING_ON_GPU, run_main_as_on_the_gpu_machine


def test_tiny_run_writes_the_results_and_a_targets_line_per_target(tmp_path):
    out = tmp_path / "t29"
    argv = ["--tiny", "--device", "cpu", "--out", str(out), "--commit", "abc1234"]
    argv += ["--parts", "head", "refresh", "train"]
    # gpu_step needs neither jsonargparse nor Cut Cross-Entropy: it must run without them too
    missing = (*MISSING_ON_GPU, "jsonargparse", "cut_cross_entropy")
    done = run_main_as_on_the_gpu_machine("benchmarks.gpu_step", argv, missing)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["gpu_step.csv", "gpu_step.md"]
    with (out / "gpu_step.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {r["part"] for r in rows} == {"head", "refresh", "train"}
    assert all(r["commit"] == "abc1234" and float(r["median_ms"]) > 0 for r in rows)
    methods = {r["method"] for r in rows if r["part"] == "train"}
    assert methods == {
        f"{p}/{s}" for p in ("sparse", "dense_fused") for s in ("uniform", "midx_rq4")
    }
    md = (out / "gpu_step.md").read_text()
    targets = md.split("## Targets\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in targets.splitlines() if line.startswith("- ")]
    assert all(re.search(r"\*\*(met|NOT met)\*\*$", line) for line in lines), lines
    kinds = {
        "MIDX-rq head K = 4 / uniform head, time": 1,
        "MIDX-rq head K = 8 / uniform head, peak memory": 1,
        "refresh at N = 2e+04": 1,
        "LazyAdam step, ": 2,  # uniform and MIDX-rq
        "sparse + LazyAdam vs dense + Adam(fused=True)": 4,  # two sizes x two samplers
    }
    for start, count in kinds.items():
        assert sum(line[2:].startswith(start) for line in lines) == count, (start, lines)
    assert len(lines) == 2 * 2 + 1 + 2 + 4
    assert "- commit: abc1234" in md and "- torch " in md and "Triton" in md
