"""The W&B logger config, offline: the metrics tables and the sampler diagnostics plot reach the
run's files."""

import json

import pytest
import wandb

from recipes.cli import main
from recipes.compare import CONFIGS


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.chdir(tmp_path)  # the logger configs write under ./logs
    yield tmp_path
    wandb.finish()


def test_wandb_run_gets_metrics_tables_and_diagnostics_images(in_tmp):
    cli = main(
        [
            f"--config={CONFIGS / 'gru4rec_ml-100k.yaml'}",
            f"--config={CONFIGS / 'heads' / 'midx_rq.yaml'}",
            f"--config={CONFIGS / 'loggers' / 'wandb.yaml'}",
            f"--config={CONFIGS / 'diagnostics.yaml'}",
            "--data.init_args.max_users=40",
            "--data.init_args.max_len=20",
            "--trainer.max_epochs=2",
            "--trainer.limit_train_batches=1",
            "--trainer.enable_progress_bar=false",
        ],
        run=False,
    )
    cli.trainer.fit(cli.model, cli.datamodule)
    cli.trainer.test(cli.model, cli.datamodule, verbose=False)
    (run_dir,) = (in_tmp / "logs" / "wandb").glob("offline-run-*")
    media = run_dir / "files" / "media"
    tables = {}
    for path in (media / "table").rglob("*.table.json"):
        tables.setdefault(path.parent.name, []).append(json.loads(path.read_text()))
    val = max(tables["val"], key=lambda t: len(t["data"]))
    metrics = ["average_popularity", "gini_index", "item_coverage", "ndcg", "recall"]
    assert val["columns"] == ["epoch", "step", *(f"val/{m}@10" for m in metrics)]
    assert [row[0] for row in val["data"]] == [0, 1]  # one row per validation run, no sanity check
    (test,) = tables["test"]
    assert test["columns"] == ["epoch", "step", *(f"test/{m}@10" for m in metrics)]
    ndcg = test["columns"].index("test/ndcg@10")
    assert test["data"][0][ndcg] == pytest.approx(
        float(cli.trainer.callback_metrics["test/ndcg@10"])
    )
    assert list((media / "images").rglob("*.png"))  # the diagnostics plot, one per epoch
