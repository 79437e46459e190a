"""Callbacks of the recipes: metrics tables for W&B. ``RNGCheckpoint`` (the random states in
checkpoints) lives in :mod:`lightning_sampled.callbacks`; it is importable from here too, as the
recipes' configs name it."""

from __future__ import annotations

from typing import Any

import lightning as L

from lightning_sampled.callbacks import RNGCheckpoint

__all__ = ["MetricsTable", "RNGCheckpoint"]


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
