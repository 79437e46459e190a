"""``ShardedTables``: splits the class tables of ``sharded=True`` heads across the ranks when
Lightning has started the process group, and keeps them out of DDP."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn

from ..protocols import Refreshable, ShardedTable
from ..sharding import whole_rows_on_first_rank


class ShardedTables(pl.Callback):
    """Splits every head built with ``sharded=True`` at setup (``head.shard()``) and lists its
    parameters and buffers in the LightningModule's ``_ddp_params_and_buffers_to_ignore``.

    A LightningModule builds its heads in ``__init__``, before Lightning's strategy starts the
    process group, and a sharded head then holds no rows (its table is on the ``meta`` device,
    :mod:`lightning_sampled.heads.table_init`); the callbacks' ``setup`` runs after that and
    before the optimizer and DDP see the parameters. Each rank then creates its own rows
    (:attr:`~lightning_sampled.heads.OutputHead.shard_ids`), the optimizer's state is only
    theirs, and DDP neither averages them (the heads' collectives already give each rank its
    rows' full gradient) nor checks that the ranks' shapes agree (uneven shards differ by a
    row), nor broadcasts rank 0's buffers over the other ranks' (a split head's MIDX index is
    built from its own rows). In one process (or outside ``torch.distributed``) the heads
    create every row. A sharded head built later, in ``configure_model``, is refused.

    Use it instead of :class:`SparseGradSync` for sharded heads; with other replicated
    row-sparse tables, use both (``SparseGradSync`` leaves sharded heads alone).

    Checkpoints hold the whole table, so that they load at any world size (``2 -> 1``,
    ``1 -> 2``) and serve as a one-file export: when Lightning saves, the split tables and the
    rows of their optimizer state are gathered to rank 0, which writes the file under
    Lightning's DDP strategy, onto its CPU, block by block (``O(N D)`` once per checkpoint, none
    per step; no GPU and no other rank holds the whole table; the other ranks' checkpoint
    dictionaries, which DDP does not write, keep their own rows and layout); the split heads'
    proposals (restricted to a rank's rows) are left out. On load each head cuts out its rows
    (:meth:`~lightning_sampled.heads.OutputHead.load_state_dict`'s pre-hook) and rebuilds its
    index from them (``refresh_index``), and at the start of training the optimizer's state is
    cut likewise. A head refuses a checkpoint that holds another rank's rows (an error, never a
    silent mix-up).
    """

    def __init__(self) -> None:
        self.heads: list[str] = []

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        heads = sharded_heads(pl_module)
        self.heads = head_names(heads)
        if not heads:
            rank_zero_warn("ShardedTables found no head built with sharded=True")
            return
        for _, head in heads:
            head.shard()
        if not (dist.is_available() and dist.is_initialized()):
            return
        names = {
            f"{prefix}.{name}" if prefix else name
            for prefix, head in heads
            for name, _ in (*head.named_parameters(), *head.named_buffers())
        }
        ignored = set(getattr(pl_module, "_ddp_params_and_buffers_to_ignore", ()))
        pl_module._ddp_params_and_buffers_to_ignore = sorted(ignored | names)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Refuses a sharded head that :meth:`setup` did not see (one built in
        ``configure_model``, which Lightning calls after the callbacks' ``setup``): DDP would
        have taken its rows for replicas and broadcast rank 0's over the others'."""
        late = [name for name in head_names(sharded_heads(pl_module)) if name not in self.heads]
        if late:
            raise ValueError(
                f"ShardedTables: the sharded heads {late} were built after setup (in "
                f"configure_model?), so DDP did not leave their rows alone; build them in the "
                f"LightningModule's __init__: a sharded head holds no rows until setup, where "
                f"each rank creates only its own"
            )

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        state = checkpoint["state_dict"]
        for prefix, head in split_heads(pl_module):
            for key in [k for k in state if k.startswith(f"{prefix}.sampler.")]:
                del state[key]
            whole = head.whole_table(first_rank_only=True)  # {} but on the group's first rank
            for name, table in whole.items():
                state[f"{prefix}.{name}"] = table
            if whole:
                state[f"{prefix}.shard_layout"] = torch.tensor([head.num_classes, 1, 0])
            for optimizer, saved in zip(
                trainer.optimizers, checkpoint.get("optimizer_states", []), strict=False
            ):
                for index, param in row_states(optimizer, saved, head):
                    # a new entry: optimizer.state_dict() shares its entries with the live state
                    entry = saved["state"][index] = dict(saved["state"][index])
                    for name, value in entry.items():
                        if is_per_row(value, param.shape[0]):
                            rows = whole_rows_on_first_rank(
                                value, head.shard_map, head.process_group
                            )
                            entry[name] = value if rows is None else rows

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        for _, head in sharded_heads(pl_module):
            if isinstance(head, Refreshable):  # the index of this rank's rows, not saved
                head.refresh_index()

    def on_train_start(self, trainer, pl_module) -> None:
        """Cuts the optimizer state that a checkpoint restored for the whole table to this
        rank's rows (Lightning restores it after ``on_load_checkpoint``)."""
        for _, head in split_heads(pl_module):
            ids = head.shard_ids
            for optimizer in trainer.optimizers:
                for param in (head.weight, head.bias):
                    entry = optimizer.state.get(param, {}) if param is not None else {}
                    for name, value in entry.items():
                        if is_per_row(value, head.num_classes) and value.shape[0] != len(ids):
                            entry[name] = value[ids.to(value.device)]


def split_heads(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """The heads of :func:`sharded_heads` whose table is split on this rank now."""
    return [(name, head) for name, head in sharded_heads(module) if head.is_split]


def row_states(optimizer, saved: dict, head: nn.Module) -> list[tuple[int, Tensor]]:
    """``(index, param)``: the keys in ``saved["state"]`` of the head's table and bias, and the
    parameters, found by their positions in ``optimizer``'s parameter groups (how
    ``state_dict()`` numbers them)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    return [
        (index, param)
        for index, param in enumerate(params)
        if any(param is own for own in (head.weight, head.bias)) and index in saved["state"]
    ]


def is_per_row(value: object, rows: int) -> bool:
    """Whether an optimizer state entry holds one row (or value) per class: a tensor whose first
    dimension is ``rows`` (the moments, a row-wise accumulator), not a step count."""
    return isinstance(value, Tensor) and value.dim() >= 1 and value.shape[0] == rows


def head_names(heads: list[tuple[str, nn.Module]]) -> list[str]:
    """The names of ``(name, head)`` pairs, ``"the module"`` for the LightningModule itself."""
    return [name or "the module" for name, _ in heads]


def sharded_heads(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """The submodules of ``module`` (``module`` included) that asked for a sharded table."""
    return [
        (name, child)
        for name, child in module.named_modules()
        if isinstance(child, ShardedTable) and child.sharded
    ]
