"""Callbacks of the recipes: the logging interval fitted to short epochs, metrics tables for W&B,
and Lightning's ``ModelCheckpoint`` without its ``last.ckpt`` in a ``fast_dev_run``.
``RNGCheckpoint`` (the random states in checkpoints) lives in :mod:`lightning_sampled.callbacks`;
it is importable from here too, as the recipes' configs name it."""

from __future__ import annotations

import math
from typing import Any

import lightning as L
from lightning.pytorch import callbacks

from lightning_sampled.callbacks import RNGCheckpoint

__all__ = [
    "FitLogInterval",
    "MetricsTable",
    "ModelCheckpoint",
    "RNGCheckpoint",
    "fitted_log_interval",
]


class ModelCheckpoint(callbacks.ModelCheckpoint):
    """Lightning's ``ModelCheckpoint``, except that a ``fast_dev_run`` writes no checkpoint at
    all: Lightning (2.6) skips every save under ``fast_dev_run`` but the ``last.ckpt`` that
    ``save_last`` writes when training ends."""

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.fast_dev_run:
            super().on_train_end(trainer, pl_module)


def fitted_log_interval(requested: int, num_batches: float, accumulate_grad_batches: int) -> int:
    """The logging interval that logs at least once per epoch: ``requested``, or the epoch's
    optimizer steps ``ceil(num_batches / accumulate_grad_batches)`` when there are fewer.

    ``requested == 0`` (no step logs), an epoch of unknown length (``inf``) or an empty one keep
    ``requested``.
    """
    if requested == 0 or not math.isfinite(num_batches) or num_batches < 1:
        return requested
    return min(requested, math.ceil(num_batches / accumulate_grad_batches))


class FitLogInterval(L.Callback):
    """Fits ``trainer.log_every_n_steps`` to the epoch length, so that step metrics such as the
    train loss are logged at least once per epoch however short the epoch is.

    Lightning logs step metrics when the count of optimizer steps reaches a multiple of
    ``log_every_n_steps`` (50 by default): an epoch of 8 batches logs nothing in its first six
    epochs, and Lightning warns that the training epoch will not be logged. This callback sets
    the interval to :func:`fitted_log_interval` of the requested one at the start of every
    training epoch (the length may change when dataloaders reload), which logs the last step of
    each short epoch, and restores the requested interval when the fit ends. Lightning checks the
    interval while it loads the training data, before any hook sees the epoch length: from
    ``on_fit_start`` until then the interval is 0 (no step logs, during the sanity check only),
    which also spares the warning. :class:`~recipes.module.SampledModule` adds this callback to
    every recipe.
    """

    def __init__(self) -> None:
        self.requested: int | None = None

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.requested = trainer.log_every_n_steps
        trainer.log_every_n_steps = 0

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.requested is not None:
            trainer.log_every_n_steps = fitted_log_interval(
                self.requested, trainer.num_training_batches, trainer.accumulate_grad_batches
            )

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit" and self.requested is not None:
            trainer.log_every_n_steps = self.requested
            self.requested = None


class MetricsTable(L.Callback):
    """Logs the evaluation metrics as tables to every logger that takes tables
    (``WandbLogger.log_table``); other loggers already get them as scalars.

    ``val/metrics``: one row per validation run (``epoch``, ``step`` and every ``val/`` metric),
    re-logged after each validation so the table grows with training. ``test/metrics``: the same
    columns for each test run. Sanity-check validation is skipped.
    """

    def __init__(self) -> None:
        self.rows: dict[str, list[list[Any]]] = {"val": [], "test": []}

    def _log(self, trainer: L.Trainer, stage: str) -> None:
        names = sorted(k for k in trainer.callback_metrics if k.startswith(f"{stage}/"))
        if not names:
            return
        values = [float(trainer.callback_metrics[k]) for k in names]
        self.rows[stage].append([trainer.current_epoch, trainer.global_step, *values])
        for logger in trainer.loggers:
            if callable(getattr(logger, "log_table", None)):
                logger.log_table(
                    key=f"{stage}/metrics", columns=["epoch", "step", *names], data=self.rows[stage]
                )

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._log(trainer, "val")

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._log(trainer, "test")
