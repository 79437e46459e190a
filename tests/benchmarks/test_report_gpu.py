"""benchmarks.report's GPU section and ``gpu.md`` on small synthetic result files: every target
is computed from the CSVs (a slower or larger row flips it), the exactness target follows
``make test-gpu``'s output, and missing GPU files give a "not measured yet" line with the
device script's command."""

import csv
import re
from pathlib import Path

from benchmarks import report

HEAD_COLUMNS = ["num_classes", "method", "batch", "dim", "device", "median_s", "peak_mib"]
HEAD_COLUMNS += ["status", "machine", "torch", "commit"]
COMMAND = "bash scripts/gpu_check.sh 28 29 30"
TESTS_PASSED = """# make test-gpu on the GPU, NVIDIA Test GPU, driver 123.45, commit abc1234
tests/kernels/test_linear_cross_entropy.py .....     [ 85%]
tests/heads/test_exact_backends.py ..s..              [100%]
================ 9 passed, 1 skipped in 5.00s =================
"""


def write_csv(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def head(n, method, ms, mib, batch=8192, dim=128, status="ok", commit="abc1234") -> dict:
    seconds = "" if ms is None else ms / 1e3
    values = [n, method, batch, dim, "cuda", seconds, "" if mib is None else mib, status]
    return dict(zip(HEAD_COLUMNS, [*values, "NVIDIA Test GPU", "2.11.0", commit], strict=True))


def write_heads(dirs: report.Inputs, ours_ms: float = 50.0, ours_mib: float = 100.0) -> None:
    """Shapes A, B and C; plain cross-entropy fits at A and at C's smaller N only."""
    write_csv(
        dirs.benchmarks / "gpu_head_A.csv",
        [
            head(1000, "plain_cross_entropy", 100.0, 5000.0, dim=2048),
            head(1000, "cut_cross_entropy", 80.0, 200.0, dim=2048),
            head(1000, "full_softmax_head", ours_ms, ours_mib, dim=2048),
        ],
    )
    write_csv(
        dirs.benchmarks / "gpu_head_B.csv",
        [
            head(10**6, "plain_cross_entropy", None, None, status="skipped: needs 300 GiB"),
            head(10**6, "cut_cross_entropy", 80.0, 200.0, batch=25600, dim=64),
            head(10**6, "full_softmax_head", ours_ms, ours_mib, batch=25600, dim=64),
        ],
    )
    write_csv(
        dirs.benchmarks / "gpu_head_C.csv",
        [
            head(10**5, "plain_cross_entropy", 10.0, 1000.0),
            head(10**5, "full_softmax_head", 5.0, 10.0),
            head(10**7, "plain_cross_entropy", None, None, status="skipped: needs 900 GiB"),
            head(10**7, "full_softmax_head", 500.0, 1000.0),
        ],
    )
    (dirs.benchmarks / "gpu_head_A.md").write_text(
        "bfloat16 table and queries, device cuda (NVIDIA Test GPU, Triton 9.9.9)\n"
    )


def step(part, method, k, n, ms, mib="", note="", batch=1024) -> dict:
    return {
        "part": part,
        "method": method,
        "codebook_size": k,
        "num_classes": n,
        "batch": batch,
        "median_ms": ms,
        "peak_mib": mib,
        "note": note,
        "machine": "NVIDIA Test GPU",
        "torch": "2.11.0",
        "commit": "def5678",
    }


def step_rows(midx_ms: float = 7.0, refresh_ms: float = 100.0) -> list[dict]:
    return [
        step("head", "uniform", "", 10**6, 6.0, 1000.0, batch=25600),
        step("head", "midx_rq", 32, 10**6, midx_ms, 1000.0, batch=25600),
        step("refresh", "midx_rq", 32, 10**7, refresh_ms, 800.0, "first (cold) refresh 0.2 s"),
        step("train", "sparse/uniform", "", 10**5, 5.0),
        step("train", "dense_fused/uniform", "", 10**5, 2.0),
        step("train", "sparse/uniform", "", 10**7, 6.0),
        step("train", "dense_fused/uniform", "", 10**7, 9.0),
        step("compile", "uniform/eager", "", 10**6, 2.0),
        step("compile", "uniform/compiled", "", 10**6, 1.0, note="graph breaks 0; ok"),
    ]


def final(task, method, val, metric="val_ppl") -> dict:
    return {
        "task": task,
        "method": method,
        "metric": metric,
        "status": "ok",
        "steps": 10,
        "epochs": 1.0,
        "train_s": 12.0,
        "positions_per_s": 1000.0,
        "val": val,
        "test": val,
        "head": "Head(num_classes=5000, dim=8)",
        "machine": "NVIDIA Test GPU",
        "torch": "2.11.0",
        "commit": "fedcba9",
    }


def write_ttq(dirs: report.Inputs, default_ppl: float) -> None:
    out = dirs.recipes / "gpu_time_to_quality"
    finals = [
        final("gcide", "cut_cross_entropy", 30.0),
        final("gcide", "mixed", 40.0),
        final("gcide", "default", default_ppl),
        final("sasrec", "cut_cross_entropy", 0.03, "val_ndcg@10"),
        final("sasrec", "default", 0.04, "val_ndcg@10"),
    ]
    write_csv(out / "final.csv", finals)
    curve = [
        {"task": "gcide", "method": m, "metric": "val_ppl", "wall_s": t, "step": 0, "value": v}
        for m, points in (
            ("cut_cross_entropy", ((0.0, 1000.0), (12.0, 30.0))),
            ("default", ((0.0, 1000.0), (5.0, 29.0), (12.0, default_ppl))),
        )
        for t, v in points
    ]
    write_csv(out / "curves.csv", curve)
    (out / "time_to_quality.md").write_text(
        "- driver: 123.45\n- precision: bf16-mixed training; seed 0 for every run\n"
        "- budget: 12 s of training wall time per task and method\n"
    )


def gpu_section(text: str) -> str:
    match = re.search(r"^## 9\. GPU.*?(?=^## |\Z)", text, re.M | re.S)
    assert match, "no GPU section"
    return match.group(0)


def target(text: str, start: str) -> str:
    """The one Targets line that starts with ``- start``."""
    found = [line for line in text.splitlines() if line.startswith(f"- {start}")]
    assert len(found) == 1, (start, found)
    return found[0]


def run_main(dirs: report.Inputs) -> tuple[str, str]:
    report.main(
        [f"--benchmarks={dirs.benchmarks}", f"--recipes={dirs.recipes}"]
        + [f"--results-md={dirs.results_md}"]
    )
    return dirs.out.read_text(), (dirs.benchmarks / "gpu.md").read_text()


def test_missing_gpu_files_say_not_measured_with_the_device_script(dirs):
    text, gpu_md = run_main(dirs)
    section = gpu_section(text)
    assert section.startswith("## 9. GPU\n")
    assert "Not measured yet: " in section and f"`{COMMAND}`" in section
    assert "Not measured yet: any GPU result" in gpu_md and COMMAND in gpu_md
    assert "|---|" not in gpu_md


def test_exact_head_targets_flip_with_the_rows(dirs):
    write_heads(dirs, ours_ms=50.0, ours_mib=100.0)
    section = gpu_section(report.build_report(dirs))
    assert section.startswith("## 9. GPU (NVIDIA Test GPU)")
    assert target(section, "fwd + bwd time <= Cut Cross-Entropy's, shape A").endswith(
        "50 vs 80 ms (0.625x): **met**"
    )
    assert target(section, "peak memory <= Cut Cross-Entropy's, shape B").endswith(
        "100 vs 200 MiB (0.5x): **met**"
    )
    faster = target(section, ">= 1.5x faster than plain cross-entropy, shape A")
    assert faster.endswith("(plain / ours = 2x): **met**")
    # plain cross-entropy did not fit at B nor at C's 1e7: no speed-up target there
    assert ">= 1.5x faster than plain cross-entropy, shape B" not in section
    assert "N = 10,000,000): " not in section
    assert target(section, ">= 1.5x faster than plain cross-entropy, shape C").endswith("**met**")

    write_heads(dirs, ours_ms=90.0, ours_mib=300.0)
    section = gpu_section(report.build_report(dirs))
    assert target(section, "fwd + bwd time <= Cut Cross-Entropy's, shape A").endswith(
        "90 vs 80 ms (1.12x): **NOT met**"
    )
    assert target(section, "peak memory <= Cut Cross-Entropy's, shape B").endswith("**NOT met**")
    faster = target(section, ">= 1.5x faster than plain cross-entropy, shape A")
    assert faster.endswith("(plain / ours = 1.11x): **NOT met**")
    assert "plain_cross_entropy (B, N = 1,000,000) (skipped: needs 300 GiB)" in section


def test_exactness_follows_the_gpu_test_output(dirs):
    write_heads(dirs)
    label = "equal to F.cross_entropy"
    assert target(gpu_section(report.build_report(dirs)), label).endswith("**not measured**")
    (dirs.benchmarks / "test_gpu.txt").write_text(TESTS_PASSED)
    passed = target(gpu_section(report.build_report(dirs)), label)
    assert "9 passed, 1 skipped in tests/kernels" in passed and passed.endswith("**met**")
    assert "no further from fp32 than plain half-precision F.cross_entropy's" in passed
    (dirs.benchmarks / "test_gpu.txt").write_text(TESTS_PASSED.replace("..s..", ".Fs.."))
    assert target(gpu_section(report.build_report(dirs)), label).endswith("**NOT met**")


def test_sampled_training_targets_come_from_gpu_step_csv(dirs):
    write_csv(dirs.benchmarks / "gpu_step.csv", step_rows())
    section = gpu_section(report.build_report(dirs))
    assert target(section, "MIDX-rq head K = 32 / uniform head, time").endswith(
        "7 / 6 ms = 1.17x: **met**"
    )
    assert target(section, "index refresh, MIDX-rq K = 32").endswith(
        "0.100 s (cold first 0.2 s): **met**"
    )
    assert target(section, "whole step, sparse_grad + LazyAdam, uniform").endswith(
        "= 1.2x: **met**"
    )
    # fused dense Adam is compared from N = 1e6 on only
    assert "Adam(fused=True), uniform, N = 1e5" not in section
    assert target(section, "sparse_grad + LazyAdam faster than dense").endswith("**met**")
    assert "(graph breaks: 0)" in target(section, "compiled forward + backward faster")

    write_csv(dirs.benchmarks / "gpu_step.csv", step_rows(midx_ms=9.0, refresh_ms=600.0))
    section = gpu_section(report.build_report(dirs))
    assert target(section, "MIDX-rq head K = 32 / uniform head, time").endswith("**NOT met**")
    assert target(section, "index refresh, MIDX-rq K = 32").endswith("**NOT met**")


def test_time_to_quality_targets_come_from_final_and_curves(dirs):
    write_ttq(dirs, default_ppl=25.0)
    section = gpu_section(report.build_report(dirs))
    assert "12 s of wall clock per task" in section and "seed 0, bf16-mixed" in section
    assert "plants item clusters, which MIDX exploits" in section
    assert "time_to_quality.md](../recipes/gpu_time_to_quality/time_to_quality.md)" in section
    assert target(section, "GCIDE, equal wall clock: default sampled val ppl <= Cut").endswith(
        "25 vs 30: **met**"
    )
    assert target(section, "GCIDE: default sampled reaches").endswith(
        "reached at 5.0 s (final val ppl 25 vs 30): **met**"
    )
    assert target(section, "1M synthetic items").endswith("0.04 vs 0.03: **met**")

    write_ttq(dirs, default_ppl=45.0)
    section = gpu_section(report.build_report(dirs))
    assert target(section, "GCIDE, equal wall clock: default sampled val ppl <= mixed").endswith(
        "45 vs 40: **NOT met**"
    )


def test_gpu_md_and_the_speed_section_point_at_the_gpu_rows(dirs):
    write_csv(
        dirs.benchmarks / "head_step.csv",
        [
            {
                "num_classes": 100,
                "method": "plain_cross_entropy",
                "sparse_grad": False,
                "device": "cpu",
                "median_s": 1.0,
                "time_vs_plain": 1.0,
                "peak_mib": 10.0,
                "status": "ok",
                "machine": "cpu",
                "torch": "2.13.0",
                "commit": "c0ffee1",
            }
        ],
    )
    text, _ = run_main(dirs)
    speed = re.search(r"^## 1\..*?(?=^## )", text, re.M | re.S).group(0)
    assert (
        f"Not measured yet: the exact heads' table on a GPU (section 9). Command: `{COMMAND}`"
        in speed
    )

    write_heads(dirs)
    write_csv(dirs.benchmarks / "gpu_step.csv", step_rows())
    (dirs.benchmarks / "test_gpu.txt").write_text(TESTS_PASSED)
    text, gpu_md = run_main(dirs)
    speed = re.search(r"^## 1\..*?(?=^## )", text, re.M | re.S).group(0)
    assert "table on a GPU (section 9)" not in speed
    assert "On a GPU (NVIDIA Test GPU): " in speed and "[gpu.md](gpu.md)" in speed
    assert "- GPU: NVIDIA Test GPU; driver 123.45" in gpu_md
    assert "- torch 2.11.0; Triton 9.9.9" in gpu_md
    assert "issue 28, shape A: abc1234" in gpu_md and "issue 29: def5678" in gpu_md
    assert "make test-gpu: abc1234" in gpu_md
    assert "Not measured yet: time to quality on a GPU" in gpu_md
    for heading in ("## Issue 28", "## Issue 29"):
        assert heading in gpu_md
    assert gpu_md.count("**met**") + gpu_md.count("**NOT met**") >= 10
    # the GPU files are not listed again under "Other measurements"
    (dirs.benchmarks / "gpu_step.md").write_text("x")
    text, _ = run_main(dirs)
    assert "## Other measurements" not in text
    assert "[gpu.md](gpu.md)" in gpu_section(text)
