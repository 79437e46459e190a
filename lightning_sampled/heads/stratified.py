"""Sampled softmax over a class table split across ranks: negatives drawn per rank.

The estimate itself is the whole table's loop over negative sources
(:meth:`~lightning_sampled.heads.SampledSoftmaxHead.split_losses`); this module holds what the
split adds: the draws' allocation to ranks, the candidates a rank holds and its log-sum-exp.

Rank ``r`` holds the classes ``S_r`` (:class:`~lightning_sampled.sharding.ShardMap`). It draws
``M_r`` negatives (per query, or shared by the batch) for the queries of *every* rank from
``q_r``, the head's proposal restricted to ``S_r`` (``q_r(j) = q(j) / Q_r`` with
``Q_r = sum_{c in S_r} q(c)``, :meth:`~lightning_sampled.samplers.Sampler.restricted`), and
corrects each by ``log(M_r q_r(j))``, its expected count under this design. For any fixed
``M_r >= 1``,

    ``sum_r (1 / M_r) sum_{j drawn by r} exp(o_j) / q_r(j)``

is an unbiased estimate of ``sum_c exp(o_c)`` (each rank's share by importance sampling from its
own stratum), so the conventions keep their meaning and their consistency: under
``"exact_positive"`` the positive stays uncorrected and draws equal to the target are masked;
under the others the positive is corrected by ``log(M_s q_s(y))`` of the rank ``s`` holding it.

The allocation (:func:`stratum_size`): ``M_r = max(1, ceil(M Q_r))``, with ``Q_r`` the whole
proposal's mass on ``S_r`` for a query-independent proposal, and the share of drawable classes
held by ``r`` for a query-dependent one (MIDX: its mass on a rank changes with every query). The
draws thus follow the proposal's mass, as the unsharded head's do in expectation, and
``sum_r M_r <= M + W - 1``.

Per step a rank sends the scored queries and targets (``W T (D + 1)`` numbers gathered), the
positives' logits and sizes and the per-row log-sum-exps of its draws (``W T`` each), and in
backward the query gradients (``W T D``): nothing grows with ``N``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..ops.in_batch import BatchCandidates
from ..samplers import Sampler
from ..sharding import ShardMap


def stratum_size(sampler: Sampler, ids: Tensor, num_negatives: int, dim: int) -> int:
    """``M_r``: draws per query from the classes ``ids`` ``[K]`` (this rank's) of a proposal
    ``sampler`` over all classes, when ``num_negatives`` are drawn in all (module docstring).

    Raises:
        ValueError: ``ids`` hold no class the proposal can draw (one padding row).
    """
    if sampler.query_independent:
        queries = torch.zeros(1, dim, device=ids.device)  # read for device and dtype only
        log_q = sampler.log_prob(queries, ids).double().reshape(-1)
        mass = float(torch.logsumexp(log_q, dim=0).exp())
    else:
        mass = (ids.numel() - (sampler.local_padding(ids) is not None)) / sampler.num_drawable
    if mass <= 0:
        raise ValueError(
            f"a rank holds no class that {type(sampler).__name__} draws (rows {ids.tolist()[:5]}"
            f"): use fewer ranks than classes"
        )
    return max(1, math.ceil(round(num_negatives * mass, 9)))


def local_logsumexp(logits: Tensor) -> Tensor:
    """``logsumexp`` ``[T]`` of a rank's candidate logits ``[T, C]``: ``-inf``, with gradient 0,
    for a row whose every candidate here is ``-inf`` (this rank holds none of its candidates but
    its own masked target, as can happen under ``max_in_batch_draws``), where
    ``torch.logsumexp``'s gradient is NaN."""
    empty = (logits == -math.inf).all(dim=1, keepdim=True)
    lse = torch.logsumexp(logits.masked_fill(empty, 0.0), dim=1)
    return lse.masked_fill(empty[:, 0], -math.inf)


def held_candidates(every: BatchCandidates, shard_map: ShardMap) -> BatchCandidates:
    """Of the distinct targets ``every`` of every rank's batch (global ids), those this rank
    holds, with their multiplicities; ``column`` is ``-1`` for a position whose own target is
    not among them (held elsewhere, or not drawn:
    :func:`~lightning_sampled.ops.in_batch.in_batch_logits` then leaves it)."""
    held = shard_map.owner(every.ids) == shard_map.rank
    index = torch.cumsum(held, dim=0) - 1
    listed = every.column >= 0
    own_column = every.column.clamp(min=0)
    column = torch.where(listed & held[own_column], index[own_column], -1)
    return BatchCandidates(every.ids[held], every.counts[held], column)
