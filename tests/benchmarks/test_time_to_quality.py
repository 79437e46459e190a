"""benchmarks.time_to_quality: its data layout equals the recipes', its targets say met / NOT met
/ not measured as the numbers say, and the whole script runs on tiny data in a process where
Hugging Face ``datasets`` (and the other packages the GPU machine lacks) cannot be imported."""

import csv
import math
from types import SimpleNamespace

import pytest
import torch
from gpu_machine import run_main_as_on_the_gpu_machine

from benchmarks import time_to_quality as ttq
from recipes.data.movielens import MovieLens, leave_one_out, training_windows
from recipes.data.ptb import batchify
from recipes.data.synthetic import SyntheticSpec, generate

SPEC = SyntheticSpec(num_items=2000, num_users=48, seq_len=12, num_clusters=10, seed=1)


def test_windows_are_the_recipes_batchify():
    stream = torch.arange(1000)
    ours = ttq.windows(stream, 7, 35, full_only=False)
    theirs = batchify(stream, 7, 35)
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a["input"], b["input"]) and torch.equal(a["target"], b["target"])
    full = ttq.windows(stream, 7, 35, full_only=True)
    assert len(full) == len(theirs) - 1  # 141 columns: 4 full windows and a short one
    assert all(w["input"].shape == (7, 35) for w in full)


def test_leave_one_out_is_the_recipes_split_and_batches():
    sequences, _ = generate(SPEC)
    ours = ttq.leave_one_out(torch.from_numpy(sequences), max_len=10)
    theirs = leave_one_out(sequences.tolist(), SPEC.num_items)
    inputs, targets = training_windows(theirs["train"]["items"], 10)
    assert torch.equal(ours["train"]["input"], inputs)
    assert torch.equal(ours["train"]["target"], targets)
    collate = SimpleNamespace(max_len=10, exclude_seen=True)
    for split in ("validation", "test"):
        batch = MovieLens.collate_eval(collate, list(theirs[split]))
        for key in ("history", "target", "exclude"):
            assert torch.equal(ours[split][key], batch[key]), (split, key)


def finals(**vals: float) -> list[dict]:
    """``ok`` final rows ``{task, method, val}`` from ``task__method=val`` keywords."""
    rows = []
    for key, val in vals.items():
        task, method = key.split("__")
        rows.append({"task": task, "method": method, "status": "ok", "val": val})
    return rows


def curve(method: str, points: list[tuple[float, float]]) -> list[dict]:
    return [{"task": "gcide", "method": method, "wall_s": t, "value": v} for t, v in points]


def test_targets_met_not_met_and_not_measured():
    rows = finals(
        gcide__default=90.0, gcide__cut_cross_entropy=100.0, gcide__mixed=80.0,
        sasrec__default=0.2, sasrec__cut_cross_entropy=0.1,
    )  # fmt: skip
    curves = curve("cut_cross_entropy", [(0, 900), (10, 100)]) + curve(
        "default", [(0, 900), (4, 120), (5, 99), (10, 90)]
    )
    lines = ttq.targets(rows, curves, budget_s=10)
    assert [line.split(":")[0] for line in lines] == ["- met", "- NOT met", "- met", "- met"]
    assert "reached at 5.0 s" in lines[2] and "plants item clusters" in lines[3]
    late = curve("cut_cross_entropy", [(0, 900), (10, 100)]) + curve("default", [(6, 99)])
    assert ttq.targets(rows, late, budget_s=10)[2].startswith("- NOT met")  # 6 s > 0.5 x 10 s
    assert "reached never" in ttq.targets(rows, curves[:2], budget_s=10)[2]
    rows[1]["status"] = "skipped: needs CUDA"
    lines = ttq.targets(rows, curves, budget_s=10)
    assert [line.split(":")[0] for line in lines] == [
        "- not measured", "- NOT met", "- not measured", "- met"
    ]  # fmt: skip


def test_script_runs_end_to_end_without_the_packages_the_gpu_lacks(tmp_path):
    sequences, _ = generate(SPEC)
    generator = torch.Generator().manual_seed(0)
    streams = {
        split: torch.randint(300, (size,), generator=generator)
        for split, size in (("train", 3000), ("validation", 400), ("test", 400))
    }
    info = ttq.prepare(tmp_path / "data", streams, 300, torch.from_numpy(sequences), vars(SPEC))
    assert info["tokens"] == {"train": 3000, "validation": 400, "test": 400}
    out = tmp_path / "out"
    argv = ["--data", str(tmp_path / "data"), "--out", str(out), "--device", "cpu", "--tiny"]
    argv += ["--budget-s", "0.2", "--points", "1", "--warmup-steps", "1", "--commit", "abc1234"]
    done = run_main_as_on_the_gpu_machine("benchmarks.time_to_quality", argv)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == [
        "curves.csv", "final.csv", "time_to_quality.md", "time_to_quality.png"
    ]  # fmt: skip
    with (out / "final.csv").open() as f:
        rows = {(r["task"], r["method"]): r for r in csv.DictReader(f)}
    assert set(rows) == {(t, m) for t in ttq.TASKS for m in ttq.METHODS}
    for (task, method), row in rows.items():
        assert row["commit"] == "abc1234"
        if method == "cut_cross_entropy":
            assert row["status"] == "skipped: needs CUDA"
            continue
        assert row["status"] == "ok", row
        assert int(row["steps"]) >= 1 and float(row["train_s"]) >= 0.2
        for key in ("val", "test"):
            assert math.isfinite(float(row[key])), row
        if task == "gcide":
            assert 1 < float(row["val"]) < 3 * 300  # a perplexity over 300 words
        else:
            assert 0 <= float(row["val"]) <= 1  # an NDCG
    with (out / "curves.csv").open() as f:
        points = list(csv.DictReader(f))
    assert {"task", "method", "metric", "wall_s", "step", "value"} <= set(points[0])
    for task in ttq.TASKS:
        default = [p for p in points if (p["task"], p["method"]) == (task, "default")]
        assert [float(p["wall_s"]) for p in default][0] == 0.0  # before the first step
        assert len(default) == 2 and float(default[1]["wall_s"]) >= 0.2  # --points 1: the end
        assert all(math.isfinite(float(p["value"])) for p in default)
    summary = (out / "time_to_quality.md").read_text()
    assert "### Targets" in summary and "commit: abc1234" in summary
    lines = summary.split("### Targets")[1].strip().splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "- not measured", "- met" if default_beats_mixed(rows) else "- NOT met",
        "- not measured", "- not measured",
    ]  # fmt: skip
    assert all("(Cut Cross-Entropy: did not run)" in lines[i] for i in (0, 2, 3))
    assert "CPU dry run" in summary and "SampledSoftmaxHead(" in summary


def default_beats_mixed(rows: dict) -> bool:
    return float(rows["gcide", "default"]["val"]) <= float(rows["gcide", "mixed"]["val"])


@pytest.mark.parametrize("bad", [["--budget-s", "0"], ["--points", "0"], []])
def test_bad_arguments_stop_with_a_message(bad, tmp_path):
    argv = ["--data", str(tmp_path), "--out", str(tmp_path)] if bad else []
    with pytest.raises(SystemExit):
        ttq.parse_args(argv + bad)
