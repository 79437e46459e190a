"""Sampled softmax over a class table split across ranks: negatives drawn per rank.

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
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..samplers import Sampler
from ..sharding.collectives import all_reduce_sum, combined_logsumexp, gather_rows

if TYPE_CHECKING:
    from .sampled import SampledSoftmaxHead


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


def stratified_losses(head: SampledSoftmaxHead, queries: Tensor, target: Tensor) -> Tensor:
    """The sampled cross-entropy ``[T]`` of this rank's scored ``queries`` ``[T, D]`` and global
    ``target`` ``[T]`` under the stratified design (module docstring); a collective."""
    group, shard_map, m = head.process_group, head.shard_map, head.num_local_negatives
    z, own = gather_rows(queries, group)
    y, _ = gather_rows(target, group)
    local_y = shard_map.local_or(y)
    owned = local_y >= 0
    with torch.no_grad():
        draw = head.sampler.sample(z.detach(), m, shared=head.shared_negatives)
    pos, neg = head.target_and_candidate_logits(z, local_y.clamp(min=0), draw.ids)
    pos = all_reduce_sum(pos.masked_fill(~owned, 0.0), group)
    neg = neg - (math.log(m) + draw.log_q)
    if head.removes_accidental_hits:
        neg = neg.masked_fill(draw.ids.expand_as(neg) == local_y[:, None], -math.inf)
    if head.corrects_positive:  # by log(M_s q_s(y)) of the rank s that holds y
        with torch.no_grad():
            log_q = head.sampler.log_prob(z.detach(), local_y.clamp(min=0)[:, None])[:, 0]
            log_size = all_reduce_sum(torch.where(owned, math.log(m) + log_q, 0.0), group)
        pos = pos - log_size
    lse = combined_logsumexp(torch.logsumexp(neg, dim=1), group, once=pos)
    return (lse - pos)[own]
