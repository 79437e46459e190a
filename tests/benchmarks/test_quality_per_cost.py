"""``benchmarks/quality_per_cost.py``: the report generated from tiny fake CSVs (curves, runs,
step costs, load), time to a perplexity from marks and step costs, and its options (the
measurement itself trains real models and is not run here)."""

from __future__ import annotations

import csv
import json

import pytest

from benchmarks.quality_per_cost import (
    EPOCH_STEPS,
    LABELS,
    RUNS,
    collect,
    parse_args,
    reach_s,
    report,
)

STAMP = {"machine": "cpu x2", "torch": "2.13", "driver": "none", "commit": "abc1234"}


def write(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def curve(name, values, candidates, seed=0):
    run = RUNS[name]
    return [
        {
            "task": "gcide",
            "configuration": run.convention,
            "proposal": run.cell,
            "seed": seed,
            "step": 1000 * (i + 1),
            "val": v,
            "metric": "ppl",
            "wall_s": 500.0 * (i + 1),
            "candidates": candidates,
            "distinct_targets": 381.6,
            **STAMP,
        }
        for i, v in enumerate(values)
    ]


def cost(name, step_s, refresh_s=0.0, schedule=None):
    return {
        "name": name,
        "candidates": 21.0,
        "median_step_s": step_s,
        "min_step_s": step_s * 0.9,
        "max_step_s": step_s * 1.1,
        "steps_timed": 15,
        "rounds": 5,
        "refresh_s": refresh_s,
        "schedule": json.dumps(schedule),
        "load_start": "1.00 1.00 1.00",
        "load_end": "1.10 1.00 1.00",
        **STAMP,
    }


@pytest.fixture
def results(tmp_path):
    out = tmp_path / "quality_per_cost"
    write(out / "curves" / "default_uniform.csv", curve("default_uniform", [50, 35, 29], 401.6))
    write(out / "curves" / "plain_uniform.csv", curve("plain_uniform", [200, 90], 21.0))
    schedule = {"every_n_epochs": 1, "every_n_train_steps": None, "doubling_steps": 50}
    write(
        out / "step_cost.csv",
        [cost("default_uniform", 0.4), cost("plain_uniform", 0.2, 2.0, schedule)],
    )
    write(
        out / "runs.csv",
        [{"name": "default_uniform", "test": 33.3, "status": "ok"}],
    )
    write(
        out / "load_during_runs.csv",
        [{"utc": "t0", "load1": 2.0, "load5": 2, "load15": 2}, {"utc": "t1", "load1": 4.0}],
    )
    grid = tmp_path / "grid.csv"
    write(
        grid,
        [
            {
                "task": "gcide",
                "seed": "0",
                "status": "ok",
                "cell": "uniform, per query",
                "convention": "corrected_all+batch",
                "val_by_epoch": "[44.7, 27.6]",
            }
        ],
    )
    return out, grid


def test_the_report_tabulates_every_mark_cost_and_time_to_a_perplexity(results):
    out, grid = results
    path = report(out, out.parent / "quality_per_cost.md", grid)
    text = path.read_text()
    default, plain = LABELS["default_uniform"], LABELS["plain_uniform"]
    assert "| configuration | seeds | candidates / position | 1,000 | 2,000 | 3,000 |" in text
    assert f"| {default} | 0 | 401.6 | 50.00 | 35.00 | 29.00 | 3,000 | 33.30 | 27.60 |" in text
    assert f"| {plain} | 0 | 21.0 | 200.00 | 90.00 | — | 2,000 | — (run not finished) | — |" in text
    # time to ppl <= 30: the default reaches it at step 3,000: 3,000 x 0.4 s = 20 min
    assert "20.0 min (3,000 steps)" in text
    # load, provenance and the limits are stated
    assert "median 3.00, range 2.00-4.00" in text
    assert "commit: runs abc1234; step costs abc1234" in text
    assert "## What this does not show yet" in text and "fewer than 3 seeds" in text
    assert (out / "gcide_val_ppl.png").stat().st_size > 0


def test_further_seeds_are_averaged_and_the_seed_rule_is_checked(results):
    """``<name>.s<k>.csv`` is seed ``k`` of the same configuration: the marks are the mean
    over the seeds, ± their standard deviation, and a configuration within 5% of the best at
    the last shared mark needs 3 seeds."""
    out, grid = results
    curves = out / "curves"
    write(curves / "default_uniform.s1.csv", curve("default_uniform", [52, 37], 401.6, seed=1))
    write(curves / "exact_positive_batch.csv", curve("exact_positive_batch", [51, 36], 401.6))
    text = report(out, out.parent / "quality_per_cost.md", grid).read_text()
    default = LABELS["default_uniform"]
    # step 1,000: mean of 50 and 52, sd sqrt(2); step 3,000: seed 0 alone
    assert f"| {default} | 0, 1 | 401.6 | 51.00 ± 1.41 | 36.00 ± 1.41 | 29.00 | 3,000 |" in text
    # the last mark two configurations share is 2,000: the default's mean 36.0 is the best,
    # exact_positive + in-batch 36.0 too (0.0%), plain far behind (not listed)
    assert f"- step 2,000: {default} is 0.0% above the best mean (36.00 vs 36.00): 2 of 3 " in text
    exact = LABELS["exact_positive_batch"]
    assert f"- step 2,000: {exact} is 0.0% above the best mean (36.00 vs 36.00): 1 of 3" in text
    assert "NOT met" in text and LABELS["plain_uniform"] + " is" not in text
    # 3 seeds meet the rule
    write(curves / "default_uniform.s2.csv", curve("default_uniform", [51, 35], 401.6, seed=2))
    text = report(out, out.parent / "quality_per_cost.md", grid).read_text()
    assert "(35.67 vs 35.67): 3 of 3 seeds: met" in text  # (35 + 37 + 35) / 3


def test_time_to_a_perplexity_counts_the_index_refreshes_before_the_mark():
    marks = [{"step": 1000, "value": 80.0}, {"step": 2000, "value": 40.0}]
    schedule = {"every_n_epochs": 1, "every_n_train_steps": None, "doubling_steps": 50}
    midx = {"median_step_s": 0.5, "refresh_s": 3.0, "schedule": json.dumps(schedule)}
    # refreshes before step 2,000: at 0, 50, 100, 200, 400, 800 and 1,600
    assert reach_s(marks, 50.0, midx) == (2000, 2000 * 0.5 + 7 * 3.0)
    assert reach_s(marks, 30.0, midx) is None  # not reached
    assert reach_s(marks, 90.0, None) is None  # no step cost measured
    assert EPOCH_STEPS == 8581


def test_collect_names_each_run_after_its_folder(tmp_path):
    folder = tmp_path / "batch_only"
    write(
        folder / "estimator_grid.csv",
        [{"task": "gcide", "convention": "batch_only", "test": 30.0, "status": "ok"}],
    )
    rows = collect([folder], tmp_path / "out")
    assert rows[0]["name"] == "batch_only"
    assert (tmp_path / "out" / "runs.csv").read_text().startswith("name,task,")


def test_measure_needs_data_and_every_run_is_a_gcide_seed_0_run():
    with pytest.raises(SystemExit):
        parse_args(["--measure"])
    assert parse_args(["--measure", "--data", "d"]).names == list(RUNS)
    assert all(r.task == "gcide" and r.seed == 0 for r in RUNS.values())
    assert set(LABELS) == set(RUNS)
