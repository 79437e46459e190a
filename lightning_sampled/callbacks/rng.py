"""``RNGCheckpoint``: the processes' random states in checkpoints, for exact resume."""

from __future__ import annotations

import random
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
import torch.distributed as dist
from lightning.pytorch.utilities import rank_zero_warn

from ..sharding.collectives import is_distributed, world_and_rank


class RNGCheckpoint(pl.Callback):
    """Saves every process's Python, NumPy, torch CPU and (when CUDA is initialised) CUDA random
    states in checkpoints and restores them on resume, so that dropout masks, shuffles and
    anything else drawn from the global generators repeat the uninterrupted run's.

    The samplers' negatives need no callback: each sampler draws from a stream of its own, saved
    in the model's ``state_dict`` (:class:`~lightning_sampled.samplers.DrawStream`).

    **When the states are restored.** Lightning hands the checkpoint to :meth:`load_state_dict`
    before it re-creates the training dataloader's iterator, and creating one draws from torch's
    generator (the base seed of its workers, a ``RandomSampler``'s seed). The states are
    restored at loading (what ``validate``, ``test`` and ``predict`` need, and what a resume at
    an epoch's end needs: that iterator is the next epoch's, drawn as the uninterrupted run drew
    it), and once more where that iterator's draws were not the uninterrupted run's: at the
    first training batch of a resume mid-epoch, or at the next epoch's start when Lightning
    creates that epoch's iterator anew after it. The batches themselves come back in order
    only from a dataloader whose position Lightning saves: one with ``state_dict`` /
    ``load_state_dict``, such as torchdata's ``StatefulDataLoader``.

    **Under DDP** Lightning writes the callback states of rank 0 only, so :meth:`state_dict`
    gathers every rank's states (one ``all_gather_object``, at each checkpoint, on every rank:
    Lightning builds the checkpoint on every rank) and each rank restores its own. Resumed on
    another number of ranks, rank ``r`` restores the states of rank ``r mod W`` (with a warning):
    the run continues but is no longer the uninterrupted one.

    The state holds plain Python types and tensors only, so checkpoints load with
    ``torch.load(weights_only=True)``.
    """

    def __init__(self) -> None:
        self._loaded: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        """``{"ranks": [states of rank 0, rank 1, ...]}`` (one entry in a single process)."""
        state = _process_states()
        if is_distributed():
            gathered: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, state)
            return {"ranks": gathered}
        return {"ranks": [state]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores this rank's states now, and keeps them to restore once more when training
        goes on (see the class docstring)."""
        self._loaded = _this_ranks_states(state_dict)
        _restore_process_states(self._loaded)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # the condition under which Lightning's epoch loop creates a new iterator after this hook
        fit_loop = trainer.fit_loop
        anew = not (fit_loop.is_resuming or fit_loop.epoch_loop.restarting)
        self._restore_loaded(again=trainer.current_epoch > 0 and anew)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._restore_loaded(again=batch_idx > 0)

    def _restore_loaded(self, again: bool) -> None:
        """Restores the loaded states once more if ``again`` (undoing what re-creating the
        dataloader's iterator drew), then forgets them."""
        if self._loaded is not None and again:
            _restore_process_states(self._loaded)
        self._loaded = None


def _process_states() -> dict[str, Any]:
    """This process's random states: Python, NumPy, torch CPU and (if initialised) CUDA."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": (kind, keys.tolist(), int(pos), int(has_gauss), float(gauss)),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _this_ranks_states(state_dict: dict[str, Any]) -> dict[str, Any]:
    """This rank's entry of a saved state (a checkpoint written before the states were saved
    per rank holds one process's states, which every rank restores)."""
    if "ranks" not in state_dict:
        return state_dict
    saved = state_dict["ranks"]
    world, rank = world_and_rank()
    if len(saved) != world:
        rank_zero_warn(
            f"RNGCheckpoint: the checkpoint holds the random states of {len(saved)} ranks and "
            f"the run has {world}; each rank restores those of its rank modulo {len(saved)}, so "
            f"the resumed run does not repeat the uninterrupted one"
        )
    return saved[rank % len(saved)]


def _restore_process_states(state: dict[str, Any]) -> None:
    """Sets the generators to what :func:`_process_states` returned."""
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    random.setstate(state["python"])
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
