"""Short epochs still log the train loss: ``FitLogInterval`` fits ``log_every_n_steps`` to them."""

import csv
import math
import warnings
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from recipes.callbacks import FitLogInterval, fitted_log_interval
from recipes.cli import main

CONFIGS = Path(__file__).parents[2] / "recipes" / "configs"
SHORT_EPOCH_WARNING = "smaller than the logging interval"


class TinyRegression(L.LightningModule):
    """A linear model over ``batches`` batches of 4 rows per epoch, logging ``train/loss``."""

    def __init__(self, batches: int) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 1)
        gen = torch.Generator().manual_seed(0)
        self.data = TensorDataset(
            torch.randn(4 * batches, 2, generator=gen), torch.randn(4 * batches, 1, generator=gen)
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.layer(x), y)
        self.log("train/loss", loss)
        return loss

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=4)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def logged_steps(log_dir: Path, name: str) -> list[int]:
    """The steps at which ``name`` was logged (a logger that got nothing writes no file)."""
    if not (log_dir / "metrics.csv").exists():
        return []
    with open(log_dir / "metrics.csv") as f:
        return [int(row["step"]) for row in csv.DictReader(f) if row.get(name)]


def fit_tiny(tmp_path: Path, callbacks: list, batches: int = 3, epochs: int = 2, **kwargs):
    trainer = L.Trainer(
        max_epochs=epochs,
        logger=CSVLogger(tmp_path),
        callbacks=callbacks,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(TinyRegression(batches))
    short_epoch_warnings = [w for w in caught if SHORT_EPOCH_WARNING in str(w.message)]
    return trainer, logged_steps(Path(trainer.logger.log_dir), "train/loss"), short_epoch_warnings


def test_fitted_log_interval() -> None:
    assert fitted_log_interval(50, 8, 1) == 8
    assert fitted_log_interval(50, 8, 3) == 3  # ceil(8 / 3) optimizer steps per epoch
    assert fitted_log_interval(5, 8, 1) == 5  # long epochs keep the requested interval
    assert fitted_log_interval(0, 8, 1) == 0  # no step logs stays no step logs
    assert fitted_log_interval(50, math.inf, 1) == 50  # unknown length
    assert fitted_log_interval(50, 0, 1) == 50


def test_tiny_epochs_log_train_loss_once_per_epoch(tmp_path: Path) -> None:
    trainer, steps, warned = fit_tiny(tmp_path / "fitted", [FitLogInterval()])
    assert steps == [2, 5]  # the last step of each 3-batch epoch (0-based global steps)
    assert not warned
    assert trainer.log_every_n_steps == 50  # the requested interval is restored after the fit
    # the same fit without the callback logs nothing and warns: what the callback fixes
    _, steps, warned = fit_tiny(tmp_path / "plain", [])
    assert steps == [] and len(warned) == 1


def test_long_epochs_keep_the_requested_interval(tmp_path: Path) -> None:
    _, steps, warned = fit_tiny(tmp_path, [FitLogInterval()], batches=7, log_every_n_steps=3)
    assert steps == [2, 5, 8, 11] and not warned


def test_accumulated_batches_count_optimizer_steps(tmp_path: Path) -> None:
    trainer, steps, _ = fit_tiny(
        tmp_path, [FitLogInterval()], batches=5, epochs=3, accumulate_grad_batches=2
    )
    assert trainer.global_step == 9  # ceil(5 / 2) optimizer steps per epoch
    assert sorted(set(steps)) == [2, 5, 8]


def test_recipes_log_train_loss_on_short_epochs(tmp_path: Path) -> None:
    """SASRec on 20 users: 2 batches per epoch, far fewer than the default interval of 50."""
    cli = main(
        [
            f"--config={CONFIGS / 'sasrec_ml-100k.yaml'}",
            f"--config={CONFIGS / 'heads' / 'uniform.yaml'}",
            "--data.init_args.max_users=20",
            "--data.init_args.max_len=20",
            "--data.init_args.batch_size=16",
            "--trainer.max_epochs=3",
            f"--trainer.logger.init_args.save_dir={tmp_path}",
            "--trainer.enable_checkpointing=false",
            "--trainer.callbacks=[]",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
        ],
        run=False,
    )
    assert cli.trainer.log_every_n_steps == 50
    cli.trainer.fit(cli.model, cli.datamodule)
    per_epoch = cli.trainer.num_training_batches
    assert per_epoch < 50
    steps = logged_steps(Path(cli.trainer.logger.log_dir), "train/loss")
    assert steps == [per_epoch * e - 1 for e in (1, 2, 3)]
