"""``IndexRefresh``: rebuilds every index in the model before training and then on schedule.

An index (MIDX's codebooks and cells, a class tree, ...) goes stale as the class table trains. Every
submodule with a ``refresh_index()`` method (heads with an index implement one) is rebuilt before
the first training batch, then at doubling step intervals early in training (steps 50, 100, 200,
400, ... by default), every ``every_n_epochs`` epochs (at the first batch of the epoch) and / or
every ``every_n_train_steps`` optimizer steps. An index that was never built is also built when
validation, testing or prediction starts (``trainer.validate`` on a fresh model, the sanity check).

Why the doubling default: the class table moves fastest in the first few hundred steps, when an
index built from the random initial table proposes nearly uniform negatives; with only a
per-epoch refresh, a large catalog (whose epochs are long) trains most of its first epoch on that
stale index. Doubling intervals refresh often while it matters, and their number grows only with
the logarithm of the steps, so with a refresh costing ``r`` seconds and a step ``s`` seconds they
cost at most ``r / (doubling_steps * s)`` of the training time after the first refresh interval
(and ``log2(steps / doubling_steps)`` refreshes in all).

Under DDP, rank 0 builds and broadcasts the index state (every buffer of the refreshed module and
the parameters of its samplers, such as MIDX-Learn's codewords) so that every rank samples from the
same index. Tip: with millions of classes, pass ``DDPStrategy(broadcast_buffers=False)``: DDP would
otherwise re-broadcast the index buffers at every forward pass, and this callback already keeps
them identical. A head whose table is split across the ranks (``sharded=True``) is the exception:
every rank builds the index of its own rows, without gathering the table or broadcasting.

The callback's state (when it last refreshed) is checkpointed, and the index buffers are in the
model's checkpoint, so a resumed run samples from the same index and refreshes on the same schedule
as an uninterrupted one. A run that starts without that state refreshes before its first batch.
"""

from __future__ import annotations

import time
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn

from ..protocols import IndexStats, Refreshable, ShardedTable
from ..samplers import Sampler
from ..sharding.collectives import is_distributed


class IndexRefresh(Callback):
    """Calls ``refresh_index()`` on every submodule that has one, on a schedule.

    Logs ``index_refresh/seconds`` and, for every submodule with ``index_stats()`` (e.g.
    :class:`~lightning_sampled.samplers.MIDXSampler`), ``index_refresh/<module path>/<stat>``
    (quantisation MSE, non-empty cells, largest cell), once per refresh, at its global step, to
    the trainer's loggers (rank 0's, as Lightning's loggers do).

    Args:
        every_n_epochs: refresh at the start of every epoch divisible by this; ``None`` for never
            by epoch.
        every_n_train_steps: refresh before the batch where the global step is divisible by this;
            ``None`` for never by step.
        doubling_steps: refresh before the batches at global steps ``doubling_steps * 2^j``
            (``j = 0, 1, 2, ...``); ``None`` for no doubling schedule. With all three ``None`` the
            index is built once, before the first batch.
    """

    def __init__(
        self,
        every_n_epochs: int | None = 1,
        every_n_train_steps: int | None = None,
        doubling_steps: int | None = 50,
    ):
        for name, value in (
            ("every_n_epochs", every_n_epochs),
            ("every_n_train_steps", every_n_train_steps),
            ("doubling_steps", doubling_steps),
        ):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"{name} must be a positive int or None, got {value!r}")
            if value is not None and value < 1:
                raise ValueError(f"{name} must be a positive int or None, got {value!r}")
        self.every_n_epochs = every_n_epochs
        self.every_n_train_steps = every_n_train_steps
        self.doubling_steps = doubling_steps
        self.last_epoch: int | None = None
        self.last_step: int | None = None
        self.num_refreshes = 0

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        moving = trained_samplers(pl_module)
        if moving and self.every_n_train_steps is None:
            rank_zero_warn(
                f"IndexRefresh: the samplers {moving} have trainable parameters (MIDX-Learn's "
                "codewords), which move at every optimizer step while the classes keep the cells "
                "of the last refresh; pass every_n_train_steps to reassign them every few steps "
                "(MIDX-Learn on PTB: validation perplexity 232.0 after one epoch with 1, against "
                "247.9 with the default schedule; on 108,620 classes 10 did better than 1 in equal "
                "time)"
            )

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._build_missing(pl_module)

    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._build_missing(pl_module)

    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._build_missing(pl_module)

    def _build_missing(self, pl_module: pl.LightningModule) -> None:
        """Builds the indexes now if one was never built (``trainer.validate`` on a fresh
        model, the sanity check before training, a validation step that computes a sampled
        loss). The schedule is left as it is: the first training batch still refreshes, so the
        training clock of a fresh run includes its first build."""
        if unbuilt_indexes(pl_module):
            self.refresh(pl_module)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.take_due(trainer.current_epoch, trainer.global_step):
            seconds, stats = self.refresh(pl_module)
            metrics = {"index_refresh/seconds": seconds}
            metrics.update({f"index_refresh/{name}": value for name, value in stats.items()})
            # straight to the loggers, once: a LightningModule.log of a step metric would be
            # logged again with the same value at every later step until the next refresh
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)

    def take_due(self, epoch: int, step: int) -> bool:
        """Whether the schedule refreshes before the training batch at ``epoch`` and global
        ``step``; if so, that batch becomes the last refresh (what the callback does before each
        batch, so a caller can replay the schedule without a Trainer)."""
        if not self._due(epoch, step):
            return False
        self.last_epoch, self.last_step = epoch, step
        return True

    def _due(self, epoch: int, step: int) -> bool:
        if self.last_step is None:
            return True
        if step == self.last_step and epoch == self.last_epoch:
            return False  # the other micro-batches of an accumulated step
        by_step = self.every_n_train_steps is not None and (
            step % self.every_n_train_steps == 0 and step != self.last_step
        )
        if self.doubling_steps is not None and step != self.last_step:
            intervals, rest = divmod(step, self.doubling_steps)
            if rest == 0 and intervals >= 1 and intervals & (intervals - 1) == 0:
                by_step = True
        by_epoch = self.every_n_epochs is not None and (
            epoch % self.every_n_epochs == 0 and epoch != self.last_epoch
        )
        return by_step or by_epoch

    @torch.no_grad()
    def refresh(self, root: nn.Module) -> tuple[float, dict[str, float]]:
        """Refreshes every index under ``root`` now (rank 0 builds and broadcasts under DDP).

        Returns:
            ``(seconds, stats)``: wall-clock seconds of the refresh (broadcast included) and
            ``{"<module path>/<stat>": value}`` from every submodule with ``index_stats()``.
        """
        start = time.perf_counter()
        targets = refresh_targets(root)
        if not targets:
            rank_zero_warn("IndexRefresh found no submodule with a refresh_index() method")
        distributed = is_distributed()
        for _, module in targets:
            own_rows = isinstance(module, ShardedTable) and module.is_split
            if not distributed or own_rows or dist.get_rank() == 0:
                module.refresh_index()
            if distributed and not own_rows:
                broadcast_index_state(module, src=0)
        self.num_refreshes += 1
        stats = {
            f"{name}/{key}": value
            for name, module in root.named_modules()
            if isinstance(module, IndexStats)
            for key, value in module.index_stats().items()
        }
        return time.perf_counter() - start, stats

    def state_dict(self) -> dict[str, Any]:
        return {
            "last_epoch": self.last_epoch,
            "last_step": self.last_step,
            "num_refreshes": self.num_refreshes,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.last_epoch = state_dict["last_epoch"]
        self.last_step = state_dict["last_step"]
        self.num_refreshes = state_dict["num_refreshes"]


def refresh_targets(root: nn.Module) -> list[tuple[str, nn.Module]]:
    """The outermost :class:`~lightning_sampled.protocols.Refreshable` submodules of ``root``
    (``root`` included).

    A module nested inside one already found is left to its parent's ``refresh_index()``.
    """
    found: list[tuple[str, nn.Module]] = []
    for name, module in root.named_modules():
        if not isinstance(module, Refreshable):
            continue
        if any(name.startswith(f"{outer}.") or outer == "" for outer, _ in found):
            continue
        found.append((name, module))
    return found


def unbuilt_indexes(root: nn.Module) -> list[str]:
    """Paths of the submodules of ``root`` whose index was never built (an ``is_built``
    attribute that is ``False``, as :class:`~lightning_sampled.samplers.MIDXSampler` has)."""
    return [name for name, module in root.named_modules() if not getattr(module, "is_built", True)]


def trained_samplers(root: nn.Module) -> list[str]:
    """Paths of the :class:`~lightning_sampled.samplers.Sampler` submodules of ``root`` that own
    a parameter with ``requires_grad`` (their index moves with every optimizer step)."""
    return [
        name
        for name, module in root.named_modules()
        if isinstance(module, Sampler)
        and any(p.requires_grad for p in module.parameters(recurse=False))
    ]


def broadcast_index_state(module: nn.Module, src: int = 0) -> None:
    """Copies rank ``src``'s index state of ``module`` to every rank (``torch.distributed``).

    The index state is every buffer of ``module`` and every parameter of its
    :class:`~lightning_sampled.samplers.Sampler` submodules. Buffers whose size differs on a rank
    (sized at the first refresh) are resized there first. Tensors travel on their own device, so
    this works with gloo (CPU) and NCCL (CUDA).
    """
    state = dict(module.named_buffers())
    for prefix, sub in module.named_modules():
        if isinstance(sub, Sampler):
            for name, param in sub.named_parameters(recurse=False):
                state[f"{prefix}.{name}" if prefix else name] = param.data
    shapes = [{name: (tuple(t.shape), t.dtype) for name, t in state.items()}]
    dist.broadcast_object_list(shapes, src=src)
    for name, (shape, dtype) in shapes[0].items():
        tensor = state[name]
        if tuple(tensor.shape) != shape or tensor.dtype != dtype:
            owner_name, _, leaf = name.rpartition(".")
            owner = module.get_submodule(owner_name)
            tensor = torch.empty(shape, dtype=dtype, device=tensor.device)
            owner._buffers[leaf] = tensor
        dist.broadcast(tensor, src=src)
