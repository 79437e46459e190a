"""``SparseGradSync``: row-sparse class-table gradients reduced across DDP ranks by dense
collectives, so that ``sparse_grad=True`` trains under DDP on NCCL as on gloo."""

from __future__ import annotations

import lightning.pytorch as pl
import torch.distributed as dist
from torch import nn

from ..optim.sparse_all_reduce import all_reduce_row_sparse
from ..protocols import ShardedTable, SparseGradTable


class SparseGradSync(pl.Callback):
    """Keeps the row-sparse class tables out of DDP's gradient all-reduce and averages their
    gradients over the ranks with dense collectives
    (:func:`~lightning_sampled.optim.sparse_all_reduce.all_reduce_row_sparse`).

    DDP reduces a sparse gradient with a sparse all-reduce, which gloo has and NCCL does not
    (``ProcessGroupNCCL::allreduce_sparse`` raises). With this callback the tables are listed in
    the LightningModule's ``_ddp_params_and_buffers_to_ignore`` (read by DDP when Lightning wraps
    the module, after the callbacks' ``setup``), broadcast from rank 0 once (DDP would have), and
    their gradients are averaged just before each optimizer step (after gradient accumulation,
    before clipping), every rank sending its touched rows only: ``O(W U D)`` per step for ``U``
    touched rows, whatever the table's ``N``. The result equals DDP's gloo sparse all-reduce.

    The tables are the ``weight`` of every :class:`~lightning_sampled.protocols.SparseGradTable`
    whose ``sparse_grad`` is on (every head that owns a table) and of every
    ``nn.Embedding(sparse=True)``; a table tied to both counts once; the heads built with
    ``sharded=True`` are left to :class:`ShardedTables` (their rows are not replicated). Outside
    ``torch.distributed`` (one process) the callback does nothing.

    Args:
        process_group: the group to average over (default: the world, as DDP's).
    """

    def __init__(self, process_group=None) -> None:
        self.process_group = process_group
        self.tables: list[nn.Parameter] = []

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.tables = []
        if stage != "fit" or not (dist.is_available() and dist.is_initialized()):
            return
        tables = sparse_tables(pl_module)
        names = [
            name
            for name, param in pl_module.named_parameters(remove_duplicate=False)
            if any(param is table for table in tables)
        ]
        ignored = set(getattr(pl_module, "_ddp_params_and_buffers_to_ignore", ()))
        pl_module._ddp_params_and_buffers_to_ignore = sorted(ignored | set(names))
        source = dist.get_global_rank(self.process_group, 0) if self.process_group else 0
        for table in tables:
            dist.broadcast(table.data, src=source, group=self.process_group)
        self.tables = tables

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        for table in self.tables:
            table.grad = all_reduce_row_sparse(table, self.process_group)


def sparse_tables(module: nn.Module) -> list[nn.Parameter]:
    """The distinct row-sparse tables of ``module``, in the order of ``named_modules``: the
    ``weight`` of every :class:`SparseGradTable` with ``sparse_grad`` on (but not sharded) and of
    every ``nn.Embedding(sparse=True)``."""
    tables: list[nn.Parameter] = []
    for child in module.modules():
        if isinstance(child, ShardedTable) and child.sharded:
            continue
        sparse_head = isinstance(child, SparseGradTable) and child.sparse_grad
        sparse_lookup = isinstance(child, nn.Embedding) and child.sparse
        if (sparse_head or sparse_lookup) and not any(child.weight is t for t in tables):
            tables.append(child.weight)
    return tables
