"""``ShardedTables`` in one process: a sharded head built in ``__init__`` holds no rows until the
callback's ``setup`` creates them (the whole table in one process), and a head built later, in
``configure_model``, is refused at fit start instead of being left to DDP."""

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_sampled.callbacks import ShardedTables
from lightning_sampled.heads import SampledSoftmaxHead
from lightning_sampled.samplers import UniformSampler

N, D = 40, 4


def sharded_head() -> SampledSoftmaxHead:
    return SampledSoftmaxHead(N, D, UniformSampler(N), 5, sharded=True, bias=True)


class Classifier(L.LightningModule):
    def __init__(self, late: bool = False):
        super().__init__()
        self.late = late
        self.encoder = torch.nn.Linear(3, D)
        self.head = None if late else sharded_head()
        self.seen_at_setup = None

    def configure_model(self):
        if self.late and self.head is None:
            self.head = sharded_head()

    def setup(self, stage):
        if self.head is not None:  # the callbacks' setup runs first
            self.seen_at_setup = (self.head.weight.device.type, tuple(self.head.weight.shape))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.head(self.encoder(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(model: Classifier) -> None:
    data = TensorDataset(torch.randn(16, 3), torch.randint(N, (16,)))
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=2,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=[ShardedTables()],
    )
    trainer.fit(model, DataLoader(data, batch_size=8))


def test_a_head_built_in_init_holds_no_rows_until_setup_creates_them():
    model = Classifier()
    assert model.head.weight.is_meta and model.head.bias.is_meta
    fit(model)
    assert model.seen_at_setup == ("cpu", (N, D))
    assert not model.head.weight.is_meta and model.head.weight.grad is not None  # it trained


def test_a_head_built_in_configure_model_is_refused_naming_init():
    # in one process its table is still deferred when Lightning moves the model
    with pytest.raises(RuntimeError, match=r"LightningModule's __init__ \(not in configure_mod"):
        fit(Classifier(late=True))


def test_a_head_the_setup_did_not_see_is_refused_at_fit_start():
    # under DDP such a head is split at construction: the callback refuses it at fit start
    model, callback = Classifier(late=True), ShardedTables()
    with pytest.warns(UserWarning, match="found no head"):
        callback.setup(None, model, "fit")
    model.configure_model()
    model.head.shard()
    with pytest.raises(ValueError, match=r"\['head'\] were built after setup"):
        callback.on_fit_start(None, model)
    callback.setup(None, model, "fit")
    callback.on_fit_start(None, model)  # seen at setup: accepted
