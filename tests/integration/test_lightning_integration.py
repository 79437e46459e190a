"""Heads inside a LightningModule: CPU fit, two-process DDP, bf16 autocast, checkpoints."""

import json
import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from toy_lightning import NUM_CLASSES, ToyData, ToyModel, evaluate

HERE = Path(__file__).resolve().parent


def make_trainer(tmp_path, max_epochs=2, **kwargs):
    return L.Trainer(
        accelerator="cpu",
        max_epochs=max_epochs,
        default_root_dir=tmp_path,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,
    )


@pytest.mark.parametrize("head", ["full", "sampled"])
def test_fit_on_cpu_trains_to_well_above_chance(tmp_path, head):
    L.seed_everything(0, verbose=False)
    model, data = ToyModel(head=head), ToyData()
    before = evaluate(model, data)["val/ndcg@10"]
    trainer = make_trainer(tmp_path, enable_checkpointing=False)
    trainer.fit(model, data)
    after = evaluate(model, data)
    assert after["val/ndcg@10"] > max(0.5, 3 * before), (before, after)
    assert after["val/ndcg@10"] == pytest.approx(float(trainer.callback_metrics["val/ndcg@10"]))


@pytest.mark.parametrize("head", ["full", "sampled"])
def test_bf16_mixed_precision_trains(tmp_path, head):
    L.seed_everything(0, verbose=False)
    model, data = ToyModel(head=head), ToyData()
    trainer = make_trainer(tmp_path, enable_checkpointing=False, precision="bf16-mixed")
    trainer.fit(model, data)
    metrics = evaluate(model, data)
    assert torch.isfinite(trainer.callback_metrics["train/loss"])
    assert metrics["val/ndcg@10"] > 0.5, metrics


def test_checkpoint_restores_heads_and_sampler_buffers_and_resumes(tmp_path):
    L.seed_everything(0, verbose=False)
    data = ToyData()
    model = ToyModel(head="sampled")
    trainer = make_trainer(tmp_path, max_epochs=1)
    trainer.fit(model, data)
    ckpt = trainer.checkpoint_callback.best_model_path
    restored = ToyModel.load_from_checkpoint(ckpt)
    for name, value in model.state_dict().items():
        if torch.is_tensor(value):
            assert torch.equal(value, restored.state_dict()[name]), name
        else:  # the sampler's draw stream, {"seed", "draws"}
            assert value == restored.state_dict()[name], name
    assert "head.sampler.log_probs" in restored.state_dict()
    assert "head.sampler._extra_state" in restored.state_dict()
    assert evaluate(restored, data) == evaluate(model, data)

    resumed_trainer = make_trainer(tmp_path, max_epochs=2)
    resumed = ToyModel(head="sampled")
    resumed_trainer.fit(resumed, data, ckpt_path=ckpt)
    assert resumed_trainer.global_step == 2 * trainer.global_step
    assert not torch.equal(resumed.head.weight, restored.head.weight)


def test_two_process_ddp_trains_and_metrics_equal_single_process_evaluation(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, str(HERE / "ddp_train.py"), str(tmp_path), "2"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    logged = json.loads((tmp_path / "metrics.json").read_text())
    assert logged["world_size"] == 2
    model = ToyModel.load_from_checkpoint(tmp_path / "final.ckpt")
    single = evaluate(model, ToyData())
    assert single["val/ndcg@10"] > 0.5, single
    # 509 validation rows (odd): a padding DistributedSampler would count one row twice
    assert logged["val/recall@10"] == single["val/recall@10"], (logged, single)
    for name, value in single.items():
        assert logged[name] == pytest.approx(value, abs=1e-6), (name, logged, single)
    assert model.head.num_classes == NUM_CLASSES
