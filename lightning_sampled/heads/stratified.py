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
from ..sharding import ShardMap
from ..sharding.collectives import all_reduce_sum, combined_logsumexp, gather_rows
from .in_batch import BatchCandidates, in_batch_logits

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
    ``target`` ``[T]`` under the stratified design (module docstring); a collective.

    With ``in_batch_negatives`` the candidates also include the distinct targets of every rank's
    batch that this rank holds (``W T - 1`` in-batch draws per query, as cross-device negatives
    in contrastive training), and every candidate ``j`` held by rank ``r`` is corrected by
    ``log(M_r q_r(j) + (W T - 1) q_b(j))``, the balance heuristic of the two designs
    (:mod:`.in_batch`): the objective of the unsharded head on the ranks' batches together.
    """
    group, shard_map, m = head.process_group, head.shard_map, head.num_local_negatives
    z, own = gather_rows(queries, group)
    y, _ = gather_rows(target, group)
    local_y = shard_map.local_or(y)
    owned = local_y >= 0
    held_y = local_y.clamp(min=0)
    batch = head.batch_proposal(y) if head.in_batch_negatives else None
    columns, pos = [], None
    if m:
        with torch.no_grad():
            draw = head.sampler.sample(z.detach(), m, shared=head.shared_negatives)
        pos, neg = head.target_and_candidate_logits(z, held_y, draw.ids)
        log_size = head.log_size(draw.ids, draw.log_q, batch)
        neg = neg - log_size
        if head.removes_accidental_hits:
            neg = neg.masked_fill(draw.ids.expand_as(neg) == local_y[:, None], -math.inf)
        columns.append(neg)
    if batch is not None:
        every, drawn = head.in_batch_candidates_of(y, None, batch, "distinct")
        candidates = held_candidates(every, shard_map)
        ids = shard_map.local_or(candidates.ids)
        if pos is None:
            pos, neg = head.target_and_candidate_logits(z, held_y, ids)
        else:
            neg = head.candidate_logits(z, ids)
        log_q = None
        if m:
            with torch.no_grad():
                log_q = head.sampler.log_prob(z.detach(), ids)
        log_size = head.log_size(ids, log_q, batch)
        columns.append(
            in_batch_logits(neg, log_size, candidates, head.removes_accidental_hits, drawn)
        )
    pos = all_reduce_sum(pos.masked_fill(~owned, 0.0), group)
    if head.corrects_positive:  # by the log-size of the positive on the rank s that holds it
        with torch.no_grad():
            log_q = head.sampler.log_prob(z.detach(), held_y[:, None])[:, 0] if m else None
            log_size = head.positive_log_size(held_y, log_q, batch)
            log_size = all_reduce_sum(torch.where(owned, log_size, 0.0), group)
        pos = pos - log_size
    lse = combined_logsumexp(local_logsumexp(torch.cat(columns, dim=1)), group, once=pos)
    return (lse - pos)[own]


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
    :func:`~lightning_sampled.heads.in_batch.in_batch_logits` then leaves it)."""
    held = shard_map.owner(every.ids) == shard_map.rank
    index = torch.cumsum(held, dim=0) - 1
    listed = every.column >= 0
    own_column = every.column.clamp(min=0)
    column = torch.where(listed & held[own_column], index[own_column], -1)
    return BatchCandidates(every.ids[held], every.counts[held], column)
