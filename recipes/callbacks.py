"""Callbacks of the recipes: RNG state in checkpoints, metrics tables for W&B."""

from __future__ import annotations

import random
from typing import Any

import lightning as L
import numpy as np
import torch


class RNGCheckpoint(L.Callback):
    """Saves the Python, NumPy and torch CPU random states in checkpoints and restores them on
    resume, so that on CPU a resumed run draws the same shuffles, dropout masks and negatives as
    an uninterrupted one (Lightning restores model, optimiser and loops, not the RNGs)."""

    def state_dict(self) -> dict[str, Any]:
        kind, keys, pos, has_gauss, gauss = np.random.get_state()
        return {  # plain types only: checkpoints are read with torch.load(weights_only=True)
            "python": random.getstate(),
            "numpy": (kind, keys.tolist(), int(pos), int(has_gauss), float(gauss)),
            "torch": torch.get_rng_state(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        kind, keys, pos, has_gauss, gauss = state_dict["numpy"]
        random.setstate(state_dict["python"])
        np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))
        torch.set_rng_state(state_dict["torch"])


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
