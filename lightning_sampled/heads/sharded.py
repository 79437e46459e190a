"""The exact methods of a head whose class table is split across ranks (``sharded=True``).

Rank ``r`` holds the rows :attr:`~lightning_sampled.heads.OutputHead.shard_ids` (class ``c`` on
rank ``c mod W``, :class:`~lightning_sampled.sharding.ShardMap`) and never sees the others. Every
function here is a collective: the ranks call it together, each with its own queries.

- Exact cross-entropy (vocab-parallel): the queries and targets of every rank are gathered
  (``W T (D + 1)`` numbers), each rank scores them against its rows in class chunks, and the
  per-row log-normaliser, target logit and logit sum are combined over the ranks
  (:class:`~lightning_sampled.ops.chunked.ChunkedCrossEntropy` with a
  :class:`~lightning_sampled.sharding.collectives.RankReduction`); in backward the query
  gradients (``W T D``) are summed back. Nothing sent grows with ``N``.
- Top-``k``: each rank's top-``k`` of every gathered query over its rows, then a merge of the
  ``W k`` candidates of each query (``W T k`` values and ids).
- Input lookup (:func:`sharded_embed`): the ids are gathered, each rank looks up those it holds,
  and the rows are summed over the ranks (``W T D``).

Bad input (:func:`agreed`): where the inputs are read on the host (eager CPU tensors), an input
check that fails on one rank raises on every rank, naming it, instead of leaving the others in the
call's first collective; the values every rank must share are agreed where they are used (``k``
and the ``exclude`` widths of :func:`sharded_topk`; ``N``, ``D``, the head and its settings, the
sampler's kind included, when the table is split).

Gradients: a sharded row receives the sum over ranks of their losses' gradients, divided by ``W``
(a hook on the table and the bias), the mean that DDP gives a replicated table; queries receive
their own rank's gradient (:mod:`lightning_sampled.sharding.collectives`).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .._validation import sync_free
from ..ops.chunked import chunked_nll, chunked_topk
from ..sharding.collectives import (
    RankInputError,
    RankReduction,
    all_reduce_sum,
    gather_rows,
    gathered_ints,
    one_outcome,
)

if TYPE_CHECKING:
    from .base import OutputHead


def agreed(name: str | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorates a method of a head whose first argument is a tensor (queries ``z`` or class
    ids), so that over a split table its input errors are every rank's
    (:func:`~lightning_sampled.sharding.collectives.one_outcome`, named ``Head.name``, by
    default the method's name): where that tensor is read on the host (eager CPU), an error one
    rank raises before the call's first collective is raised on every rank as
    :class:`~lightning_sampled.sharding.collectives.RankInputError`, naming it.

    On CUDA and under ``torch.compile`` (:func:`~lightning_sampled._validation.sync_free`) the
    call stays free of host syncs: its value checks are device asserts (``torch._assert_async``)
    and nothing is agreed, so a rank whose assert fires stops, and the others wait in their
    next collective until the process group's timeout. Bound that wait: NCCL's watchdog
    (``TORCH_NCCL_ASYNC_ERROR_HANDLING=3``, torch's default, or ``1``, which also aborts the
    communicator; never ``0``) tears every process down once a collective has waited the
    group's ``timeout``: set it short, ``init_process_group("nccl", timeout=timedelta(
    minutes=2))`` or Lightning's ``DDPStrategy(timeout=timedelta(minutes=2))`` (the default is
    ``torch.distributed.constants.default_pg_nccl_timeout``).
    """

    def decorate(method: Callable[..., Any]) -> Callable[..., Any]:
        what = name or method.__name__

        @functools.wraps(method)
        def call(head: OutputHead, x: Any, *args: Any, **kwargs: Any) -> Any:
            if not head.is_split or (isinstance(x, Tensor) and sync_free(x)):
                return method(head, x, *args, **kwargs)
            with one_outcome(f"{type(head).__name__}.{what}", head.process_group):
                return method(head, x, *args, **kwargs)

        return call

    return decorate


def shared_settings(head: OutputHead) -> dict[str, str]:
    """The settings of ``head`` that every rank must share before its table is split: the
    ``name=value`` items of its ``extra_repr`` (``num_classes``, ``dim``, ``padding_idx``, the
    sampler's kind, the number of negatives, the convention, ...), values as text."""
    items = re.split(r", (?=\w+=)", head.extra_repr())
    return dict(item.split("=", 1) for item in items if "=" in item)


def sharded_nll(
    head: OutputHead, queries: Tensor, target: Tensor, label_smoothing: float = 0.0
) -> Tensor:
    """Exact per-row (label-smoothed) cross-entropy ``[T]`` of this rank's scored ``queries``
    ``[T, D]`` and global ``target`` ``[T]`` over the whole sharded table of ``head``."""
    shard_map, group = head.shard_map, head.process_group
    every_query, own = gather_rows(queries, group)
    every_target, _ = gather_rows(target, group)
    losses = chunked_nll(
        every_query,
        head.class_table(),
        head.bias,
        shard_map.local_or(every_target),
        head.chunk_for(every_target.numel()),
        shard_map.local_padding(head.padding_idx),
        normalize=head.normalize,
        label_smoothing=label_smoothing,
        shards=RankReduction(head.num_classes, head.padding_idx, group),
    )
    return losses[own]


@torch.no_grad()
def sharded_topk(
    head: OutputHead, queries: Tensor, k: int, exclude: Tensor | None
) -> tuple[Tensor, Tensor]:
    """Exact top-``k`` ``(values [T, k], global ids [T, k])`` of this rank's scored ``queries``
    ``[T, D]`` over the whole sharded table; ``exclude`` long ``[T, E]`` global ids (negative:
    none) as in :meth:`~lightning_sampled.heads.OutputHead.topk`. Ranks beyond the scorable
    classes hold ``-inf`` (the caller turns their ids into ``-1``).

    The ranks first agree on ``k`` and the widths ``E`` of ``exclude`` (one ``all_gather`` of
    two numbers): a ``k`` that differs raises :class:`~lightning_sampled.sharding.collectives.
    RankInputError` on every rank; ``exclude`` is padded with ``-1`` to the widest rank's
    (a rank without one passes none: ``[T, 0]``).
    """
    shard_map, group = head.shard_map, head.process_group
    width = -1 if exclude is None else exclude.shape[1]
    every = gathered_ints({"k": k, "exclude": width}, queries.device, group)
    if len(set(every["k"])) > 1:
        raise RankInputError(
            f"the ranks disagree on {type(head).__name__}.topk: {{'k': {every['k']}}} (one "
            f"value per rank); every rank must ask for the same k"
        )
    every_query, own = gather_rows(queries, group)
    local_exclude = None
    if max(every["exclude"]) >= 0:
        if exclude is None:
            exclude = torch.empty((queries.shape[0], 0), dtype=torch.long, device=queries.device)
        exclude = F.pad(exclude, (0, max(every["exclude"]) - exclude.shape[1]), value=-1)
        local_exclude = shard_map.local_or(gather_rows(exclude, group)[0])
    table = head.class_table()
    local_k = min(k, table.shape[0])
    values, local_ids = chunked_topk(
        every_query,
        table,
        head.bias,
        local_k,
        head.chunk_for(every_query.shape[0]),
        shard_map.local_padding(head.padding_idx),
        local_exclude,
        normalize=head.normalize,
    )
    values = F.pad(values, (0, k - local_k), value=-math.inf)
    ids = F.pad(shard_map.global_ids(local_ids), (0, k - local_k), value=-1)
    # every rank's candidates [W, T_all, k], of this rank's queries, then the best k of W k
    world, num_rows = shard_map.world_size, every_query.shape[0]
    values, ids = (
        gather_rows(x, group)[0].reshape(world, num_rows, k)[:, own].transpose(0, 1).flatten(1)
        for x in (values, ids)
    )
    best, at = values.topk(k, dim=1)
    return best, ids.gather(1, at)


def sharded_embed(head: OutputHead, ids: Tensor) -> Tensor:
    """Rows ``[*ids.shape, D]`` of the global class ``ids`` (any shape) from the sharded table of
    ``head``, differentiable (row-sparse with ``head.sparse_grad``); the padding class gives
    zeros."""
    shard_map, group = head.shard_map, head.process_group
    every_id, own = gather_rows(ids.reshape(-1), group)
    local = shard_map.local_or(every_id)
    if head.padding_idx is not None:
        local = local.masked_fill(every_id == head.padding_idx, -1)
    rows = F.embedding(local.clamp(min=0), head.weight, sparse=head.sparse_grad)
    rows = rows * (local >= 0)[:, None].to(rows.dtype)
    return all_reduce_sum(rows, group)[own].reshape(*ids.shape, head.dim)
