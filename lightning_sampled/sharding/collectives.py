"""The collectives a sharded class table needs, differentiable where a loss flows through them.

Every function here is a collective over ``group`` (default: the world): every rank of the group
calls it, in the same order, or the ranks wait forever. Outside ``torch.distributed`` (or in a
group of one) each is the identity, so a sharded head runs unchanged in one process.

Gradients follow what a DDP step means: every rank back-propagates its own loss ``L_r``, and the
backward passes here deliver to each rank's tensors the gradient of ``sum_r L_r``. A rank's
queries affect only its own loss, so they receive ``dL_r / dz_r``, as without sharding; the rows of
a sharded table receive ``sum_r dL_r / dw``, which the head divides by ``W`` to give the mean over
ranks that DDP gives a replicated table.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

# Imported for a side effect, before any process group exists: this module's functions take
# ``group=group.WORLD`` as a default argument, evaluated at its import. Imported after
# ``init_process_group`` (as ``torch._dynamo`` does on an optimizer's first step), they keep the
# world group alive after ``destroy_process_group``, so gloo's worker threads outlive it and one
# that releases a finished collective while the interpreter exits aborts the process ("terminate
# called without an active exception", SIGABRT at exit; measured in 1 of ~30 two-rank runs).
import torch.distributed.nn.functional  # noqa: F401
from torch import Tensor


def as_process_group(group):
    """The process group of ``group``: a one-dimensional ``DeviceMesh`` (e.g. ``mesh["dp"]`` of
    a larger mesh) gives its ``get_group()``; a process group or ``None`` (the world) stays."""
    from torch.distributed.device_mesh import DeviceMesh

    return group.get_group() if isinstance(group, DeviceMesh) else group


def is_distributed(group=None) -> bool:
    """Whether ``torch.distributed`` is initialised with more than one rank in ``group``."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1


def world_and_rank(group=None) -> tuple[int, int]:
    """``(W, r)``: the size of ``group`` and this process's rank in it; ``(1, 0)`` outside
    ``torch.distributed``."""
    if not (dist.is_available() and dist.is_initialized()):
        return 1, 0
    return dist.get_world_size(group), dist.get_rank(group)


def gathered_sizes(count: int, device: torch.device, group=None) -> list[int]:
    """Every rank's ``count`` (e.g. its number of scored positions), in rank order."""
    if not is_distributed(group):
        return [count]
    world, _ = world_and_rank(group)
    sizes = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([count], device=device), group=group)
    return [int(s) for s in sizes]


def all_gather_padded(x: Tensor, sizes: list[int], group=None) -> list[Tensor]:
    """Every rank's ``x`` ``[sizes[r], ...]``, sent padded to the longest and trimmed again."""
    world, rank = world_and_rank(group)
    longest = max(sizes)
    padded = x.new_zeros((longest, *x.shape[1:]))
    padded[: x.shape[0]] = x
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded.contiguous(), group=group)
    return [part[:size] for part, size in zip(parts, sizes, strict=True)]


class _GatherRows(torch.autograd.Function):
    """All ranks' rows, concatenated in rank order; backward: the gradient summed over the ranks
    (each rank holds a part of it), this rank's rows kept."""

    @staticmethod
    def forward(ctx, x: Tensor, sizes: list[int], group) -> Tensor:
        _, rank = world_and_rank(group)
        ctx.group = group
        ctx.start = sum(sizes[:rank])
        ctx.count = sizes[rank]
        return torch.cat(all_gather_padded(x, sizes, group))

    @staticmethod
    def backward(ctx, grad: Tensor):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad[ctx.start : ctx.start + ctx.count], None, None


def gather_rows(x: Tensor, group=None) -> tuple[Tensor, slice]:
    """Every rank's rows of ``x`` ``[T_r, ...]`` (``T_r`` may differ), concatenated in rank order.

    Returns:
        ``(rows [sum_r T_r, ...], own)``, where ``rows[own]`` are this rank's ``x``. Differentiable:
        ``x`` receives the sum over ranks of the gradient of its rows.
    """
    sizes = gathered_sizes(x.shape[0], x.device, group)
    if len(sizes) == 1:
        return x, slice(0, x.shape[0])
    _, rank = world_and_rank(group)
    start = sum(sizes[:rank])
    own = slice(start, start + sizes[rank])
    if not (torch.is_grad_enabled() and x.requires_grad):
        return torch.cat(all_gather_padded(x, sizes, group)), own
    return _GatherRows.apply(x, sizes, group), own


class _AllReduceSum(torch.autograd.Function):
    """The sum over ranks; backward: the sum over ranks of the gradient."""

    @staticmethod
    def forward(ctx, x: Tensor, group) -> Tensor:
        ctx.group = group
        out = x.contiguous().clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def all_reduce_sum(x: Tensor, group=None) -> Tensor:
    """The sum of ``x`` over the ranks, a new tensor; differentiable (see the module docstring)."""
    if not is_distributed(group):
        return x
    if torch.is_grad_enabled() and x.requires_grad:
        return _AllReduceSum.apply(x, group)
    out = x.contiguous().clone()
    dist.all_reduce(out, group=group)
    return out


def all_reduce_max(x: Tensor, group=None) -> Tensor:
    """The element-wise maximum of ``x`` over the ranks, a new tensor, not differentiable."""
    out = x.detach().contiguous().clone()
    if is_distributed(group):
        dist.all_reduce(out, op=dist.ReduceOp.MAX, group=group)
    return out


def combined_logsumexp(local: Tensor, group=None, once: Tensor | None = None) -> Tensor:
    """``log(exp(once) + sum_r exp(local_r))``, element-wise over ranks' ``local`` ``[...]``.

    Each rank passes the log-sum-exp of its own part of a sum of exponentials (its classes'
    logits); ``once`` is a term every rank holds alike (e.g. a positive's logit), counted once.
    The shift is the maximum over ranks (detached: the result does not depend on it); rows whose
    terms are all ``-inf`` give ``-inf``. Differentiable in ``local`` and ``once``.
    """
    shift = all_reduce_max(local, group)
    if once is not None:
        shift = torch.maximum(shift, once.detach())
    shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
    total = all_reduce_sum(torch.exp(local - shift), group)
    if once is not None:
        total = total + torch.exp(once - shift)
    return shift + torch.log(total)


def check_same_on_every_rank(values: dict[str, object], what: str, group=None) -> None:
    """``ValueError`` on every rank (never a hang) unless every rank of ``group`` passes equal
    ``values``, naming those that differ and each rank's value of them."""
    if not is_distributed(group):
        return
    world, _ = world_and_rank(group)
    everyone: list[dict[str, object] | None] = [None] * world
    dist.all_gather_object(everyone, values, group=group)
    differ = {name for name in values if any(v[name] != values[name] for v in everyone)}
    if differ:
        seen = {name: [v[name] for v in everyone] for name in sorted(differ)}
        raise ValueError(f"the ranks disagree on {what}: {seen} (one value per rank)")


class RankReduction:
    """What turns sums over one rank's classes into sums over all classes: the exact
    cross-entropy over a sharded table (:class:`~lightning_sampled.ops.chunked
    .ChunkedCrossEntropy`) computes its per-row log-normaliser, target logit and logit sum over
    the local rows, then combines them here, outside autograd (its backward reduces the incoming
    gradient with :meth:`sum_` instead).

    Args:
        num_classes: ``N``, the classes of the whole table.
        padding_idx: the whole table's padding class (global id) or ``None``.
        group: the process group the table is split over.
    """

    def __init__(self, num_classes: int, padding_idx: int | None, group=None) -> None:
        self.whole_table = (num_classes, padding_idx)
        self.group = group

    def sum_(self, x: Tensor) -> Tensor:
        """In place: ``x`` summed over the ranks."""
        if is_distributed(self.group):
            dist.all_reduce(x, group=self.group)
        return x

    def logsumexp(self, local: Tensor) -> Tensor:
        """``log sum_r exp(local_r)`` element-wise (:func:`combined_logsumexp`)."""
        return combined_logsumexp(local, self.group)


def whole_rows(local: Tensor, shard_map, group=None) -> Tensor:
    """The whole ``[N, ...]`` table of which every rank holds its rows ``local`` ``[N_r, ...]``
    (:class:`~lightning_sampled.sharding.ShardMap`), on every rank, on ``local``'s device: an
    ``O(N)`` all-gather, for checkpoints and exports, never for a training step."""
    if not is_distributed(group):
        return local
    world = shard_map.world_size
    parts = all_gather_padded(local, [shard_map.num_local(r) for r in range(world)], group)
    whole = local.new_empty((shard_map.num_classes, *local.shape[1:]))
    for rank, part in enumerate(parts):
        whole[rank::world] = part
    return whole


#: local rows per message of :func:`whole_rows_on_first_rank`
GATHER_BLOCK_ROWS = 65_536


def whole_rows_on_first_rank(
    local: Tensor, shard_map, group=None, block_rows: int = GATHER_BLOCK_ROWS
) -> Tensor | None:
    """The whole ``[N, ...]`` table of which every rank holds its rows ``local`` ``[N_r, ...]``
    (:class:`~lightning_sampled.sharding.ShardMap`), on the CPU of the group's first rank only
    (``None`` on the others): what a checkpoint written by one rank needs, without every rank
    (or any GPU) holding ``O(N)``. Sent in blocks of ``block_rows`` local rows per rank (one
    ``gather`` each), so beyond the result the first rank holds ``O(W B)`` rows at a time and
    the others ``O(B)``."""
    if not is_distributed(group):
        return local.detach().cpu()
    world, rank = world_and_rank(group)
    first = dist.get_global_rank(group, 0) if group is not None else 0
    whole = local.new_empty((shard_map.num_classes, *local.shape[1:]), device="cpu")
    longest = shard_map.num_local(0)  # shards differ by at most one row, rank 0's the longest
    for start in range(0, longest, block_rows):
        block = local.new_zeros((min(block_rows, longest - start), *local.shape[1:]))
        part = local.detach()[start : start + block.shape[0]]
        block[: part.shape[0]] = part
        parts = [torch.empty_like(block) for _ in range(world)] if rank == 0 else None
        dist.gather(block, parts, dst=first, group=group)
        if rank == 0:
            for owner, received in enumerate(parts):
                rows = min(block.shape[0], shard_map.num_local(owner) - start)
                ids = torch.arange(start, start + rows) * world + owner
                whole[ids] = received[:rows].cpu()
    return whole if rank == 0 else None
