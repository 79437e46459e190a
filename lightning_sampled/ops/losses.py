"""The sampled softmax on logits, shared by :class:`~lightning_sampled.heads.SampledSoftmaxHead`
and :func:`lightning_sampled.functional.sampled_softmax_loss`: the logQ correction of candidate
logits under a convention (:mod:`.conventions`), hard-negative mining and the cross-entropy of
the positive among its candidates."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._validation import check_positive_int
from .conventions import convention_named

#: the objectives of a position with several positives ``S`` (``positives=``):
#: ``"each"``, one softmax per positive ``p`` over ``p`` and the classes outside ``S`` (the other
#: positives are neither negatives nor accidental hits; sequential recommendation's form);
#: ``"soft_labels"``, one softmax over all classes with the positives as labels ``1 / |S|``
#: (TensorFlow's ``num_true``)
POSITIVE_FORMS = ("each", "soft_labels")


def check_positive_form(positives: str) -> None:
    """Checks that ``positives`` is one of :data:`POSITIVE_FORMS`."""
    if positives not in POSITIVE_FORMS:
        raise ValueError(f"positives must be one of {POSITIVE_FORMS} or None, got {positives!r}")


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
    convention: str = "corrected_all",
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
    rules = convention_named(convention)
    if num_hard_negatives is not None:
        check_positive_int("num_hard_negatives", num_hard_negatives)
    log_m = math.log(candidates.shape[-1])
    negatives = rules.negatives(candidate_logits, candidates, log_m + candidate_log_q, target)
    negatives = hardest(negatives, num_hard_negatives)
    if rules.corrects_positive:
        if target_log_q is None:
            raise ValueError(
                f"convention={convention!r} corrects the positive's logit by log(M q_y): give "
                "target_log_q, the targets' log-probability under the proposal"
            )
        target_logits = rules.positive(target_logits, log_m + target_log_q)
    return softmax_losses(torch.cat([target_logits[:, None], negatives], dim=1))


def mean_over_positives(losses: Tensor, present: Tensor) -> Tensor:
    """``[T]``: each row's mean of ``losses`` ``[T, P]`` over its ``present`` positives."""
    return losses.masked_fill(~present, 0.0).sum(dim=1) / present.sum(dim=1)


def exact_multi_positive_losses(
    first_nll: Tensor, target_logits: Tensor, present: Tensor, positives: str
) -> Tensor:
    """The exact loss ``[T]`` of positions with several positives ``S`` (``positives``, one of
    :data:`POSITIVE_FORMS`), the mean over ``S`` of each positive ``p``'s

    - ``"soft_labels"``: ``log Z - o_p``;
    - ``"each"``: ``log(e^{o_p} + Z - sum_{q in S} e^{o_q}) - o_p``, in fp64.

    Args:
        first_nll: ``[T]`` the exact cross-entropy ``log Z - o`` of column 0 of the positives
            (the chunked one), from which ``log Z`` over every class follows.
        target_logits: fp32 ``[T, P]`` the positives' logits.
        present: bool ``[T, P]`` which positives are there (distinct classes).
        positives: the form.
    """
    check_positive_form(positives)
    log_normalizer = first_nll + target_logits[:, 0]
    if positives == "soft_labels":
        return mean_over_positives(log_normalizer[:, None] - target_logits, present)
    shares = (target_logits.double() - log_normalizer.double()[:, None]).exp() * present
    rest = (1.0 - shares.sum(dim=1, keepdim=True)).clamp(min=0.0)  # Z_rest / Z
    losses = log_normalizer[:, None] + (shares + rest).log().float() - target_logits
    return mean_over_positives(losses, present)


def sampled_multi_positive_losses(
    target_logits: Tensor,
    present: Tensor,
    candidate_logits: Tensor,
    candidates: Tensor,
    candidate_log_q: Tensor,
    targets: Tensor,
    *,
    positives: str,
    convention: str = "corrected_all",
    target_log_q: Tensor | None = None,
    num_hard_negatives: int | None = None,
) -> Tensor:
    """:func:`sampled_softmax_losses` for positions with several positives ``S``: the mean over
    ``S`` of each positive's loss, ``[T]``. Negatives equal to a positive other than the one
    scored never count (``"each"``); negatives equal to the scored positive (``"each"``) or to
    any positive (``"soft_labels"``) are accidental hits, removed as ``convention`` says. Under
    ``"exact_positive"`` the corrected negatives estimate ``Z`` less the positives' share, so
    both forms tend to :func:`exact_multi_positive_losses` as ``M`` grows.

    Args:
        target_logits: fp32 ``[T, P]``; present: bool ``[T, P]``; targets: long ``[T, P]``.
        candidate_logits, candidates, candidate_log_q, convention, num_hard_negatives: as
            :func:`sampled_softmax_losses`.
        positives: one of :data:`POSITIVE_FORMS`.
        target_log_q: ``[T, P]`` the positives' ``log q``, for the conventions that correct them.
    """
    rules = convention_named(convention)
    check_positive_form(positives)
    if num_hard_negatives is not None:
        check_positive_int("num_hard_negatives", num_hard_negatives)
    log_m = math.log(candidates.shape[-1])
    negatives = candidate_logits - (log_m + candidate_log_q)
    ids = candidates.expand_as(negatives)
    same = ids[:, None, :] == targets[:, :, None]  # [T, P, M]: negative m is positive p
    of_any = (same & present[:, :, None]).any(dim=1)  # [T, M]: negative m is a positive
    if rules.corrects_positive:
        if target_log_q is None:
            raise ValueError(
                f"convention={convention!r} corrects the positives' logits: give target_log_q"
            )
        target_logits = rules.positive(target_logits, log_m + target_log_q)
    remove = rules.removes_accidental_hits
    if positives == "soft_labels":
        if remove:
            negatives = negatives.masked_fill(of_any, -math.inf)
        negatives = hardest(negatives, num_hard_negatives)
        own = target_logits.masked_fill(~present, -math.inf)
        log_normalizer = torch.logsumexp(torch.cat([own, negatives], dim=1), dim=1)
        return mean_over_positives(log_normalizer[:, None] - target_logits, present)
    excluded = of_any[:, None, :] if remove else of_any[:, None, :] & ~same
    per_positive = negatives[:, None, :].expand(-1, targets.shape[1], -1)
    per_positive = per_positive.masked_fill(excluded, -math.inf)  # [T, P, M]
    if num_hard_negatives is not None and num_hard_negatives < per_positive.shape[-1]:
        per_positive = per_positive.topk(num_hard_negatives, dim=-1).values
    both = torch.cat([target_logits[:, :, None], per_positive], dim=-1)
    return mean_over_positives(torch.logsumexp(both, dim=-1) - target_logits, present)
