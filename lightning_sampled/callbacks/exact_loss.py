"""``ExactTrainingLoss``: the exact cross-entropy of a few training positions, logged beside the
sampled objective.

A sampled head's training loss is its objective, not the model's cross-entropy: under the default
``corrected_all`` every logit is shifted by ``log(M q)``, so the number sits far from the exact
loss (11.3 against 4.35 at M = 20,000, N = 20) and cannot be read beside ``val/loss``; any sampled
estimate is biased at finite ``M``. Every ``every_n_train_steps`` optimizer steps this callback
takes ``num_rows`` of the batch's scored positions, evenly spaced (no random numbers are drawn,
so a seeded run trains exactly as without it), and logs the head's exact
:meth:`~lightning_sampled.heads.OutputHead.full_loss` on them, with their ``sample_weight``, as
``train/exact_loss``: an estimate of the batch's exact mean loss from a subsample, at the
parameters of that forward. Its cost is ``num_rows x N x D`` multiply-adds per probe, in class
chunks, without gradients; on a table split across ranks it is the exact head's collectives (every
rank probes at the same step).
"""

from __future__ import annotations

import inspect
from functools import partial
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from .._validation import check_positive_int
from ..protocols import ExactLoss


class ExactTrainingLoss(L.Callback):
    """Logs the exact cross-entropy of ``num_rows`` training positions every
    ``every_n_train_steps`` optimizer steps (module docstring).

    Every submodule that is :class:`~lightning_sampled.protocols.ExactLoss` (every head) is
    probed on its first training forward of the chosen steps, through a forward hook that is
    removed once the batch ends. The value goes to the trainer's loggers (rank 0's, as every
    logger writes on rank 0 only) as ``name`` (``train/exact_loss``; with several heads,
    ``name/<submodule path>``) at that step, next to the module's own ``train/loss``; not into
    ``trainer.callback_metrics``, where a value of an early step would outlive it (a run
    resumed after that step would then differ from the uninterrupted one there). A position
    with several positives (``positives=``) counts as one row.

    Args:
        every_n_train_steps: probe the steps whose ``trainer.global_step`` is a multiple of it.
        num_rows: how many scored positions to score exactly (all when the batch has fewer).
        name: the logged key.
    """

    def __init__(
        self, every_n_train_steps: int = 50, num_rows: int = 128, name: str = "train/exact_loss"
    ) -> None:
        self.every_n_train_steps = check_positive_int("every_n_train_steps", every_n_train_steps)
        self.num_rows = check_positive_int("num_rows", num_rows)
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        self.name = name
        self._hooks: dict[str, RemovableHandle] = {}
        self._values: dict[str, Tensor] = {}
        self._probed_step: int | None = None

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if step % self.every_n_train_steps or step == self._probed_step:
            return
        self._probed_step = step  # once per optimizer step under gradient accumulation
        heads = {name: m for name, m in pl_module.named_modules() if isinstance(m, ExactLoss)}
        for path, head in heads.items():
            key = self.name if len(heads) == 1 else f"{self.name}/{path}"
            probe = partial(self._probe, key)
            self._hooks[key] = head.register_forward_hook(probe, with_kwargs=True)

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        self._remove_hooks()
        if not self._values:
            return
        # straight to the loggers, at the step of the batch: a value given to self.log from a
        # callback would be logged again at every later step until the next probe
        metrics = {key: float(value) for key, value in self._values.items()}
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=self._probed_step)
        self._values.clear()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._remove_hooks()

    def _remove_hooks(self) -> None:
        for handle in self._hooks.values():
            handle.remove()
        self._hooks.clear()

    def _probe(
        self, key: str, head: nn.Module, args: tuple, kwargs: dict[str, Any], output: Any
    ) -> None:
        """The forward hook: the exact loss of the call's evenly spaced scored positions."""
        if not head.training:
            return
        self._hooks.pop(key).remove()  # the first training forward of the step only
        call = inspect.signature(head.forward).bind(*args, **kwargs).arguments
        z, target = call["z"], call["target"]
        weight, positives = call.get("sample_weight"), call.get("positives")
        several = positives is not None
        rows = evenly_spaced_scored_rows(target, head.ignore_index, self.num_rows, several)
        z = z.detach().reshape(-1, z.shape[-1])[rows]
        target = target.reshape(-1, target.shape[-1])[rows] if several else target.reshape(-1)[rows]
        if weight is not None:
            weight = weight.detach().reshape(-1)[rows]
        with torch.no_grad():
            self._values[key] = head.full_loss(z, target, weight, positives=positives).detach()


def evenly_spaced_scored_rows(
    target: Tensor, ignore_index: int, num_rows: int, several: bool = False
) -> Tensor:
    """long ``[min(num_rows, S)]``: the flat indices of ``num_rows`` of the ``S`` scored
    positions of ``target`` (``[...]``, or ``[..., P]`` positives per position when
    ``several``), evenly spaced from the first; a position is scored unless its target (every
    positive) is ``ignore_index``. Draws no random numbers."""
    scored = target != ignore_index
    scored = scored.reshape(-1, target.shape[-1]).any(-1) if several else scored.reshape(-1)
    positions = scored.nonzero().squeeze(1)  # a host sync, on the probed steps only
    count = positions.numel()
    if count <= num_rows:
        return positions
    picks = torch.arange(num_rows, device=positions.device) * count // num_rows
    return positions[picks]
