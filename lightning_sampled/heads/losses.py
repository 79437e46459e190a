"""The sampled softmax on logits, shared by :class:`~lightning_sampled.heads.SampledSoftmaxHead`
and :func:`lightning_sampled.functional.sampled_softmax_loss`: the logQ correction of candidate
logits, the conventions (:data:`CONVENTIONS`, described in :mod:`.sampled`), hard-negative mining
and the cross-entropy of the positive among its candidates."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._validation import check_positive_int

CONVENTIONS = ("exact_positive", "corrected_all", "tensorflow")


def check_convention(convention: str) -> None:
    """Checks that ``convention`` is one of :data:`CONVENTIONS`."""
    if convention not in CONVENTIONS:
        raise ValueError(f"convention must be one of {CONVENTIONS}, got {convention!r}")


def corrects_positive(convention: str) -> bool:
    """Whether ``convention`` logQ-corrects the positive's logit (all but ``"exact_positive"``)."""
    return convention != "exact_positive"


def removes_accidental_hits(convention: str) -> bool:
    """Whether ``convention`` gives negatives equal to the target ``-inf`` (all but
    ``"corrected_all"``)."""
    return convention != "corrected_all"


def corrected_candidates(
    logits: Tensor, ids: Tensor, log_size: Tensor, target: Tensor, remove_hits: bool
) -> Tensor:
    """Candidate logits ``[T, C]`` minus their log-size ``log(M q)`` (``log_size``, broadcast to
    ``[T, C]``), with the candidates ``ids`` (``[C]`` shared or ``[T, C]``) equal to the row's
    ``target`` ``[T]`` at ``-inf`` when ``remove_hits``."""
    logits = logits - log_size
    if remove_hits:
        logits = logits.masked_fill(ids.expand_as(logits) == target[:, None], -math.inf)
    return logits


def hardest(logits: Tensor, num_hard_negatives: int | None) -> Tensor:
    """The ``num_hard_negatives`` largest of each row of corrected candidate logits ``[T, C]``
    (all ``C`` when ``None`` or ``>= C``): hard-negative mining as TensorFlow Recommenders'
    ``Retrieval(num_hard_negatives=k)`` does it, after the correction and the removal of
    accidental hits. It keeps the negatives that dominate the gradient and is biased by design:
    the loss no longer estimates the full softmax's."""
    if num_hard_negatives is None or num_hard_negatives >= logits.shape[1]:
        return logits
    return logits.topk(num_hard_negatives, dim=1).values


def softmax_losses(logits: Tensor) -> Tensor:
    """Cross-entropy ``[T]`` of column 0 (the positive) among logits ``[T, 1 + C]``."""
    return torch.logsumexp(logits, dim=1) - logits[:, 0]


def sampled_softmax_losses(
    target_logits: Tensor,
    candidate_logits: Tensor,
    candidates: Tensor,
    candidate_log_q: Tensor,
    target: Tensor,
    *,
    convention: str = "exact_positive",
    target_log_q: Tensor | None = None,
    num_hard_negatives: int | None = None,
) -> Tensor:
    """The sampled softmax loss ``[T]`` of each position from its raw logits.

    Args:
        target_logits: fp32 ``[T]``, the positive's logit ``o_y``.
        candidate_logits: fp32 ``[T, M]``, the logits of the ``M`` negatives of each position.
        candidates: long ``[M]`` (shared by the positions) or ``[T, M]``, the negatives' ids.
        candidate_log_q: ``log q_j``, the probability of drawing each negative in one draw, the
            shape of ``candidates``; each negative's logit becomes ``o_j - log(M q_j)``.
        target: long ``[T]``, the positives' ids (for accidental hits).
        convention: as :class:`~lightning_sampled.heads.SampledSoftmaxHead`'s.
        target_log_q: ``[T]`` ``log q_y``, needed by the conventions that correct the positive.
        num_hard_negatives: keep only this many negatives per position, the largest corrected
            logits (:func:`hardest`); ``None`` keeps all.
    """
    check_convention(convention)
    if num_hard_negatives is not None:
        check_positive_int("num_hard_negatives", num_hard_negatives)
    log_m = math.log(candidates.shape[-1])
    negatives = corrected_candidates(
        candidate_logits,
        candidates,
        log_m + candidate_log_q,
        target,
        removes_accidental_hits(convention),
    )
    negatives = hardest(negatives, num_hard_negatives)
    if corrects_positive(convention):
        if target_log_q is None:
            raise ValueError(
                f"convention={convention!r} corrects the positive's logit by log(M q_y): give "
                "target_log_q, the targets' log-probability under the proposal"
            )
        target_logits = target_logits - (log_m + target_log_q)
    return softmax_losses(torch.cat([target_logits[:, None], negatives], dim=1))
