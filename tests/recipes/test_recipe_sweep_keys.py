"""Sweeps over any LightningCLI option by its dotted key: each trial's value reaches the config
the CLI resolves (checked with ``--print_config``, nothing fitted), and a key that is no option of
a trial's configs refuses the sweep, named, before any trial fits."""

import sys
from pathlib import Path

import pytest
import yaml

import recipes.sweep
from recipes.cli import main
from recipes.sweep import cli, cli_value, plan, run_sweep, trial_args

HEAD = "model.init_args.head.init_args"


def write_sweep(tmp_path: Path, **parameters) -> Path:
    """A grid sweep file over ``base``: SASRec on ml-100k, ``head`` and ``parameters``."""
    sweep = {
        "method": "grid",
        "metric": {"name": "val/ndcg@10", "goal": "maximize"},
        "parameters": {"base": {"value": "sasrec_ml-100k"}, **parameters},
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    return path


def test_dotted_keys_reach_each_trials_resolved_config(tmp_path):
    path = write_sweep(
        tmp_path,
        head={"values": ["uniform", "midx_rq"]},
        num_negatives={"value": 20},  # a short name beside them, as before
        **{
            f"{HEAD}.convention": {"values": ["corrected_all", "exact_positive"]},
            f"{HEAD}.temperature": {"values": [0.05, 0.1]},
            "model.init_args.weight_decay": {"value": 0.01},
            "trainer.gradient_clip_val": {"value": 0.5},
        },
    )
    _, trials, configs = plan(path, extra=["--data.init_args.max_users=20"])
    assert len(trials) == len(configs) == 2 * 2 * 2
    swept = set()
    for params, config in zip(trials, configs, strict=True):
        model = config["model"]["init_args"]
        head = model["head"]["init_args"]
        assert head["convention"] == params[f"{HEAD}.convention"]
        assert head["temperature"] == params[f"{HEAD}.temperature"]
        assert head["num_negatives"] == 20 and model["weight_decay"] == 0.01
        assert config["trainer"]["gradient_clip_val"] == 0.5
        assert (
            model["sampler"]["class_path"].rsplit(".", 1)[1]
            == {
                "uniform": "UniformSampler",
                "midx_rq": "MIDXSampler",
            }[params["head"]]
        )  # the head config is still applied under the overrides
        assert config["data"]["init_args"]["max_users"] == 20  # and the extra arguments
        swept.add((params["head"], head["convention"], head["temperature"]))
    assert len(swept) == 8


def test_trial_args_pass_a_dotted_key_as_key_equals_value():
    params = {"base": "sasrec_ml-100k", "head": "uniform", "lr": 0.01}
    params |= {f"{HEAD}.temperature": 0.05, f"{HEAD}.convention": "corrected_all"}
    args = trial_args(params)
    assert args[2:] == [
        "--model.init_args.lr=0.01",
        f"--{HEAD}.temperature=0.05",
        f"--{HEAD}.convention=corrected_all",
    ]
    head = main([*args, "--data.init_args.max_users=20"], run=False).model.head
    assert head.temperature == 0.05 and head.convention == "corrected_all"


def test_values_are_written_as_the_cli_reads_them(tmp_path):
    assert [cli_value(v) for v in ("a b", 3, 1e-05, True, None, [5, 10])] == [
        "a b",
        "3",
        "1e-05",
        "true",
        "null",
        "[5, 10]",
    ]
    # a list value: trials compare as JSON (a list is unhashable) and resolve to the list
    path = write_sweep(
        tmp_path,
        head={"value": "full"},
        seed_everything={"value": 3},  # a top-level option has no dot
        **{"model.init_args.top_k": {"values": [[5, 10], [10], [5, 10]]}},
    )
    _, trials, configs = plan(path)
    assert len(trials) == 2
    assert [c["model"]["init_args"]["top_k"] for c in configs] == [[5, 10], [10]]
    assert [c["seed_everything"] for c in configs] == [3, 3]


@pytest.fixture
def no_fit(monkeypatch):
    """Fails the test if any trial starts fitting."""

    def fit_trial(*args, **kwargs):
        raise AssertionError("a trial fitted before the sweep was checked")

    monkeypatch.setattr(recipes.sweep, "fit_trial", fit_trial)


def test_a_misspelled_key_is_refused_by_name_before_any_trial_fits(tmp_path, no_fit):
    path = write_sweep(
        tmp_path,
        head={"values": ["full", "uniform"]},
        **{f"{HEAD}.temperatur": {"values": [0.05, 0.1]}},
    )
    with pytest.raises(ValueError) as refused:
        run_sweep(path, tmp_path / "out")
    assert str(refused.value) == (
        f"unknown sweep parameter '{HEAD}.temperatur': no option of base 'sasrec_ml-100k' with"
        f" head 'full'; did you mean '{HEAD}.temperature'?"
    )
    assert not (tmp_path / "out").exists()


def test_a_short_key_is_pointed_to_its_dotted_option(tmp_path, no_fit):
    path = write_sweep(tmp_path, head={"value": "uniform"}, dropout={"value": 0.1})
    with pytest.raises(ValueError, match="'dropout'.*did you mean 'model.init_args.dropout'"):
        run_sweep(path, tmp_path / "out")


def test_a_key_one_trials_head_does_not_take_is_refused(tmp_path, no_fit):
    """A dotted key is never left out of a trial (unlike ``num_negatives``): the full softmax
    has no ``convention``."""
    path = write_sweep(
        tmp_path,
        head={"values": ["uniform", "full"]},
        **{f"{HEAD}.convention": {"value": "corrected_all"}},
    )
    with pytest.raises(ValueError, match=f"'{HEAD}.convention': no option of .* head 'full'$"):
        run_sweep(path, tmp_path / "out")


def test_a_value_the_parser_refuses_names_its_parameter(tmp_path, no_fit):
    path = write_sweep(
        tmp_path, head={"value": "uniform"}, **{"trainer.max_epochs": {"value": "many"}}
    )
    with pytest.raises(ValueError, match="parameter 'trainer.max_epochs' = 'many' is refused"):
        run_sweep(path, tmp_path / "out")


def test_the_command_line_dry_run_prints_and_refuses(tmp_path, monkeypatch, capsys, no_fit):
    path = write_sweep(
        tmp_path, head={"value": "uniform"}, **{f"{HEAD}.temperature": {"values": [0.05, 0.1]}}
    )
    argv = ["recipes.sweep", "run", str(path), "--dry-run", "--data.init_args.max_users=20"]
    monkeypatch.setattr(sys, "argv", argv)
    cli()
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["trial_0:", "trial_1:"]
    for line, value in zip(lines, ("0.05", "0.1"), strict=True):
        assert line.endswith(f"--{HEAD}.temperature={value} --data.init_args.max_users=20")
    path.write_text(path.read_text().replace(".temperature:", ".temperatur:"))
    with pytest.raises(SystemExit, match=f"^error: unknown sweep parameter '{HEAD}.temperatur'"):
        cli()


def test_the_wandb_trial_refuses_a_short_name_and_its_key_together(monkeypatch):
    argv = ["recipes.sweep", "trial", "--base=sasrec_ml-100k", "--head=full", "--lr=0.1"]
    monkeypatch.setattr(sys, "argv", [*argv, "--model.init_args.lr=0.2"])
    with pytest.raises(SystemExit, match="'lr' and 'model.init_args.lr' set the same option"):
        cli()


def test_a_missing_config_file_is_refused_by_its_parameter(tmp_path, no_fit):
    path = write_sweep(tmp_path, head={"values": ["uniform", "ful"]})
    with pytest.raises(ValueError, match="sweep parameter 'head' = 'ful': no file .*ful.yaml"):
        run_sweep(path, tmp_path / "out")
