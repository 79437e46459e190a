"""RNGCheckpoint: random states round-trip, and a resumed fit equals an uninterrupted one."""

import random

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_sampled.callbacks import RNGCheckpoint
from lightning_sampled.heads import SampledSoftmaxHead
from lightning_sampled.samplers import UniformSampler


def draws() -> tuple:
    """One draw from each generator the callback restores."""
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_state_dict_round_trip_repeats_every_generator():
    callback = RNGCheckpoint()
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    state = callback.state_dict()
    assert len(state["ranks"]) == 1  # one process: its own states
    first = draws()
    assert draws() != first
    callback.load_state_dict(state)
    assert draws() == first


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_state_dict_round_trip_repeats_cuda_draws():
    callback = RNGCheckpoint()
    first_draw = torch.rand(3, device="cuda")
    state = callback.state_dict()
    expected = torch.rand(3, device="cuda")
    assert not torch.equal(first_draw, expected)
    callback.load_state_dict(state)
    assert torch.equal(torch.rand(3, device="cuda"), expected)


class SampledModel(pl.LightningModule):
    """A linear encoder and a sampled head (its negatives come from the sampler's own stream;
    the shuffle of the plain ``DataLoader`` from torch's global generator)."""

    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Linear(4, 8)
        self.head = SampledSoftmaxHead(50, 8, UniformSampler(50), num_negatives=5)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.head(self.encoder(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


def fit(root, epochs, callbacks, ckpt_path=None) -> dict[str, torch.Tensor]:
    pl.seed_everything(0, verbose=False)
    data = TensorDataset(torch.randn(40, 4), torch.randint(50, (40,)))
    model = SampledModel()
    trainer = pl.Trainer(
        max_epochs=epochs,
        default_root_dir=root,
        callbacks=callbacks,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, DataLoader(data, batch_size=8, shuffle=True), ckpt_path=ckpt_path)
    return model.state_dict()


@pytest.mark.parametrize("with_callback", [True, False])
def test_resume_draws_the_uninterrupted_negatives_only_with_the_callback(tmp_path, with_callback):
    def callbacks():
        return [RNGCheckpoint()] if with_callback else []

    straight = fit(tmp_path / "straight", 2, callbacks())
    fit(tmp_path / "first", 1, callbacks())
    (ckpt,) = (tmp_path / "first").rglob("*.ckpt")
    resumed = fit(tmp_path / "resumed", 2, callbacks(), str(ckpt))
    same = all(
        torch.equal(v, resumed[k]) for k, v in straight.items() if isinstance(v, torch.Tensor)
    )
    assert same == with_callback
    if with_callback:
        assert "RNGCheckpoint" in torch.load(ckpt, weights_only=True)["callbacks"]
