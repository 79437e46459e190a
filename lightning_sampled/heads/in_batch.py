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

import torch
from torch import Tensor


def batch_candidates(target: Tensor) -> tuple[Tensor, Tensor]:
    """The distinct targets of a batch and, for every position, how many other positions hold each.

    Args:
        target: long ``[T]`` the scored positions' targets.

    Returns:
        ``(ids, log_others)``: long ``[U]`` distinct targets (sorted) and fp32 ``[T, U]``
        ``log`` of the number of positions other than ``t`` whose target is ``ids[u]``
        (``-inf`` where there is none, e.g. a target held only by ``t`` itself).
    """
    ids, inverse, counts = torch.unique(target, return_inverse=True, return_counts=True)
    others = counts.expand(target.shape[0], -1).clone()
    others[torch.arange(target.shape[0], device=target.device), inverse] -= 1
    return ids, others.float().log()


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
