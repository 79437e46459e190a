"""The trained-head benchmark reads checkpoints with ``weights_only=True``."""

from __future__ import annotations

import pickle

import lightning as L
import pytest
import torch

from benchmarks.adaptive_softmax_trained import load_model_state
from lightning_sampled.heads import FullSoftmaxHead
from recipes.callbacks import RNGCheckpoint  # what the benchmark's recipe checkpoints hold

#: set when a checkpoint's pickle builds :class:`RunsOnLoad`, i.e. when loading ran its code
LOADED: list[str] = []


class RunsOnLoad:
    """An object whose unpickling calls a function: what an untrusted checkpoint can carry."""

    def __reduce__(self):
        return LOADED.append, ("code ran",)


class TinyModel(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.Linear(4, 8)
        self.head = FullSoftmaxHead(20, 8)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.head(self.encoder(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def test_loads_the_state_dict_of_a_lightning_checkpoint(tmp_path):
    model = TinyModel()
    data = torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randint(20, (8,)))
    trainer = L.Trainer(
        max_steps=2,
        callbacks=[RNGCheckpoint()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=4))
    path = tmp_path / "tiny.ckpt"
    trainer.save_checkpoint(path)
    state = load_model_state(path)
    assert state.keys() == model.state_dict().keys()
    for name, value in model.state_dict().items():
        assert torch.equal(state[name], value), name


def test_refuses_a_checkpoint_that_would_run_code_on_load(tmp_path):
    path = tmp_path / "untrusted.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(2)}, "payload": RunsOnLoad()}, path)
    with pytest.raises(pickle.UnpicklingError, match="weights_only"):
        load_model_state(path)
    assert LOADED == []
