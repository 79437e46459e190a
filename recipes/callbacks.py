"""Callbacks of the recipes."""

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
