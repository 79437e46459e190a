"""The offline sweep runner keeps every trial's logs under ``--out``, names each trial's run
directory in ``trials.csv`` and runs no grid point twice."""

import csv
from pathlib import Path

import pytest
import yaml

from recipes.sweep import applied_params, expand, run_sweep, trial_args, unique_trials

SWEEPS = Path(__file__).parents[2] / "recipes" / "sweeps"


def test_grid_points_that_come_out_the_same_run_once():
    sweep = yaml.safe_load((SWEEPS / "sasrec_ml-100k.yaml").read_text())
    trials = unique_trials(expand(sweep))
    # the full softmax takes no negatives and no codebook: 2 learning rates, not 2 x 2
    full = [t for t in trials if t["head"] == "full"]
    assert sorted(t["lr"] for t in full) == [1e-3, 3e-3]
    assert all("num_negatives" not in t and "codebook_size" not in t for t in full)
    # uniform takes negatives but no codebook; MIDX-rq takes both
    assert all("codebook_size" not in t for t in trials if t["head"] == "uniform")
    assert all(t["codebook_size"] == 32 for t in trials if t["head"] == "midx_rq")
    assert len(trials) == 2 + 4 + 4
    assert len({tuple(trial_args(t)) for t in trials}) == len(trials)
    # every trial of the expansion is one of them, with the same arguments
    assert {tuple(trial_args(t)) for t in expand(sweep)} == {tuple(trial_args(t)) for t in trials}


def test_applied_params_keep_what_the_head_takes():
    params = {"base": "lstm_ptb", "head": "unigram", "num_negatives": 9, "codebook_size": 16}
    assert applied_params(params) == {"base": "lstm_ptb", "head": "unigram", "num_negatives": 9}
    assert applied_params({**params, "head": "midx_pq"}) == {**params, "head": "midx_pq"}


@pytest.fixture
def tiny_sweep(tmp_path: Path) -> Path:
    sweep = {
        "method": "grid",
        "metric": {"name": "val/ndcg@10", "goal": "maximize"},
        "parameters": {
            "base": {"value": "sasrec_ml-100k"},
            "head": {"values": ["full", "uniform"]},
            "num_negatives": {"values": [5, 7]},
            "max_epochs": {"value": 1},
        },
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    return path


def test_offline_run_logs_under_out_with_run_dirs(tiny_sweep, tmp_path, monkeypatch):
    caller = tmp_path / "caller"
    caller.mkdir()
    monkeypatch.chdir(caller)
    extra = [
        "--data.init_args.max_users=20",
        "--data.init_args.max_len=20",
        "--trainer.limit_train_batches=1",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
    ]
    rows = run_sweep(tiny_sweep, Path("out"), extra=extra)  # a relative --out
    out = caller / "out"
    assert [(r["head"], r.get("num_negatives")) for r in rows] == [
        ("full", None),
        ("uniform", 5),
        ("uniform", 7),
    ]
    assert list(caller.iterdir()) == [out]  # nothing written beside it (no ./logs)
    assert Path.cwd() == caller
    with open(out / "trials.csv") as f:
        table = list(csv.DictReader(f))
    assert len(table) == 3
    for row in table:
        run = Path(row["run_dir"])
        assert run.is_absolute() and run.is_relative_to(out / f"trial_{row['trial']}")
        assert (run / "metrics.csv").stat().st_size > 0  # the CSVLogger's, in the trial
        assert (run / "config.yaml").exists()  # LightningCLI's saved config
        assert list((run / "checkpoints").glob("*.ckpt"))  # ModelCheckpoint's, beside them
    assert {r["num_negatives"] for r in table} == {"", "5", "7"}
    assert len({r["run_dir"] for r in table}) == 3


def test_offline_run_without_logger_keeps_checkpoints_in_the_trial(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sweep = {
        "method": "grid",
        "metric": {"name": "val/ndcg@10", "goal": "maximize"},
        "parameters": {"base": {"value": "sasrec_ml-100k"}, "head": {"value": "full"}},
    }
    Path("sweep.yaml").write_text(yaml.safe_dump(sweep))
    extra = [
        "--data.init_args.max_users=20",
        "--trainer.max_epochs=1",
        "--trainer.limit_train_batches=1",
        "--trainer.logger=false",
        "--trainer.enable_progress_bar=false",
    ]
    (row,) = run_sweep(Path("sweep.yaml"), Path("out"), extra=extra)
    trial = tmp_path / "out" / "trial_0"
    assert Path(row["run_dir"]) == trial
    checkpoints = [p.relative_to(tmp_path) for p in tmp_path.rglob("*.ckpt")]
    assert Path("out/trial_0/checkpoints/last.ckpt") in checkpoints
    assert {p.parent for p in checkpoints} == {Path("out/trial_0/checkpoints")}
