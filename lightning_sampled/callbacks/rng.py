"""``RNGCheckpoint``: the process's random states in checkpoints, for exact resume."""

from __future__ import annotations

import random
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch


class RNGCheckpoint(pl.Callback):
    """Saves the Python, NumPy, torch CPU and (when CUDA is initialised) CUDA random states in
    checkpoints and restores them on resume.

    Lightning restores the model, the optimizers and the loops, not the random generators. The
    samplers draw their negatives from torch's default generator (the CPU one, or the CUDA one of
    the queries' device), so without this callback a resumed run draws other negatives, dropout
    masks and shuffles than an uninterrupted one. With it, a run resumed from any checkpoint draws
    exactly what the uninterrupted run draws (bit for bit on CPU; on GPU as far as the kernels are
    deterministic). Resume mid-epoch also needs a dataloader whose order is resumable (Lightning
    saves the ``state_dict`` of a training dataloader that has one).

    Under DDP Lightning saves the callback states of rank 0 only, so every rank resumes with rank
    0's states; the samplers' draws still differ across ranks (see
    :meth:`~lightning_sampled.samplers.Sampler.sample`), but a resumed DDP run is not bit for bit
    the uninterrupted one.

    The state holds plain Python types and tensors only, so checkpoints load with
    ``torch.load(weights_only=True)``.
    """

    def state_dict(self) -> dict[str, Any]:
        kind, keys, pos, has_gauss, gauss = np.random.get_state()
        state = {
            "python": random.getstate(),
            "numpy": (kind, keys.tolist(), int(pos), int(has_gauss), float(gauss)),
            "torch": torch.get_rng_state(),
        }
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        kind, keys, pos, has_gauss, gauss = state_dict["numpy"]
        random.setstate(state_dict["python"])
        np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))
        torch.set_rng_state(state_dict["torch"])
        if "cuda" in state_dict and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state_dict["cuda"])
