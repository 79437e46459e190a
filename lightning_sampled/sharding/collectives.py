"""The collectives a sharded class table needs, differentiable where a loss flows through them.

Every function here is a collective over ``group`` (default: the world): every rank of the group
calls it, in the same order, or the ranks wait forever. Outside ``torch.distributed`` (or in a
group of one) each is the identity, so a sharded head runs unchanged in one process.

Gradients follow what a DDP step means: every rank back-propagates its own loss ``L_r``, and the
backward passes here deliver to each rank's tensors the gradient of ``sum_r L_r``. A rank's
queries affect only its own loss, so they receive ``dL_r / dz_r``, as without sharding; the rows of
a sharded table receive ``sum_r dL_r / dw``, which the head divides by ``W`` to give the mean over
ranks that DDP gives a replicated table.

Bad input on one rank must not leave the others waiting in a collective (30 minutes, gloo's
default timeout) or failing on a garbled message: :func:`one_outcome` runs a call of a split head
so that an error one rank raises before the call's first collective is raised by every rank,
naming the failing rank (every collective here first settles that agreement:
:func:`settle_pending`).
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.distributed.nn.functional
from torch import Tensor


def unbind_world_defaults() -> None:
    """Makes the functions of ``torch.distributed.nn.functional`` take ``group=None`` (the
    world, looked up at each call) as their default instead of a process group object.

    That module writes ``group=group.WORLD`` as a default argument, evaluated once, at its
    import: ``None`` before ``init_process_group``, the world group itself after. Imported after
    it (by this library, or by ``torch._dynamo``, which an optimizer's first step imports), the
    defaults keep the world group alive after ``destroy_process_group``, so gloo's worker
    threads outlive it, and one that releases a finished collective while the interpreter exits
    aborts the process ("terminate called without an active exception", SIGABRT at exit; 2 in 5
    two-rank runs of a script that imported the library after ``init_process_group``). This
    module imports that one and calls this at its own import, so that neither import order
    leaves such a default behind (``tests/sharding/test_import_after_init.py``); ``None`` is
    what the defaults are when imported before the group, and means the same group.
    """
    if not dist.is_available():
        return
    for function in vars(torch.distributed.nn.functional).values():
        defaults = function.__defaults__ if inspect.isfunction(function) else None
        if defaults and any(isinstance(value, dist.ProcessGroup) for value in defaults):
            function.__defaults__ = tuple(
                None if isinstance(value, dist.ProcessGroup) else value for value in defaults
            )


unbind_world_defaults()


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


class RankInputError(ValueError):
    """The error every rank of a group raises when a call failed on some of them before its
    first collective, or when the ranks passed different values that they must share
    (:func:`one_outcome`); the message names the ranks and their errors or values."""


#: the call of :func:`one_outcome` running in this thread, or ``None``
_running = threading.local()


class _Call:
    """A call of :func:`one_outcome` whose ranks have not agreed yet (``pending``)."""

    def __init__(self, what: str, group, shared: dict[str, int]) -> None:
        self.what, self.group, self.shared = what, group, shared
        self.pending = True

    def settle(self, error: Exception | None) -> None:
        """One ``all_gather`` of ``[failed, *shared]`` (a few integers); where a rank failed, a
        second one of the errors' texts. Raises :class:`RankInputError` on every rank unless no
        rank failed and every rank passed the same ``shared`` values."""
        self.pending = False
        world, _ = world_and_rank(self.group)
        backend = str(dist.get_backend(self.group))
        device = torch.device("cpu") if "gloo" in backend else torch.device("cuda")
        values = [0] * len(self.shared) if error is not None else list(self.shared.values())
        mine = torch.tensor([int(error is not None), *values], dtype=torch.long, device=device)
        every = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(every, mine, group=self.group)
        rows = torch.stack(every).tolist()
        failed = [rank for rank, row in enumerate(rows) if row[0]]
        if failed:
            texts: list[str | None] = [None] * world
            text = None if error is None else f"{type(error).__name__}: {error}"
            dist.all_gather_object(texts, text, group=self.group)
            which = ("rank " if len(failed) == 1 else "ranks ") + ", ".join(map(str, failed))
            detail = "; ".join(f"rank {rank}: {texts[rank]}" for rank in failed)
            raise RankInputError(
                f"{self.what} failed on {which} of {world} ({detail}); every rank raises this "
                f"error instead of waiting for the others in a collective"
            ) from error
        differ = {
            name: [row[1 + index] for row in rows]
            for index, name in enumerate(self.shared)
            if len({row[1 + index] for row in rows}) > 1
        }
        if differ:
            raise RankInputError(
                f"the ranks disagree on {self.what}: {differ} (one value per rank); every rank "
                f"must pass the same"
            )


@contextmanager
def one_outcome(
    what: str, group=None, *, shared: dict[str, int] | None = None, enabled: bool = True
) -> Iterator[None]:
    """Runs a call of a split head (``what`` names it in errors) so that its ranks fail
    together: an error raised on one rank before the call's first collective over ``group``
    (an input check: a target out of range, a bad ``k``) is raised on every rank as
    :class:`RankInputError`, naming the failing ranks and their errors, where the others would
    wait in that collective until the group's timeout.

    The agreement is one small ``all_gather`` per call, made at the call's first collective
    (every collective of this module calls :func:`settle_pending` first), or at the end of a
    call that made none, or, on the failing rank, where it raised. Every rank must enter the
    call, as it must call every collective. ``shared`` are integers every rank must pass alike
    (e.g. ``num_new`` of ``add_classes``), compared in the same message; they are read when
    the agreement is made, so pass values that the call's checks accept. A call inside another
    one agrees with it. A no-op with ``enabled=False`` and outside ``torch.distributed``.

    Where the step must not sync the host (CUDA tensors, ``torch.compile``:
    :func:`~lightning_sampled._validation.sync_free`) the heads run their calls without it
    (``enabled=False``): their checks are then device asserts, and a failing rank ends at the
    process group's timeout (``README.md``, "More classes than one device holds").
    """
    if not enabled or not is_distributed(group) or getattr(_running, "call", None) is not None:
        yield
        return
    call = _running.call = _Call(what, group, dict(shared or {}))
    try:
        try:
            yield
        except Exception as error:
            if call.pending:
                call.settle(error)
            raise
        if call.pending:
            call.settle(None)
    finally:
        _running.call = None


def settle_pending() -> None:
    """Makes the agreement of the :func:`one_outcome` call running in this thread, if it has not
    been made: what every collective does first, so that a rank that failed before it and the
    ranks that reached it meet in the same ``all_gather``."""
    call = getattr(_running, "call", None)
    if call is not None and call.pending:
        call.settle(None)


def gathered_sizes(count: int, device: torch.device, group=None) -> list[int]:
    """Every rank's ``count`` (e.g. its number of scored positions), in rank order."""
    if not is_distributed(group):
        return [count]
    settle_pending()
    world, _ = world_and_rank(group)
    sizes = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([count], device=device), group=group)
    return [int(s) for s in sizes]


def gathered_ints(values: dict[str, int], device: torch.device, group=None) -> dict[str, list]:
    """Every rank's ``values`` (integers), one list per name in rank order: one ``all_gather``
    of ``len(values)`` numbers on ``device``."""
    if not is_distributed(group):
        return {name: [value] for name, value in values.items()}
    settle_pending()
    world, _ = world_and_rank(group)
    mine = torch.tensor(list(values.values()), dtype=torch.long, device=device)
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine, group=group)
    columns = torch.stack(every).T.tolist()
    return dict(zip(values, columns, strict=True))


def all_gather_padded(x: Tensor, sizes: list[int], group=None) -> list[Tensor]:
    """Every rank's ``x`` ``[sizes[r], ...]``, sent padded to the longest and trimmed again."""
    settle_pending()
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
    settle_pending()
    if torch.is_grad_enabled() and x.requires_grad:
        return _AllReduceSum.apply(x, group)
    out = x.contiguous().clone()
    dist.all_reduce(out, group=group)
    return out


def all_reduce_max(x: Tensor, group=None) -> Tensor:
    """The element-wise maximum of ``x`` over the ranks, a new tensor, not differentiable."""
    out = x.detach().contiguous().clone()
    if is_distributed(group):
        settle_pending()
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
    """:class:`RankInputError` (a ``ValueError``) on every rank, never a hang, unless every rank of
    ``group`` passes equal ``values``, naming those that differ and each rank's value of them."""
    if not is_distributed(group):
        return
    settle_pending()
    world, _ = world_and_rank(group)
    everyone: list[dict[str, object] | None] = [None] * world
    dist.all_gather_object(everyone, values, group=group)
    differ = {name for name in values if any(v[name] != values[name] for v in everyone)}
    if differ:
        seen = {name: [v[name] for v in everyone] for name in sorted(differ)}
        raise RankInputError(f"the ranks disagree on {what}: {seen} (one value per rank)")


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
            settle_pending()
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
    settle_pending()
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
    settle_pending()
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
