"""In-batch negatives and their mixture with sampled ones (mixed negative sampling).

For a scored position ``t``, the targets of the other ``T - 1`` positions are ``T - 1`` draws from
the targets' distribution ``q_b`` (estimated by
:class:`~lightning_sampled.samplers.frequency.TargetFrequency`); the sampler adds ``M`` draws from
its own ``q_s``. Both sets together estimate the softmax normaliser by multiple importance
sampling with the balance heuristic: every candidate ``j``, whichever set it came from, is
corrected by

    ``log(M q_s(j) + (T - 1) q_b(j))``,

which is unbiased for ``sum_j exp(o_j)`` when the draws are independent of each other and of the
query (true of shuffled examples; positions of one sequence share a user, so there it is an
approximation). With ``M = 0`` it is the logQ correction of in-batch softmax, ``log((T - 1) q_b)``.

A batch's targets repeat (popular items, frequent words), so the in-batch candidates are its
distinct targets, each weighted by how many *other* positions hold it. On a GPU, at any number
of positions, and under ``torch.compile`` on the CPU up to :data:`FIXED_SHAPE_POSITIONS`, they
are found by a sort in fixed shapes (:func:`sorted_candidates`: ``min(T, N)`` columns, the
repeats, the left-out positions and the unused columns weighted 0): no ``torch.unique``, so no
host sync and no graph break, at the price of ``[T, min(T, N)]`` logits instead of ``[T, U]``
(the head scores them a block of rows at a time, so memory stays bounded); elsewhere by
``torch.unique`` (:func:`distinct_candidates`: ``U`` columns), which on the CPU is the cheaper
(``benchmarks/in_batch_step.py``: there the sorted step costs up to twice as much, at 4,096
positions). A position left out (an ignored position kept, weighted 0, for static shapes) is
neither a candidate nor a draw.

The ``[T, U]`` block grows with the batch (``U`` approaches ``T`` over a large catalog). Where
every row shares the candidates and their correction, :func:`in_batch_logsumexp` reduces it to
one column per row, the log-sum-exp of the corrected block, a chunk of candidates at a time:
the three ``[T, U, D]`` products and one more that recomputes each chunk in backward, and no
``[T, U]`` tensor kept (``benchmarks/results/default_cost.md`` has what each costs).

A limit ``K`` on the in-batch draws (``max_in_batch_draws``) bounds the work at ``[T, K]``: each
row draws its own ``K`` of the other scored positions, uniformly with replacement
(:func:`drawn_per_group`), and their targets are its candidates, each a column of its own
corrected by ``log(M q_s + K q_b)`` like a sampled draw. Rows draw independently, so the noise
of the draws averages over the batch as per-query negatives' does: ``K`` positions shared by
every row instead (this module's first bounded form) carry the noise of shared negatives, which
cost the MovieLens-1M recommenders of issue 31's grid half their NDCG@10. Between the two,
groups of ``g`` consecutive rows (``in_batch_group_size``) share ``K`` positions drawn from
outside the group: one ``[g, D] x [D, K]`` product per group instead of ``K`` gathered vectors
per row, and the noise averages over ``T / g`` groups.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .._random import rand
from .._validation import sync_free
from ..samplers.frequency import counted
from .chunked import chunked_logsumexp, shift_cells_

#: the most scored positions whose candidates :func:`batch_candidates` finds in fixed shapes under
#: ``torch.compile`` on the CPU (``[T, T]`` products: 16.8 million logits at 4,096 positions); on a
#: GPU there is no limit
FIXED_SHAPE_POSITIONS = 4096
#: elements of one ``[T, C]`` block of :func:`in_batch_logsumexp`'s logits (16 MiB in fp32): a
#: quarter of the exact head's block, since it comes beside the rest of a sampled step (the
#: table's gradient, the row blocks' inputs) instead of being all of it
POOLED_BLOCK_ELEMENTS = 2**22
#: how :func:`batch_candidates` finds the candidates
CANDIDATE_METHODS = ("auto", "sorted", "distinct")
#: a key above every class id: left-out positions sort after every target
_BEYOND = torch.iinfo(torch.long).max


class BatchCandidates(NamedTuple):
    """The distinct targets of a batch.

    Attributes:
        ids: long ``[U]`` the candidates, sorted (a class id in every column, repeated or left
            out ones included).
        counts: long ``[U]`` how many positions hold each: 0 for a column that is not a
            candidate (a repeat of the column before, or a left-out position's).
        column: long ``[T]`` each position's own target's index in ``ids`` (``-1`` where it
            is not among them: a left-out position, or a target a rank of a split table does
            not hold).
    """

    ids: Tensor
    counts: Tensor
    column: Tensor


def batch_candidates(
    target: Tensor,
    mask: Tensor | None = None,
    method: str = "auto",
    num_classes: int | None = None,
) -> BatchCandidates:
    """The distinct targets of a batch of targets ``[T]`` (long) but the positions ``mask``
    (bool ``[T]``) leaves out, with their multiplicities, by ``method``
    (:data:`CANDIDATE_METHODS`): ``"sorted"`` (:func:`sorted_candidates`, at most
    ``num_classes`` columns and one for the left-out positions), ``"distinct"``
    (:func:`distinct_candidates`) or ``"auto"``, sorted where the shapes must not depend on the
    targets (:func:`~lightning_sampled._validation.sync_free`): on a GPU at any ``T``, on the
    CPU (under ``torch.compile``) up to :data:`FIXED_SHAPE_POSITIONS`; else distinct."""
    if method == "auto":
        small = target.device.type != "cpu" or target.numel() <= FIXED_SHAPE_POSITIONS
        method = "sorted" if sync_free(target) and small else "distinct"
    if method == "sorted":
        return sorted_candidates(target, mask, num_classes)
    return distinct_candidates(target, mask)


def distinct_candidates(target: Tensor, mask: Tensor | None = None) -> BatchCandidates:
    """:func:`batch_candidates` by ``torch.unique``: one column per distinct target (one more,
    of count 0, when ``mask`` leaves positions out); a host sync on a GPU."""
    if mask is None:
        ids, column, counts = torch.unique(target, return_inverse=True, return_counts=True)
        return BatchCandidates(ids, counts, column)
    key = counted(target, mask, _BEYOND)
    ids, column, counts = torch.unique(key, return_inverse=True, return_counts=True)
    beyond = ids == _BEYOND
    stand_in = target.reshape(-1)[:1].expand_as(ids)  # any class id; its count is 0
    return BatchCandidates(
        ids.where(~beyond, stand_in), counts.masked_fill(beyond, 0), column.where(mask, -1)
    )


def sorted_candidates(
    target: Tensor, mask: Tensor | None = None, num_classes: int | None = None
) -> BatchCandidates:
    """:func:`batch_candidates` in fixed shapes: the ``T`` targets sorted, each run of equal
    ones counted in its first column (the others, and the left-out positions, count 0), each
    position's column that first one (``-1`` if left out). A sort and three binary searches; no
    shape depends on the targets.

    Where ``num_classes`` leaves fewer possible runs than positions (``N < T``, one run more for
    the left-out positions), the runs are moved to the first ``W = N (+ 1)`` columns in their
    sorted order (:func:`_compacted`): ``[T, W]`` logits instead of ``[T, T]``, e.g. at a
    recommender's 25,600 positions over 3,706 items."""
    key = counted(target, mask, _BEYOND)
    ordered, order = key.sort()
    start = torch.searchsorted(ordered, ordered)  # each run's first column
    first = start == torch.arange(ordered.numel(), device=ordered.device)
    counts = torch.searchsorted(ordered, ordered, right=True) - start
    counts = counts.masked_fill(~first | (ordered == _BEYOND), 0)
    column = torch.searchsorted(ordered, key)
    if mask is not None:
        column = column.where(mask, -1)
    # a left-out position's column holds its own (stand-in) target: a class id, counted 0
    candidates = BatchCandidates(target.index_select(0, order), counts, column)
    width = None if num_classes is None else num_classes + (mask is not None)
    if width is None or width >= target.numel():
        return candidates
    return _compacted(candidates, start, first, width)


def _compacted(
    candidates: BatchCandidates, start: Tensor, first: Tensor, width: int
) -> BatchCandidates:
    """:func:`sorted_candidates`' runs (``start`` ``[T]``: each sorted column's run's first
    column; ``first``: bool ``[T]``, whether a column is its run's first) moved to their rank
    among the runs, in ``width`` columns (at least the number of runs): every position of a run
    writes the id of the run's first column and adds its count (non-zero at the first only) to
    the run's column; the columns no run reaches hold the largest candidate id, counted 0, so
    the ids stay sorted where they count."""
    run = first.long().cumsum(0) - 1  # each sorted position's run
    ids = candidates.ids.max().expand(width).clone()
    ids = ids.scatter(0, run, candidates.ids.gather(0, start))  # equal writes: deterministic
    counts = torch.zeros(width, dtype=candidates.counts.dtype, device=run.device)
    counts = counts.scatter_add(0, run, candidates.counts)
    column = run.gather(0, candidates.column.clamp(min=0))
    return BatchCandidates(ids, counts, column.where(candidates.column >= 0, -1))


def drawn_per_group(
    num_positions: int,
    limit: int,
    group_size: int,
    mask: Tensor | None,
    generator: torch.Generator | None,
    device: torch.device,
) -> Tensor:
    """long ``[G, limit]``: ``limit`` positions for each group of ``group_size`` consecutive rows
    (``G = ceil(num_positions / group_size)``, the last group the rest), drawn uniformly with
    replacement from the scored positions (bool ``mask`` ``[T]``; ``None``: all) outside the
    group (with ``group_size=1``, every scored position but the row's own), by uniform keys
    from ``generator`` (``None``: torch's default): independent across groups, so their noise
    averages over the batch's ``G`` groups as per-query draws' does over its rows. A group with
    no scored position outside it draws meaningless positions:
    :meth:`~lightning_sampled.heads.SampledSoftmaxHead.batch_proposal` counts its draws 0.
    Fixed shapes, no host sync: the ``r``-th scored position outside a group is found by a
    binary search in the scored positions' running count."""
    num_groups = -(-num_positions // group_size)
    keys = rand((num_groups, limit), device, generator, torch.float64)
    starts = torch.arange(num_groups, device=device) * group_size
    ends = (starts + group_size).clamp(max=num_positions)
    if mask is None:
        before, inside, scored = starts, ends - starts, num_positions
    else:
        running = torch.cat([mask.new_zeros(1, dtype=torch.long), mask.long().cumsum(0)])
        before, scored = running[starts], running[-1]  # scored positions before each group
        inside = running[ends] - before
    others = (scored - inside)[:, None]  # [G, 1]: the scored positions outside each group
    r = (keys * others).long().clamp(max=(others - 1).clamp(min=0))
    r = r + (r >= before[:, None]).long() * inside[:, None]  # skip the group's own
    if mask is not None:
        r = torch.searchsorted(running[1:], r + 1)  # the r-th scored position
    return r.clamp(max=num_positions - 1)


def groups_scored(mask: Tensor, group_size: int) -> Tensor:
    """long scalar: how many groups of ``group_size`` consecutive positions (the last one the
    rest) hold a scored position (bool ``mask`` ``[T]``): :func:`drawn_per_group` has
    positions to draw for every scored row where there are at least two."""
    padded = F.pad(mask.long(), (0, -mask.numel() % group_size))
    return padded.view(-1, group_size).amax(1).sum()


def in_batch_logits(
    logits: Tensor,
    log_size: Tensor,
    candidates: BatchCandidates,
    remove_hits: bool,
) -> Tensor:
    """Corrected in-batch logits ``[T, U]``: ``o_u + log(#other positions holding u) - log_size``.

    Every position but ``t`` itself holding ``u`` is one in-batch draw of ``u``, so column ``u``
    counts ``counts[u]`` draws, less one in the position's own column (``u = y_t``). That own
    column holds exactly the
    accidental hits, so ``remove_hits`` sets it to ``-inf`` instead. One ``[T, U]`` pass and an
    in-place shift of ``T`` entries (:func:`own_cells`); no ``[T, U]`` index or mask.

    Args:
        logits: ``[T, U]`` fp32 ``o_u`` of the distinct targets for every position.
        log_size: ``[U]`` or ``[T, U]`` the candidates' corrections (:func:`log_mixture_size`).
        candidates: the batch's :class:`BatchCandidates`.
        remove_hits: mask the own column (the conventions that remove accidental hits).
    """
    corrected = logits + column_weights(candidates.counts, log_size)
    if corrected.shape[1] == 0:
        return corrected
    column, shift = own_cells(candidates, remove_hits)
    return shift_cells_(corrected, 0, corrected.shape[1], column, shift)


def in_batch_logsumexp(
    z: Tensor,
    rows: Tensor,
    bias: Tensor | None,
    log_size: Tensor,
    candidates: BatchCandidates,
    remove_hits: bool,
) -> Tensor:
    """``logsumexp`` ``[T]`` of each row of :func:`in_batch_logits`, from queries ``z``
    ``[T, D]``, the candidates' vectors ``rows`` ``[U, D]`` and ``bias`` ``[U]`` (or ``None``)
    and their ``log_size`` ``[U]``, without the ``[T, U]`` logits:
    :func:`~lightning_sampled.ops.chunked.chunked_logsumexp` in chunks of candidates
    (:data:`POOLED_BLOCK_ELEMENTS` logits at a time), its gradient recomputing each chunk (the
    three ``[T, U, D]`` products and one more)."""
    terms = column_weights(candidates.counts, log_size)
    if bias is not None:
        terms = terms + bias.float()
    column, shift = own_cells(candidates, remove_hits)
    chunk_size = max(1, POOLED_BLOCK_ELEMENTS // max(z.shape[0], 1))
    return chunked_logsumexp(z, rows, terms, column, shift, chunk_size)


def column_weights(counts: Tensor, log_size: Tensor) -> Tensor:
    """fp32 ``log(counts) - log_size`` (``counts`` ``[U]``, ``log_size`` ``[U]`` or ``[T, U]``):
    a column counted 0 is no candidate, ``-inf`` whatever its log-size (even ``-inf``)."""
    counts = counts.to(torch.float32)
    return torch.where(counts > 0, counts.log() - log_size, -math.inf)


def own_cells(candidates: BatchCandidates, remove_hits: bool) -> tuple[Tensor, Tensor]:
    """Each position's own column and what it adds there (:func:`in_batch_logits`): long
    ``[T]`` the column (``-1``: none listed) and fp32 ``[T]`` ``-inf`` where ``remove_hits``,
    else ``log((n - 1) / n)`` for a position among the ``n`` holding its target (``-inf`` where
    ``n = 1``) and 0 for one whose target is not listed."""
    listed = candidates.column >= 0
    if remove_hits:
        shift = torch.full(listed.shape, -math.inf, device=listed.device)
        return candidates.column, shift
    counts = candidates.counts.to(torch.float32)
    fewer = (counts - 1).log() - counts.log()  # log((n - 1) / n), -inf where n = 1
    shift = fewer[candidates.column.clamp(min=0)].masked_fill(~listed, 0.0)
    return candidates.column, shift


def log_mixture_size(
    log_q_sampled: Tensor | None, num_sampled: int, log_q_batch: Tensor, num_batch: int | Tensor
) -> Tensor:
    """``log(M q_s + (T - 1) q_b)``: the balance-heuristic correction of a candidate.

    Args:
        log_q_sampled: ``log q_s`` of the candidates under the sampler (any shape broadcasting
            with ``log_q_batch``), or ``None`` when ``num_sampled`` is 0.
        num_sampled: ``M``, the sampler's draws per query.
        log_q_batch: ``log q_b`` of the candidates under the targets' distribution.
        num_batch: ``T - 1``, the in-batch draws per query, or ``K`` under a limit (a long
            scalar tensor where the scored positions are counted on the device).

    Returns:
        fp32 tensor of the broadcast shape.
    """
    if isinstance(num_batch, Tensor):
        log_batch = num_batch.double().log().float()  # a long tensor must not promote
    else:
        log_batch = math.log(num_batch) if num_batch else -math.inf
    batch_term = log_q_batch.float() + log_batch
    if num_sampled == 0:
        return batch_term
    return torch.logaddexp(log_q_sampled.float() + math.log(num_sampled), batch_term)
