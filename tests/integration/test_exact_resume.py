"""Exact mid-epoch resume in a user's own LightningModule that uses only the library: a run
checkpointed every 4 steps and resumed from a checkpoint trains to the same weights, bit for bit,
as the run that was never interrupted.

The negatives need no callback (each sampler's draw stream is in the model's ``state_dict``);
the batches come back in order from torchdata's ``StatefulDataLoader`` (Lightning saves its
position); dropout repeats with :class:`~lightning_sampled.callbacks.RNGCheckpoint`.
"""

import os
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_sampled.callbacks import IndexRefresh, RNGCheckpoint
from lightning_sampled.heads import CaneHead, SampledSoftmaxHead
from lightning_sampled.samplers import MIDXSampler

HERE = Path(__file__).parent

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N, D, ROWS, BATCH = 60, 8, 40, 5  # 8 batches per epoch
STEPS, EVERY = 12, 4  # checkpoints at step 4 (mid-epoch) and 8 (the end of the first epoch)

HEADS = {
    "uniform": lambda: SampledSoftmaxHead(N, D, num_negatives=5),
    "midx": lambda: SampledSoftmaxHead(N, D, MIDXSampler(N, 4, kmeans_iters=3), num_negatives=5),
    "cane": lambda: CaneHead(N, D, num_candidates=4, num_noise=5, branching=4),
}


class Classifier(pl.LightningModule):
    """A linear encoder, optional dropout and one of the library's heads: nothing else."""

    def __init__(self, head: str, dropout: float) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(4, D), nn.Dropout(dropout))
        self.head = HEADS[head]()

    def setup(self, stage: str) -> None:
        # DDP ranks seeded alike hold equal global generators, and then restoring rank 0's
        # states on every rank would pass for restoring each rank's: make them differ
        if self.trainer.world_size > 1:
            torch.manual_seed(1000 + self.trainer.global_rank)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.head(self.encoder(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.05)


def train(root: Path, head: str, dropout: float, callbacks, ckpt_path=None, devices=1) -> dict:
    """Fits ``STEPS`` steps (from ``ckpt_path`` if given), checkpointing every ``EVERY`` steps,
    on ``devices`` CPU processes (DDP on gloo when several, each with ``ROWS`` rows of data);
    returns the final ``state_dict``."""
    pl.seed_everything(0, verbose=False)
    data = TensorDataset(torch.randn(ROWS * devices, 4), torch.randint(N, (ROWS * devices,)))
    model = Classifier(head, dropout)
    checkpoints = ModelCheckpoint(
        root, "{step}", every_n_train_steps=EVERY, save_top_k=-1, save_on_train_epoch_end=False
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        max_steps=STEPS,
        default_root_dir=root,
        callbacks=[checkpoints, *callbacks],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    # Under DDP the order is sequential: a shuffled DistributedSampler that Lightning puts into
    # a StatefulDataLoader resumes on other batches (torchdata fast-forwards a new permutation).
    loader = StatefulDataLoader(data, batch_size=BATCH, shuffle=devices == 1)
    trainer.fit(model, loader, ckpt_path=ckpt_path)
    return model.state_dict()


def assert_same(resumed: dict, straight: dict) -> None:
    for key, value in straight.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(resumed[key], value), key
        else:
            assert resumed[key] == value, key


def index_refresh(head: str) -> list:
    return [] if head == "uniform" else [IndexRefresh(every_n_epochs=1)]


@pytest.mark.parametrize("step", [EVERY, 2 * EVERY], ids=["mid_epoch", "epoch_end"])
@pytest.mark.parametrize("head", list(HEADS))
def test_resumed_run_draws_the_uninterrupted_negatives_without_a_callback(tmp_path, head, step):
    straight = train(tmp_path / "straight", head, 0.0, index_refresh(head))
    resumed = train(
        tmp_path / "resumed",
        head,
        0.0,
        index_refresh(head),
        str(tmp_path / "straight" / f"step={step}.ckpt"),
    )
    assert_same(resumed, straight)


@pytest.mark.parametrize("step", [EVERY, 2 * EVERY], ids=["mid_epoch", "epoch_end"])
def test_resumed_run_repeats_the_dropout_masks_with_rng_checkpoint(tmp_path, step):
    straight = train(tmp_path / "straight", "uniform", 0.5, [RNGCheckpoint()])
    ckpt = str(tmp_path / "straight" / f"step={step}.ckpt")
    assert_same(train(tmp_path / "resumed", "uniform", 0.5, [RNGCheckpoint()], ckpt), straight)
    without = train(tmp_path / "without", "uniform", 0.5, [], ckpt)
    assert not torch.equal(without["encoder.0.weight"], straight["encoder.0.weight"])


def test_two_ddp_processes_resumed_mid_epoch_repeat_the_uninterrupted_run(tmp_path):
    """Every rank's negatives (their streams' state is the same on every rank) and dropout masks
    (``RNGCheckpoint`` saves each rank's states) repeat after a resume mid-epoch on gloo."""
    from launched_script import run_script

    script = HERE / "ddp_resume_train.py"
    run_script(script, [str(tmp_path / "straight")], tmp_path, "*.err")
    ckpt = tmp_path / "straight" / f"step={EVERY}.ckpt"
    run_script(script, [str(tmp_path / "resumed"), str(ckpt)], tmp_path, "*.err")
    assert "ranks" in torch.load(ckpt, weights_only=True)["callbacks"]["RNGCheckpoint"]
    straight = torch.load(tmp_path / "straight" / "final.pt", weights_only=True)
    resumed = torch.load(tmp_path / "resumed" / "final.pt", weights_only=True)
    assert_same(resumed, straight)
    assert os.path.exists(tmp_path / "straight" / f"step={2 * EVERY}.ckpt")
