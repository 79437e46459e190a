"""``recipes.compare``: several heads on one recipe, the table it writes, and clear errors."""

import csv
import json

import pytest

from recipes.compare import CONFIGS, cli_main, compare, max_time_arg
from recipes.tables import markdown_table

SLICE = [
    "--data.init_args.max_users=40",
    "--data.init_args.max_len=20",
    "--trainer.limit_train_batches=2",
    "--trainer.enable_progress_bar=false",
]


def test_compare_writes_one_row_per_head_with_the_ratio_split(tmp_path):
    extra = [*SLICE, "--data.init_args.split=ratio"]
    out = tmp_path / "table"
    rows = compare(CONFIGS / "sasrec_ml-100k.yaml", ["full", "uniform"], 1, 0, extra, out)
    assert [r["head"] for r in rows] == ["full", "uniform"]
    for row in rows:
        assert row["epochs"] == 1 and row["seconds/epoch"] > 0
        assert 0 <= row["test/ndcg@10"] <= row["test/recall@10"] <= 1
        assert 0 <= row["best val/ndcg@10"] <= 1
        (epoch,) = row["validation"]  # one validation run, the sanity check not counted
        assert epoch["epoch"] == 0 and epoch["val/ndcg@10"] == row["best val/ndcg@10"]
    assert json.loads(out.with_suffix(".json").read_text()) == rows
    with out.with_suffix(".csv").open() as f:
        assert [r["head"] for r in csv.DictReader(f)] == ["full", "uniform"]
    table = out.with_suffix(".md").read_text()
    assert "| full | 1 |" in table and "test/recall@10" in table and "validation" not in table
    assert all(row["training"] == [] for row in rows)  # no head reports diagnostics
    assert out.with_suffix(".png").stat().st_size > 0
    for row in rows:  # what every run records
        assert row["steps"] == 2 and row["train positions"] > 0 and row["train s"] > 0
        assert row["positions/s"] == pytest.approx(row["train positions"] / row["train s"])
        assert row["refresh s"] == 0 and row["peak RSS MB"] > 50
        assert "up to 1 epochs, best checkpoint" in table


def test_cane_rows_record_the_candidate_coverage_of_each_training_epoch(tmp_path):
    out = tmp_path / "cane"
    (row,) = compare(CONFIGS / "sasrec_ml-100k.yaml", ["cane"], 2, 0, SLICE, out)
    assert [t["epoch"] for t in row["training"]] == [0, 1]
    for epoch in row["training"]:
        assert 0.0 <= epoch["sampler_diagnostics/head/coverage"] <= 1.0
    header = out.with_suffix(".md").read_text().splitlines()[2]
    assert "| training |" not in header and "sampler_diagnostics" not in header


def test_step_budget_evaluates_the_final_weights(tmp_path):
    extra = [*SLICE[:2], SLICE[3]]  # the whole epoch (more than 3 batches)
    out = tmp_path / "budget"
    (row,) = compare(
        CONFIGS / "sasrec_ml-100k.yaml", ["midx_rq"], None, 0, extra, out, max_steps=3, val_every=2
    )
    assert row["steps"] == 3
    # the validation at step 2, then the final weights' one after training
    assert [v["step"] for v in row["validation"]] == [2, 3]
    assert row["validation"][0]["positions"] < row["validation"][1]["positions"]
    assert row["val/ndcg@10"] == row["validation"][-1]["val/ndcg@10"]
    assert 0 <= row["test/ndcg@10"] <= 1 and not any(k.startswith("best") for k in row)
    assert row["refresh s"] > 0 and row["train s"] > row["refresh s"]
    assert (
        "budget 3 steps, validation every 2 steps, final weights"
        in out.with_suffix(".md").read_text()
    )
    assert out.with_suffix(".png").stat().st_size > 0


def test_step_budget_ending_before_the_first_validation_is_not_an_error():
    # the config's EarlyStopping monitors val/ndcg@10 at every epoch's end, and the epoch is cut
    # by the budget before any validation ran
    extra = [*SLICE[:2], SLICE[3]]
    (row,) = compare(CONFIGS / "sasrec_ml-100k.yaml", ["uniform"], None, 0, extra, max_steps=2)
    assert row["steps"] == 2 and [v["step"] for v in row["validation"]] == [2]
    assert "val/ndcg@10" in row and "test/ndcg@10" in row


def test_time_budget_stops_training(tmp_path):
    extra = [*SLICE[:2], SLICE[3]]
    (row,) = compare(CONFIGS / "sasrec_ml-100k.yaml", ["uniform"], None, 0, extra, max_time=0.02)
    assert row["steps"] > 0 and row["train s"] < 30
    assert "val/ndcg@10" in row and "test/ndcg@10" in row


def test_max_time_is_lightning_duration():
    assert max_time_arg(10) == "00:00:10:00"
    assert max_time_arg(0.5) == "00:00:00:30"
    assert max_time_arg(1501) == "01:01:01:00"


def test_markdown_keeps_columns_in_first_seen_order():
    table = markdown_table([{"head": "a", "x": 0.123456}, {"head": "b", "y": 2}])
    assert table.splitlines() == [
        "| head | x | y |",
        "|---|---|---|",
        "| a | 0.1235 |  |",
        "| b |  | 2 |",
    ]


def test_unknown_head_fails_before_training(capsys):
    with pytest.raises(SystemExit, match="no head config .*nope.yaml; known heads: .*full"):
        cli_main(["--config", str(CONFIGS / "sasrec_ml-100k.yaml"), "--heads", "full", "nope"])
    base = ["--config", str(CONFIGS / "sasrec_ml-100k.yaml"), "--heads", "full"]
    with pytest.raises(SystemExit, match="--epochs must be >= 1"):
        cli_main([*base, "--epochs", "0"])
    with pytest.raises(SystemExit, match="--max-steps must be >= 1, got 0"):
        cli_main([*base, "--max-steps", "0"])
    with pytest.raises(SystemExit, match="--max-time must be > 0 minutes"):
        cli_main([*base, "--max-time", "0"])
