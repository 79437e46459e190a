"""Heads over a table split across two DDP processes on gloo, under a Lightning ``Trainer`` with
``ShardedTables``, the tied input lookup and ``LazyAdam``: equal to one process on the whole
batch, checkpointed, and resumed at two processes and at one."""

from pathlib import Path

import lightning as L
import pytest
import torch
from ddp_sharded_train import NUM_CLASSES, ShardedToyModel, fit
from launched_script import run_script

HERE = Path(__file__).resolve().parent


def run_ddp(out: Path, epochs: int, head: str, resume: Path | None = None) -> dict:
    """Fits in two processes (a subprocess: Lightning's launcher re-runs the script) and returns
    the checkpoint they saved."""
    args = [str(out), "2", str(epochs), head] + ([str(resume)] if resume else [])
    run_script(HERE / "ddp_sharded_train.py", args, out.parent, f"{out.name}.error*")
    return torch.load(out, weights_only=False)


def assert_same_model(state: dict, model: torch.nn.Module) -> None:
    for name, value in model.state_dict().items():
        torch.testing.assert_close(state[name], value, rtol=0, atol=2e-5, msg=name)


def test_two_processes_equal_one_and_resume_at_two_and_at_one(tmp_path):
    first = run_ddp(tmp_path / "epoch1.ckpt", 1, "full")
    weight = first["state_dict"]["head.weight"]
    assert weight.shape == (NUM_CLASSES, 8)  # the whole table, gathered
    assert first["state_dict"]["head.shard_layout"].tolist() == [NUM_CLASSES, 1, 0]
    moments = [s for s in first["optimizer_states"][0]["state"].values()]
    assert any(s["exp_avg"].shape == (NUM_CLASSES, 8) for s in moments)

    straight = fit(devices=1, epochs=2, head="full").lightning_module
    at_two = run_ddp(tmp_path / "epoch2.ckpt", 2, "full", resume=tmp_path / "epoch1.ckpt")
    at_one = fit(devices=1, epochs=2, head="full", resume=str(tmp_path / "epoch1.ckpt"))
    L.seed_everything(0, verbose=False)
    fresh = ShardedToyModel("full")
    fresh.head.shard()  # in one process: the whole table, as every run seeded alike starts
    initial = fresh.state_dict()
    assert (straight.head.weight - initial["head.weight"]).abs().max() > 0.1  # it trained
    assert_same_model(at_two["state_dict"], straight)
    assert_same_model(at_one.lightning_module.state_dict(), straight)
    ours = at_one.optimizers[0].state_dict()["state"]
    for key, entry in at_two["optimizer_states"][0]["state"].items():
        for name, value in entry.items():
            torch.testing.assert_close(value, ours[key][name], rtol=0, atol=2e-5)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_sharded_midx_head_with_row_wise_state_trains_and_resumes_at_two_and_at_one(tmp_path):
    saved = run_ddp(tmp_path / "midx.ckpt", 2, "midx")
    assert not any(k.startswith("head.sampler.") for k in saved["state_dict"])
    row_wise = [s for s in saved["optimizer_states"][0]["state"].values() if "row_sum_sq" in s]
    assert [s["row_sum_sq"].shape for s in row_wise] == [(NUM_CLASSES,)]  # gathered whole
    L.seed_everything(0, verbose=False)
    fresh = ShardedToyModel("midx")
    fresh.head.shard()
    before = fresh.exact_loss()
    model = ShardedToyModel("midx")
    model.load_state_dict(saved["state_dict"])  # creates the deferred table, then loads it
    assert model.exact_loss() < 0.8 * before

    at_two = run_ddp(tmp_path / "midx3.ckpt", 3, "midx", resume=tmp_path / "midx.ckpt")
    at_one = fit(devices=1, epochs=3, head="midx", resume=str(tmp_path / "midx.ckpt"))
    for resumed in (at_two["state_dict"], at_one.lightning_module.state_dict()):
        moved = (resumed["head.weight"] - saved["state_dict"]["head.weight"]).abs().max()
        assert moved > 0  # a third epoch trained on from the checkpoint
    state = at_one.optimizers[0].state[at_one.lightning_module.head.weight]
    assert state["row_sum_sq"].shape == (NUM_CLASSES,) and float(state["step"]) > 0
