"""Heads and samplers by class_path in the CLI: printed, documented and checked at parse time."""

import importlib
from pathlib import Path

import pytest
import torch
import yaml

import recipes.module
from lightning_sampled.heads import OutputHead, SampledSoftmaxHead
from lightning_sampled.samplers import MIDXSampler, Sampler
from recipes.cli import main

CONFIGS = Path(__file__).parents[2] / "recipes" / "configs"
SMALL = ["--data.init_args.max_users=40", "--data.init_args.max_len=20"]
# What the model injects: never a config argument.
INJECTED = {"num_classes", "dim", "weight", "padding_idx", "counts"}
INJECTED |= {"sampler"}


def recipe(head: str) -> list[str]:
    return [
        f"--config={CONFIGS / 'sasrec_ml-100k.yaml'}",
        f"--config={CONFIGS / 'heads' / f'{head}.yaml'}",
        *SMALL,
    ]


def import_object(path: str) -> object:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def printed_config(args: list[str], capsys) -> dict:
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *args, "--print_config"])
    assert exit_info.value.code in (None, 0)
    return yaml.safe_load(capsys.readouterr().out)


def test_print_config_names_the_head_and_sampler_classes_with_their_init_args(capsys):
    model = printed_config(recipe("midx_rq"), capsys)["model"]["init_args"]
    head, sampler = model["head"], model["sampler"]
    assert head["class_path"] == "lightning_sampled.heads.SampledSoftmaxHead"
    assert import_object(head["class_path"]) is SampledSoftmaxHead
    assert head["init_args"]["num_negatives"] == 100  # from the head config
    assert head["init_args"]["convention"] == "corrected_all"  # the class's own default
    assert sampler["class_path"] == "lightning_sampled.samplers.MIDXSampler"
    assert import_object(sampler["class_path"]) is MIDXSampler
    assert sampler["init_args"]["codebook_size"] == 32 and sampler["init_args"]["quantizer"] == "rq"
    assert not INJECTED & (set(head["init_args"]) | set(sampler["init_args"]))


def test_every_head_config_builds_its_head_with_one_padding_idx():
    for path in sorted((CONFIGS / "heads").glob("*.yaml")):
        cli = main(recipe(path.stem), run=False)
        head = cli.model.head
        assert isinstance(head, OutputHead), path.name
        assert head.weight is cli.model.item_emb.weight and head.padding_idx == 0, path.name
        for sampler in (m for m in head.modules() if isinstance(m, Sampler)):
            assert sampler.padding_idx == 0 and sampler.num_classes == head.num_classes, path.name


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("--model.init_args.head.init_args.num_negativs=5", "num_negativs"),
        ("--model.init_args.sampler.init_args.codebok_size=8", "codebok_size"),
    ],
)
def test_a_misspelled_init_arg_fails_at_parse_time_naming_it(override, key, capsys, monkeypatch):
    def no_build(*args, **kwargs):
        raise AssertionError("the model was built: the error was not caught at parse time")

    monkeypatch.setattr(recipes.module, "build_head", no_build)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *recipe("midx_rq"), override])
    assert exit_info.value.code == 2
    assert f"'{key}' is not accepted" in capsys.readouterr().err


def test_a_misspelled_init_arg_of_a_mixture_component_in_a_config_file_names_it(tmp_path, capsys):
    config = (CONFIGS / "heads" / "sparse_midx_rq_log_uniform.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(config.replace("codebook_size: 32", "codebook_sise: 32"))
    with pytest.raises(SystemExit):
        main(["fit", f"--config={CONFIGS / 'sasrec_ml-100k.yaml'}", f"--config={bad}"])
    assert "'codebook_sise' is not accepted" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("option", "name", "documented", "hidden"),
    [
        ("--model.head.help", "SampledSoftmaxHead", ["num_negatives", "convention"], INJECTED),
        # jsonargparse 4.53 hides a protocol's parameters in the help of a non-optional factory
        # only: the optional sampler's help also lists the injected ones
        ("--model.sampler.help", "MIDXSampler", ["codebook_size", "quantizer"], set()),
    ],
)
def test_help_documents_head_and_sampler_arguments(option, name, documented, hidden, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--model=recipes.SASRec", option, name])
    assert exit_info.value.code in (None, 0)
    out = capsys.readouterr().out
    assert all(f".{arg} " in out for arg in documented), out
    assert not any(f".{arg} " in out for arg in hidden), out


def test_a_checkpoint_of_a_cli_run_loads_back_its_head_and_sampler(tmp_path):
    run = [
        *recipe("sparse_midx_rq_log_uniform"),
        "--trainer.max_epochs=1",
        "--trainer.limit_train_batches=1",
        "--trainer.limit_val_batches=1",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--trainer.logger.init_args.save_dir={tmp_path}",
        f"--trainer.default_root_dir={tmp_path}",
    ]
    cli = main(run, run=False)
    cli.trainer.fit(cli.model, cli.datamodule)
    loaded = type(cli.model).load_from_checkpoint(cli.trainer.checkpoint_callback.last_model_path)
    sampler = loaded.head.sampler
    assert [type(c).__name__ for c in sampler.components] == ["MIDXSampler", "LogUniformSampler"]
    assert loaded.head.num_negatives == 20 and loaded.head.sparse_grad
    expected = cli.model.state_dict()
    assert loaded.state_dict().keys() == expected.keys()
    for key, value in loaded.state_dict().items():
        if torch.is_tensor(value):
            assert torch.equal(value, expected[key]), key
        else:  # a sampler's draw stream, {"seed", "draws"}
            assert value == expected[key], key
