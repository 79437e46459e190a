"""``recipes.compare``: several heads on one recipe, the table it writes, and clear errors."""

import csv
import json

import pytest

from recipes.compare import CONFIGS, cli_main, compare
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
    assert out.with_suffix(".png").stat().st_size > 0


def test_markdown_keeps_columns_in_first_seen_order():
    table = markdown_table([{"head": "a", "x": 0.123456}, {"head": "b", "y": 2}])
    assert table.splitlines() == [
        "| head | x | y |",
        "|---|---|---|",
        "| a | 0.1235 |  |",
        "| b |  | 2 |",
    ]


def test_unknown_head_fails_before_training(capsys):
    with pytest.raises(SystemExit, match="no head config .*nope.yaml; known heads: full"):
        cli_main(["--config", str(CONFIGS / "sasrec_ml-100k.yaml"), "--heads", "full", "nope"])
    with pytest.raises(SystemExit, match="--epochs must be >= 1"):
        cli_main(
            ["--config", str(CONFIGS / "sasrec_ml-100k.yaml"), "--heads", "full", "--epochs", "0"]
        )
