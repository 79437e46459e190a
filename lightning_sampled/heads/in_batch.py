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
``U`` distinct targets, each weighted by how many *other* positions hold it: logits ``[T, U]``,
never ``[T, T]``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor


class BatchCandidates(NamedTuple):
    """The distinct targets of a batch.

    Attributes:
        ids: long ``[U]`` the distinct targets, sorted.
        counts: long ``[U]`` how many positions hold each.
        column: long ``[T]`` each position's own target's index in ``ids`` (``-1`` where it
            is not among them: a table split across ranks lists only the targets a rank holds).
    """

    ids: Tensor
    counts: Tensor
    column: Tensor


def batch_candidates(target: Tensor) -> BatchCandidates:
    """The distinct targets of a batch of targets ``[T]`` (long), with their multiplicities."""
    ids, column, counts = torch.unique(target, return_inverse=True, return_counts=True)
    return BatchCandidates(ids, counts, column)


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
    corrected = logits + (counts.log() - log_size)
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
    log_q_sampled: Tensor | None, num_sampled: int, log_q_batch: Tensor, num_batch: int
) -> Tensor:
    """``log(M q_s + (T - 1) q_b)``: the balance-heuristic correction of a candidate.

    Args:
        log_q_sampled: ``log q_s`` of the candidates under the sampler (any shape broadcasting
            with ``log_q_batch``), or ``None`` when ``num_sampled`` is 0.
        num_sampled: ``M``, the sampler's draws per query.
        log_q_batch: ``log q_b`` of the candidates under the targets' distribution.
        num_batch: ``T - 1``, the in-batch draws per query.

    Returns:
        fp32 tensor of the broadcast shape.
    """
    batch_term = log_q_batch.float() + (math.log(num_batch) if num_batch else -math.inf)
    if num_sampled == 0:
        return batch_term
    return torch.logaddexp(log_q_sampled.float() + math.log(num_sampled), batch_term)
