"""The SASRec recipe with ``sharded: true`` on its head: the head owns the item table (inputs
looked up through ``head.embed``), ``ShardedTables`` is added, and a checkpoint validated by two
processes, whose evaluation batches differ in number, gives the metrics one process gives."""

import functools
import json
from pathlib import Path

import pytest
import torch
from launched_script import run_script

from lightning_sampled.heads import FullSoftmaxHead
from recipes import GRU4Rec
from recipes.cli import main

HERE = Path(__file__).resolve().parent
CONFIGS = HERE.parents[1] / "recipes" / "configs"
SMALL = {"num_items": 1_000, "num_users": 120, "seq_len": 20, "num_clusters": 20}


def recipe_args(tmp_path: Path, head: str, run: str) -> list[str]:
    """A shrunk ``sasrec_synthetic-1m.yaml``: 49 evaluation users in batches of 8, so that two
    ranks hold 25 and 24 of them and evaluate 4 and 3 batches."""
    data = {**SMALL, "max_len": 10, "max_eval_users": 49, "eval_batch_size": 8}
    return [
        f"--config={CONFIGS / 'sasrec_synthetic-1m.yaml'}",
        f"--config={CONFIGS / 'heads' / f'{head}.yaml'}",
        "--model.init_args.head.init_args.sharded=true",
        *[f"--data.init_args.{k}={v}" for k, v in data.items()],
        f"--data.init_args.cache_dir={tmp_path / 'cache'}",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        "--trainer.logger=false",
        f"--trainer.default_root_dir={tmp_path / run}",
    ]


@pytest.mark.parametrize("head", ["sparse_uniform", "full"])
def test_a_sharded_recipe_validates_alike_in_two_processes_and_in_one(tmp_path, head):
    fit = [
        *recipe_args(tmp_path, head, "fit"),
        "--trainer.max_steps=30",
        "--model.init_args.lr=0.01",
    ]
    cli = main(fit, run=False)
    assert cli.model.item_emb is None and cli.model.head.sharded
    assert any(type(c).__name__ == "ShardedTables" for c in cli.model.configure_callbacks())
    cli.trainer.fit(cli.model, cli.datamodule)
    ckpt = tmp_path / "trained.ckpt"
    cli.trainer.save_checkpoint(ckpt)
    one = cli.trainer.validate(cli.model, cli.datamodule, verbose=False)[0]
    assert one["val/ndcg@10"] > 0  # it learned something to compare

    out = tmp_path / "two.json"
    args = [str(out), "2", str(ckpt), "validate", *recipe_args(tmp_path, head, "validate")]
    run_script(HERE / "sharded_validate.py", args, tmp_path, "two.json.error*")
    two = json.loads(out.read_text())
    assert two.keys() == one.keys()
    for name, value in one.items():
        assert two[name] == pytest.approx(value, rel=1e-5, abs=1e-7), name


def test_a_sharded_head_needs_the_tied_table():
    sharded = functools.partial(FullSoftmaxHead, sharded=True)
    with pytest.raises(ValueError, match="tie_weights=True"):
        GRU4Rec(100, head=sharded, tie_weights=False)
    model = GRU4Rec(100, head=sharded)
    assert model.item_emb is None and model.head.table_deferred  # created at setup
    model.head.shard()
    assert model.head.weight.shape == (100, 64)
    assert model.head.embed(torch.tensor([0])).abs().sum() == 0  # the padding item
    assert float(model.head.weight.std()) == pytest.approx(64**-0.5, rel=0.05)  # N(0, 1 / D)
