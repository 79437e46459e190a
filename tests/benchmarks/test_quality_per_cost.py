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
    POPULARITY_NDCG,
    RUNS,
    SASREC,
    TOWER,
    collect,
    curves_from_grid,
    mean_curve,
    parse_args,
    reach_s,
    report,
    separation_targets,
)

STAMP = {"machine": "cpu x2", "torch": "2.13", "driver": "none", "commit": "abc1234"}


def write(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def curve(name, values, candidates, seed=0, every=1000, task="gcide"):
    """Fake marks every ``every`` steps of configuration ``name`` of ``task``."""
    run = (RUNS if task == "gcide" else TOWER.runs)[name]
    return [
        {
            "task": task,
            "configuration": run.convention,
            "proposal": run.cell,
            "seed": seed,
            "step": every * (i + 1),
            "val": v,
            "metric": "ppl" if task == "gcide" else "ndcg@10",
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


def tower_curve(name, values, seed=0):
    return curve(name, values, 21.0, seed, every=195, task="tower1m")


def mean_of(name, *seeds):
    return mean_curve({str(k): points(tower_curve(name, v, k)) for k, v in enumerate(seeds)})


def points(rows):
    return [{**r, "step": r["step"], "value": r["val"], "seed": str(r["seed"])} for r in rows]


def test_separation_needs_twice_popularity_and_a_lead_of_five_seed_sds():
    uniform = mean_of("plain_uniform", [0.05, 0.070], [0.05, 0.072], [0.05, 0.071])  # sd 0.001
    far = mean_of("default_uniform", [0.06, 0.091], [0.06, 0.090], [0.06, 0.092])
    lines = separation_targets({"plain_uniform": uniform, "default_uniform": far})
    assert lines[0].endswith(
        f"has val NDCG@10 0.0910 against twice the popularity ranking's "
        f"{2 * POPULARITY_NDCG['val']:.4f}: met"
    )
    assert lines[1].endswith("by 0.0200 = 20.0 seed sds (sd 0.0010), against 5: met")
    near = mean_of("default_uniform", [0.06, 0.074], [0.06, 0.075], [0.06, 0.076])
    assert separation_targets({"plain_uniform": uniform, "default_uniform": near})[1].endswith(
        "by 0.0040 = 4.0 seed sds (sd 0.0010), against 5: NOT met"
    )
    low = mean_of("default_uniform", [0.03, 0.06])
    lines = separation_targets({"plain_uniform": mean_of("plain_uniform", [0.02, 0.05]), "d": low})
    assert lines[0].endswith("NOT met") and lines[1].endswith("one seed each")


def test_the_tower_task_has_its_own_section_where_higher_is_better(results):
    out, grid = results
    tower = out / TOWER.folder
    write(tower / "curves" / "plain_uniform.csv", tower_curve("plain_uniform", [0.03, 0.05]))
    write(tower / "curves" / "default_uniform.csv", tower_curve("default_uniform", [0.05, 0.09]))
    write(tower / "step_cost.csv", [cost("plain_uniform", 0.6), cost("default_uniform", 2.4)])
    write(tower / "runs.csv", [{"name": "default_uniform", "test": 0.1, "status": "ok"}])
    text = report(out, out.parent / "quality_per_cost.md", grid).read_text()
    section = text[text.index("## 1M items through a candidate tower") :]
    default = TOWER.labels["default_uniform"]
    assert f"| {default} | 0 | 21.0 | 0.0500 | 0.0900 | 390 | 0.1000 |" in section
    # NDCG@10 >= 0.08: the default's mark 390 x 2.4 s = 15.6 min; plain uniform never
    assert "| NDCG@10 >= 0.04 |" in section and "15.6 min (390 steps)" in section
    assert "is 0.0% below the best mean (0.0900 vs 0.0900)" in section
    assert (tower / TOWER.plot_name).stat().st_size > 0
    assert reach_s([{"step": 1, "value": 0.05}], 0.04, cost("x", 1.0), TOWER) == (1, 1.0)


def test_curves_from_the_grid_put_each_epoch_s_validation_at_its_step(tmp_path):
    """``--from-grid``: a grid row's ``val_by_epoch`` becomes marks at the steps that end its
    epochs, seed ``k`` in ``<name>.s<k>.csv``, its test in ``runs.csv``; rows of other tasks,
    cells or failed runs are left out."""
    import torch

    g = torch.Generator().manual_seed(0)
    windows = torch.randint(1, 50, (256, 6), generator=g, dtype=torch.int16)
    history = torch.randint(1, 50, (12,), dtype=torch.int16)
    data = {"num_classes": 50, "counts": torch.ones(50, dtype=torch.long)}
    data |= {"train_input": windows, "train_target": windows}
    for split in ("validation", "test"):
        data |= {f"{split}_history": history, f"{split}_lengths": torch.tensor([6, 6])}
        data |= {f"{split}_target": torch.tensor([3, 4])}
    torch.save(data, tmp_path / "ml-1m.pt")
    row = {"task": "sasrec", "method": "uniform", "seed": "0", "shared": "False"}
    row |= {"convention": "corrected_all", "cell": "uniform, per query", "metric": "ndcg@10"}
    row |= {"steps": "20", "val_by_epoch": "[0.02, 0.05]", "test": "0.06", "status": "ok", **STAMP}
    rows = [
        row,
        {**row, "seed": "1", "val_by_epoch": "[0.03, 0.07]", "test": "0.08"},
        {**row, "method": "full", "convention": "", "cell": "full"},
        {**row, "task": "gru4rec"},
        {**row, "cell": "uniform, shared by the batch"},
        {**row, "seed": "2", "status": "error: boom"},
    ]
    write(tmp_path / "grid.csv", rows)
    written = curves_from_grid(SASREC, str(tmp_path), tmp_path / "grid.csv", tmp_path / "out")
    assert sorted(p.name for p in written) == [
        "full.csv",
        "plain_uniform.csv",
        "plain_uniform.s1.csv",
    ]
    with (tmp_path / "out" / "sasrec" / "curves" / "plain_uniform.s1.csv").open() as f:
        marks = list(csv.DictReader(f))
    assert [(m["step"], float(m["val"])) for m in marks] == [("10", 0.03), ("20", 0.07)]
    assert marks[0]["candidates"] == "101.0" and marks[0]["commit"] == "abc1234"
    with (tmp_path / "out" / "sasrec" / "curves" / "full.csv").open() as f:
        assert next(csv.DictReader(f))["candidates"] == "49"  # every class but padding
    with (tmp_path / "out" / "sasrec" / "runs.csv").open() as f:
        tests = {r["name"]: r["test"] for r in csv.DictReader(f)}
    assert tests == {"plain_uniform": "0.06", "plain_uniform.s1": "0.08", "full": "0.06"}


def test_a_curve_file_may_hold_several_seeds(results):
    """One ``estimator_grid --seeds 0 1`` call writes both seeds' marks into one CSV."""
    out, grid = results
    both = curve("plain_uniform", [200, 90], 21.0) + curve("plain_uniform", [220, 94], 21.0, 1)
    write(out / "curves" / "plain_uniform.csv", both)
    # its runs.csv rows: one folder, both seeds named after it
    two = [{"name": "plain_uniform", "test": t, "status": "ok"} for t in (90.0, 94.0)]
    write(out / "runs.csv", two)
    text = report(out, out.parent / "quality_per_cost.md", grid).read_text()
    plain = LABELS["plain_uniform"]
    assert (
        f"| {plain} | 0, 1 | 21.0 | 210.00 ± 14.14 | 92.00 ± 2.83 | — | 2,000 | 92.00 ± 2.83 (2) |"
        in text
    )
    # seed 1 of plain uniform stopped at 2,000 of 8,581 steps: said per seed
    assert f"{plain} seed 0 step 2,000, {plain} seed 1 step 2,000; a configuration" in text


def test_separation_is_judged_where_every_seeded_configuration_has_all_its_seeds():
    """A seed cut short (seed 1 of the default stops at step 195) moves the judgement to the
    last mark it reached, not to seed 0's later marks."""
    uniform = mean_of("plain_uniform", [0.05, 0.070], [0.05, 0.072], [0.05, 0.071])
    longer = points(tower_curve("default_uniform", [0.060, 0.091, 0.095]))
    default = mean_curve({"0": longer, "1": points(tower_curve("default_uniform", [0.062], 1))})
    lines = separation_targets({"plain_uniform": uniform, "default_uniform": default})
    assert lines[0].startswith("- step 195: the best, ")
    assert "has val NDCG@10 0.0610" in lines[0] and lines[0].endswith("NOT met")  # < 0.063
    assert "by 0.0110 = 7.8 seed sds (sd 0.0014), against 5: met" in lines[1]
