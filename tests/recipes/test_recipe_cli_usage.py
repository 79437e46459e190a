"""The recipes' command line as a user meets it: a step budget shorter than an epoch, a
``fast_dev_run``, the subcommands it offers, abbreviated options and the length of a parse
error."""

from pathlib import Path

import pytest

from recipes.cli import cli_main, main

CONFIGS = Path(__file__).parents[2] / "recipes" / "configs"
#: SASRec on a slice of MovieLens-100k whose epoch is longer than two steps
SMALL = [
    f"--config={CONFIGS / 'sasrec_ml-100k.yaml'}",
    "--data.init_args.max_users=40",
    "--data.init_args.max_len=20",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
]


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path, monkeypatch):
    """Every test runs in ``tmp_path``: the configs' CSV logger writes to ``./logs`` (and a
    command line that should fail but runs trains there)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_step_budget_that_ends_before_the_first_validation_fits(in_tmp_path):
    """``EarlyStopping`` checks after each validation (``check_on_train_epoch_end: false``), not
    at the end of an epoch that ``max_steps`` cut before its validation ran (a RuntimeError:
    ``val/ndcg@10`` not available)."""
    cli = main([*SMALL, "--trainer.max_steps=2"], run=False)
    cli.trainer.fit(cli.model, cli.datamodule)
    assert cli.trainer.global_step == 2 and cli.trainer.num_training_batches > 2
    assert "val/ndcg@10" not in cli.trainer.callback_metrics  # no validation ran
    assert list(in_tmp_path.rglob("last.ckpt"))  # the last state is still saved


def test_fast_dev_run_writes_no_checkpoint(in_tmp_path):
    cli_main(["fit", *SMALL, "--trainer.fast_dev_run=2"])
    assert not list(in_tmp_path.rglob("*.ckpt"))


def test_predict_is_not_offered(capsys):
    """The recipes' modules have no ``predict_step``: ``predict`` failed after building
    everything ("`Trainer.predict` requires `forward` method to run")."""
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["predict", *SMALL])
    assert exit_info.value.code == 2
    assert "invalid choice: 'predict' (choose from 'fit', 'validate', 'test')" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize("option", [["--trainer.max_epoch=2"], ["--trainer.max_epoch", "2"]])
def test_an_abbreviated_option_is_an_error(option, capsys):
    """argparse's prefix matching took ``--trainer.max_epoch 2`` for ``--trainer.max_epochs``."""
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["fit", *SMALL, *option])
    assert exit_info.value.code == 2
    assert f"error: unrecognized arguments: {' '.join(option)}" in capsys.readouterr().err


def test_a_parse_error_is_three_lines_ending_with_the_error(capsys):
    """Not the 50-line usage first: a one-line usage, where ``--help`` is, and the error."""
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["fit", *SMALL, "--trainer.max_epochz=2"])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [
        "usage: python -m recipes [options] fit [options]",
        "tip: For details of accepted options run: python -m recipes fit --help",
        "error: unrecognized arguments: --trainer.max_epochz=2",
    ]
