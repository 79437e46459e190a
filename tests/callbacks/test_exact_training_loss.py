"""``ExactTrainingLoss``: the logged number is the head's exact loss on the evenly spaced scored
positions of the probed steps' batches (recomputed here by hand), the probe leaves training
bit-for-bit as it was, and it probes once per optimizer step."""

import csv

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from lightning_sampled.callbacks import ExactTrainingLoss
from lightning_sampled.callbacks.exact_loss import evenly_spaced_scored_rows
from lightning_sampled.heads import SampledSoftmaxHead

N, D, F = 50, 8, 5
IGNORE = -100


class Windows(Dataset):
    """Six fixed batches of ``[4, 7]`` positions, about a fifth ignored, with sample weights."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(6, 4, 7, F, generator=g)
        self.y = torch.randint(N, (6, 4, 7), generator=g)
        self.y[torch.rand(6, 4, 7, generator=g) < 0.2] = IGNORE
        self.w = torch.rand(6, 4, 7, generator=g) + 0.5

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i):
        return self.x[i], self.y[i], self.w[i]


class Model(L.LightningModule):
    def __init__(self, lr: float, dropout: float = 0.0) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Dropout(dropout), nn.Linear(F, D))
        self.head = SampledSoftmaxHead(N, D, num_negatives=5)  # the default configuration
        self.lr = lr

    def training_step(self, batch, batch_idx):
        x, y, w = batch
        loss = self.head(self.encoder(x), y, w)
        self.log("train/loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def fit(tmp_path, lr: float, callbacks, accumulate: int = 1, dropout: float = 0.0) -> Model:
    L.seed_everything(0)
    model = Model(lr, dropout)
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        callbacks=callbacks,
        logger=L.pytorch.loggers.CSVLogger(tmp_path),
        log_every_n_steps=1,
        accumulate_grad_batches=accumulate,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    loader = DataLoader(Windows(), batch_size=None, shuffle=False)
    trainer.fit(model, loader)
    return model


def logged(tmp_path, key: str) -> dict[int, float]:
    (path,) = tmp_path.glob("**/metrics.csv")
    rows = list(csv.DictReader(path.open()))
    return {int(r["step"]): float(r[key]) for r in rows if r.get(key)}


def test_the_logged_value_is_the_exact_loss_of_the_evenly_spaced_scored_positions(tmp_path):
    """With a learning rate of 0 the parameters stay those of every forward, so each probe can
    be recomputed from the batch; it is logged at the probed steps only."""
    model = fit(tmp_path, lr=0.0, callbacks=[ExactTrainingLoss(every_n_train_steps=2, num_rows=9)])
    exact = logged(tmp_path, "train/exact_loss")
    assert sorted(exact) == [0, 2, 4]
    data = Windows()
    for step, value in exact.items():
        x, y, w = data[step]
        rows = evenly_spaced_scored_rows(y, IGNORE, 9)
        assert rows.numel() == 9
        with torch.no_grad():
            z = model.encoder(x).reshape(-1, D)[rows]
            want = model.head.full_loss(z, y.reshape(-1)[rows], w.reshape(-1)[rows])
        assert value == pytest.approx(float(want), rel=1e-6)
    assert sorted(logged(tmp_path, "train/loss")) == list(range(6))  # beside the objective


def test_probing_leaves_the_training_run_bit_for_bit_as_it_was(tmp_path):
    """No random numbers are drawn (dropout draws from the same global generator after each
    probe) and no gradient is taken: the same seeded run ends with the same parameters (and
    in-batch frequencies) with and without the probes."""
    plain = fit(tmp_path / "plain", lr=0.1, callbacks=[], dropout=0.3)
    probe = ExactTrainingLoss(1, num_rows=5)
    probed = fit(tmp_path / "probed", lr=0.1, callbacks=[probe], dropout=0.3)
    want, got = plain.state_dict(), probed.state_dict()
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(got[key], value), key


def test_one_probe_per_optimizer_step_under_gradient_accumulation(tmp_path):
    fit(tmp_path, lr=0.1, callbacks=[ExactTrainingLoss(1, num_rows=5)], accumulate=2)
    assert sorted(logged(tmp_path, "train/exact_loss")) == [0, 1, 2]


def test_evenly_spaced_scored_rows_against_a_plain_loop():
    target = torch.tensor([[3, IGNORE, 4, 5], [IGNORE, IGNORE, 6, 7], [8, 9, IGNORE, 1]])
    scored = [i for i, t in enumerate(target.reshape(-1).tolist()) if t != IGNORE]  # 8 of 12
    assert evenly_spaced_scored_rows(target, IGNORE, 20).tolist() == scored
    assert evenly_spaced_scored_rows(target, IGNORE, 4).tolist() == scored[::2]
    assert evenly_spaced_scored_rows(target, IGNORE, 3).tolist() == [
        scored[0],
        scored[2],
        scored[5],
    ]
    several = torch.tensor([[[1, IGNORE], [IGNORE, IGNORE]], [[IGNORE, 2], [3, 4]]])
    assert evenly_spaced_scored_rows(several, IGNORE, 5, several=True).tolist() == [0, 2, 3]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(every_n_train_steps=0), "every_n_train_steps must be a positive integer"),
        (dict(num_rows=-3), "num_rows must be a positive integer"),
        (dict(name=""), "name must be a non-empty string"),
    ],
)
def test_bad_arguments_are_refused_by_name(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ExactTrainingLoss(**kwargs)
