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
distinct targets, each weighted by how many *other* positions hold it. On a GPU and under
``torch.compile``, up to :data:`FIXED_SHAPE_POSITIONS` positions, they are found by a sort in
fixed shapes (:func:`sorted_candidates`: ``T`` columns, the repeats and the left-out positions
weighted 0): no ``torch.unique``, so no host sync and no graph break, at the price of ``[T, T]``
logits instead of ``[T, U]``; elsewhere by ``torch.unique`` (:func:`distinct_candidates`: ``U``
columns), which on the CPU is the cheaper (``benchmarks/in_batch_step.py``: there the sorted
step costs up to twice as much, at 4,096 positions). A position left out (an ignored position
kept, weighted 0, for static shapes) is neither a candidate nor a draw.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from .._validation import sync_free
from ..samplers.frequency import counted

#: the most scored positions whose candidates :func:`batch_candidates` finds in fixed shapes
#: (``[T, T]`` logits: 16.8 million at 4,096 positions)
FIXED_SHAPE_POSITIONS = 4096
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
    target: Tensor, mask: Tensor | None = None, method: str = "auto"
) -> BatchCandidates:
    """The distinct targets of a batch of targets ``[T]`` (long) but the positions ``mask``
    (bool ``[T]``) leaves out, with their multiplicities, by ``method``
    (:data:`CANDIDATE_METHODS`): ``"sorted"`` (:func:`sorted_candidates`), ``"distinct"``
    (:func:`distinct_candidates`) or ``"auto"``, sorted where the shapes must not depend on the
    targets (:func:`~lightning_sampled._validation.sync_free`) and ``T`` is at most
    :data:`FIXED_SHAPE_POSITIONS`, else distinct."""
    if method == "auto":
        fixed = sync_free(target) and target.numel() <= FIXED_SHAPE_POSITIONS
        method = "sorted" if fixed else "distinct"
    if method == "sorted":
        return sorted_candidates(target, mask)
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


def sorted_candidates(target: Tensor, mask: Tensor | None = None) -> BatchCandidates:
    """:func:`batch_candidates` in fixed shapes: the ``T`` targets sorted, each run of equal
    ones counted in its first column (the others, and the left-out positions, count 0), each
    position's column that first one (``-1`` if left out). A sort and three binary searches; no
    shape depends on the targets."""
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
    return BatchCandidates(target.index_select(0, order), counts, column)


def in_batch_logits(
    logits: Tensor, log_size: Tensor, candidates: BatchCandidates, remove_hits: bool
) -> Tensor:
    """Corrected in-batch logits ``[T, U]``: ``o_u + log(#other positions holding u) - log_size``.

    Every position but ``t`` itself holding ``u`` is one in-batch draw of ``u``, so column ``u``
    counts ``counts[u]`` draws, less one in the position's own column (``u = y_t``). That own
    column holds exactly the accidental hits, so ``remove_hits`` sets it to ``-inf`` instead.
    One ``[T, U]`` pass and an in-place fix of ``T`` entries; no ``[T, U]`` index or mask.

    Args:
        logits: ``[T, U]`` fp32 ``o_u`` of the distinct targets for every position.
        log_size: ``[U]`` or ``[T, U]`` the candidates' corrections (:func:`log_mixture_size`).
        candidates: the batch's :class:`BatchCandidates`.
        remove_hits: mask the own column (the conventions that remove accidental hits).
    """
    counts = candidates.counts.to(logits.dtype)
    # a column counted 0 is no candidate: -inf, whatever its log-size (even -inf)
    weight = torch.where(counts > 0, counts.log() - log_size, -math.inf)
    corrected = logits + weight
    if corrected.shape[1] == 0:
        return corrected
    rows = torch.arange(logits.shape[0], device=logits.device)
    listed = candidates.column >= 0
    column = candidates.column.clamp(min=0)
    own = (rows, column)
    if remove_hits:  # a row whose own target is not listed keeps its value
        return corrected.index_put_(own, corrected[own].masked_fill(listed, -math.inf))
    fewer = (counts - 1).log() - counts.log()  # log((n - 1) / n), -inf where n = 1
    return corrected.index_put_(own, fewer[column].masked_fill(~listed, 0.0), accumulate=True)


def log_mixture_size(
    log_q_sampled: Tensor | None, num_sampled: int, log_q_batch: Tensor, num_batch: int | Tensor
) -> Tensor:
    """``log(M q_s + (T - 1) q_b)``: the balance-heuristic correction of a candidate.

    Args:
        log_q_sampled: ``log q_s`` of the candidates under the sampler (any shape broadcasting
            with ``log_q_batch``), or ``None`` when ``num_sampled`` is 0.
        num_sampled: ``M``, the sampler's draws per query.
        log_q_batch: ``log q_b`` of the candidates under the targets' distribution.
        num_batch: ``T - 1``, the in-batch draws per query (a long scalar tensor where the
            scored positions are counted on the device).

    Returns:
        fp32 tensor of the broadcast shape.
    """
    if isinstance(num_batch, Tensor):
        log_batch = num_batch.double().log()
    else:
        log_batch = math.log(num_batch) if num_batch else -math.inf
    batch_term = log_q_batch.float() + log_batch
    if num_sampled == 0:
        return batch_term
    return torch.logaddexp(log_q_sampled.float() + math.log(num_sampled), batch_term)
