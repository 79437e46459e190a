"""The offline sweep runner: expansion of W&B sweep files, trial arguments, a tiny run."""

import sys
from pathlib import Path

import pytest
import yaml

from recipes.cli import main
from recipes.sweep import expand, run_sweep, trial_args

SWEEPS = Path(__file__).parents[2] / "recipes" / "sweeps"


def test_grid_expands_every_combination():
    sweep = yaml.safe_load((SWEEPS / "sasrec_ml-100k.yaml").read_text())
    trials = expand(sweep)
    assert len(trials) == 3 * 2 * 2
    assert {(t["head"], t["num_negatives"], t["lr"]) for t in trials} == {
        (h, m, lr) for h in ("full", "uniform", "midx_rq") for m in (50, 200) for lr in (1e-3, 3e-3)
    }
    assert all(t["base"] == "sasrec_ml-100k" and t["codebook_size"] == 32 for t in trials)


def test_random_draws_count_trials_within_bounds():
    sweep = yaml.safe_load((SWEEPS / "lstm_ptb.yaml").read_text())
    trials = expand(sweep, count=20, seed=1)
    assert len(trials) == 20 and trials == expand(sweep, count=20, seed=1)
    assert all(50 <= t["num_negatives"] <= 400 and 5e-4 <= t["lr"] <= 5e-3 for t in trials)
    assert {t["codebook_size"] for t in trials} <= {16, 32, 64}


def test_bad_sweeps_are_clear():
    # whether a key is an option is the CLI's to say (test_recipe_sweep_keys.py); its form is not
    with pytest.raises(ValueError, match="\\['model init_args.dropout'\\] are not LightningCLI"):
        expand({"method": "grid", "parameters": {"model init_args.dropout": {"value": 0.1}}})
    with pytest.raises(ValueError, match="'lr' and 'model.init_args.lr' set the same option"):
        expand({"method": "grid", "parameters": {"lr": {"value": 0.1}, "model.init_args.lr": {}}})
    with pytest.raises(ValueError, match="grid sweeps need value or values"):
        expand({"method": "grid", "parameters": {"lr": {"min": 0.1, "max": 1.0}}})
    with pytest.raises(ValueError, match="method must be"):
        expand({"method": "bayes", "parameters": {}})


def test_trial_args_set_negatives_and_codebook_size():
    params = {"base": "sasrec_ml-100k", "head": "midx_rq", "num_negatives": 7, "codebook_size": 16}
    args = trial_args({**params, "lr": 0.01, "max_epochs": 2})
    assert args[1].endswith("heads/midx_rq.yaml")  # brings its IndexRefresh callback
    cli = main([*args, "--data.init_args.max_users=20"], run=False)
    assert cli.model.head.num_negatives == 7 and cli.model.head.sampler.codebook_size == 16
    assert cli.model.head.sampler.quantizer.name == "rq"  # the rest of the config is kept
    assert cli.model.lr == 0.01 and cli.trainer.max_epochs == 2
    full = trial_args({"base": "sasrec_ml-100k", "head": "full", "num_negatives": 7})
    assert not any("num_negatives" in a for a in full)  # the full softmax takes none
    assert type(main(full, run=False).model.head).__name__ == "FullSoftmaxHead"


def test_offline_run_writes_summary(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["recipes"])
    monkeypatch.setenv("LIGHTNING_SAMPLED_CACHE", str(tmp_path / "cache"))
    sweep = {
        "method": "grid",
        "metric": {"name": "val/ndcg@10", "goal": "maximize"},
        "parameters": {
            "base": {"value": "gru4rec_ml-100k"},
            "head": {"values": ["full", "uniform"]},
        },
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    extra = [
        "--data.init_args.max_users=20",
        "--trainer.fast_dev_run=1",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
    ]
    rows = run_sweep(path, tmp_path / "out", extra=extra)
    assert [r["head"] for r in rows] == ["full", "uniform"]
    assert (tmp_path / "out" / "trials.csv").read_text().count("\n") == 3
    assert (tmp_path / "out" / "trials.png").stat().st_size > 0
    assert "| trial | base | head | val/ndcg@10 |" in (tmp_path / "out" / "trials.md").read_text()
