"""The heads' losses as functions of tensors, for code that keeps its own class table:
:func:`sampled_softmax_loss` (TensorFlow's ``tf.nn.sampled_softmax_loss`` with the caller's
negatives, ``sampled_values``) and :func:`full_softmax_loss` (the exact cross-entropy in class
chunks, never an ``[T, N]`` logit matrix).

Both score ``z @ weight.T + bias`` (no temperature, no normalisation: scale ``z`` first), skip
the positions whose target is ``ignore_index``, weight by ``sample_weight`` and reduce as the
heads do (``reduction="mean" | "sum" | "none"``; ``ignore_index`` may be any int, a class id
included, as in ``F.cross_entropy``, where a head, which owns its class ids, refuses one in
``[0, N)``), and take several positives per position
(``target`` ``[..., P]``, ``positives="each" | "soft_labels"``,
:data:`~lightning_sampled.ops.losses.POSITIVE_FORMS`); the sampled loss applies the same
conventions, logQ correction and hard-negative mining as
:class:`~lightning_sampled.heads.SampledSoftmaxHead` through the functions both call
(:mod:`lightning_sampled.ops.losses`, :mod:`lightning_sampled.ops.inputs`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._validation import check_label_smoothing, check_positive_int
from .ops.chunked import chunked_nll, gathered_logits, resolve_chunk_size
from .ops.inputs import (
    ScoredPositives,
    check_reduction,
    given_negatives,
    nothing_scored,
    position_weights,
    reduce_losses,
    scored_positions,
    scored_positives,
)
from .ops.losses import (
    check_positive_form,
    exact_multi_positive_losses,
    sampled_multi_positive_losses,
    sampled_softmax_losses,
)

__all__ = ["full_softmax_loss", "sampled_softmax_loss"]


def sampled_softmax_loss(
    z: Tensor,
    weight: Tensor,
    target: Tensor,
    negatives: Tensor,
    negative_log_q: Tensor,
    *,
    bias: Tensor | None = None,
    target_log_q: Tensor | None = None,
    convention: str = "corrected_all",
    num_hard_negatives: int | None = None,
    positives: str | None = None,
    sample_weight: Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> Tensor:
    """Sampled softmax cross-entropy of ``target`` among the given ``negatives``.

    Args:
        z: ``[..., D]`` queries.
        weight: ``[N, D]`` class vectors; only the rows of the targets and the negatives are
            read (the gradient reaches only them).
        target: long ``[...]`` class ids, or ``ignore_index``; with ``positives``, ``[..., P]``
            distinct positives per position, ``ignore_index`` where a position has fewer.
        negatives: long ``[M]`` (shared by the positions) or ``[..., M]`` (per position).
        negative_log_q: the negatives' log-probability in one draw, their shape; each logit
            becomes ``o_j - log(M q_j)``.
        bias: optional ``[N]``.
        target_log_q: ``log q_y``, the shape of ``target``, for the conventions that correct
            the positive.
        convention: ``"corrected_all"`` (default; needs ``target_log_q``), ``"exact_positive"``
            or ``"tensorflow"``
            (:class:`~lightning_sampled.heads.SampledSoftmaxHead`).
        num_hard_negatives: keep each position's ``k`` highest corrected negatives.
        positives: ``None`` (one positive per position), ``"each"`` or ``"soft_labels"``
            (:func:`~lightning_sampled.ops.losses.sampled_multi_positive_losses`; a
            position's loss is the mean over its positives).
        sample_weight: optional non-negative ``[...]`` (one per position).
        ignore_index: the target of positions (or absent positives) to skip.
        reduction: ``"mean"``, ``"sum"`` or ``"none"`` (``[...]``, 0 where ignored).

    Returns:
        fp32: a scalar, or ``[...]`` under ``"none"``.
    """
    kept, weights = _scored(
        z, weight, bias, target, sample_weight, ignore_index, reduction, positives
    )
    given = given_negatives(
        negatives,
        negative_log_q,
        target_log_q,
        target,
        weight.shape[0],
        several=positives is not None,
    ).at(kept.mask, kept.z.shape[0])
    pos = _logits(kept.z, weight, bias, kept.targets)
    neg = _logits(kept.z, weight, bias, given.ids)
    options = dict(convention=convention, num_hard_negatives=num_hard_negatives)
    if positives is None:
        y = kept.targets[:, 0]
        losses = sampled_softmax_losses(
            pos[:, 0], neg, given.ids, given.log_q, y, target_log_q=given.target_log_q, **options
        )
    else:
        losses = sampled_multi_positive_losses(
            pos,
            kept.present,
            neg,
            given.ids,
            given.log_q,
            kept.targets,
            positives=positives,
            target_log_q=given.target_log_q,
            **options,
        )
    return reduce_losses(losses, weights, kept.mask, reduction, z)


def full_softmax_loss(
    z: Tensor,
    weight: Tensor,
    target: Tensor,
    *,
    bias: Tensor | None = None,
    label_smoothing: float = 0.0,
    positives: str | None = None,
    sample_weight: Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    chunk_size: int | None = None,
) -> Tensor:
    """Exact cross-entropy of ``target`` under ``softmax(z @ weight.T + bias)``, computed over
    chunks of ``chunk_size`` classes (default: a ``[T, C]`` block of bounded size) without the
    ``[T, N]`` logits, and equal to ``F.cross_entropy`` of those logits (with
    ``label_smoothing``, ``ignore_index``, and the weights and ``reduction`` of
    :func:`sampled_softmax_loss`). With ``positives`` (``target`` ``[..., P]``), the exact
    objective of that form (:func:`~lightning_sampled.ops.losses.exact_multi_positive_losses`),
    without label smoothing.

    Returns:
        fp32: a scalar, or ``[...]`` under ``"none"``.
    """
    label_smoothing = check_label_smoothing(label_smoothing)
    if chunk_size is not None:
        check_positive_int("chunk_size", chunk_size)
    if positives is not None and label_smoothing:
        raise ValueError("label_smoothing does not combine with several positives (positives=)")
    kept, weights = _scored(
        z, weight, bias, target, sample_weight, ignore_index, reduction, positives
    )
    if kept.z.shape[0] == 0:
        return nothing_scored(kept.mask, reduction, z)
    chunk = resolve_chunk_size(chunk_size, kept.z.shape[0], weight.shape[0])
    first = kept.targets[:, 0]
    losses = chunked_nll(kept.z, weight, bias, first, chunk, label_smoothing=label_smoothing)
    if positives is not None:
        pos = _logits(kept.z, weight, bias, kept.targets)
        losses = exact_multi_positive_losses(losses, pos, kept.present, positives)
    return reduce_losses(losses, weights, kept.mask, reduction, z)


def _scored(
    z: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    target: Tensor,
    sample_weight: Tensor | None,
    ignore_index: int,
    reduction: str,
    positives: str | None,
) -> tuple[ScoredPositives, Tensor | None]:
    """Checks the arguments both losses take and keeps the scored positions: ``(positions,
    their weights [T] or None)``; one positive per position is ``targets`` ``[T, 1]``."""
    check_reduction(reduction)
    if not isinstance(weight, Tensor) or weight.dim() != 2:
        raise ValueError(f"weight must be a [N, D] tensor, got {getattr(weight, 'shape', weight)}")
    num_classes, dim = weight.shape
    if bias is not None and tuple(bias.shape) != (num_classes,):
        raise ValueError(f"bias must have shape [{num_classes}], got {tuple(bias.shape)}")
    if positives is None:
        one = scored_positions(
            z, target, num_classes, dim, ignore_index=ignore_index, padding_idx=None
        )
        present = torch.ones_like(one.target, dtype=torch.bool)[:, None]
        kept = ScoredPositives(one.z, one.target[:, None], present, one.mask)
    else:
        check_positive_form(positives)
        kept = scored_positives(
            z, target, num_classes, dim, ignore_index=ignore_index, padding_idx=None
        )
    weights = position_weights(
        sample_weight, kept.mask, kept.mask, ignore_index=ignore_index, mean=reduction == "mean"
    )
    return kept, weights


def _logits(queries: Tensor, weight: Tensor, bias: Tensor | None, ids: Tensor) -> Tensor:
    """fp32 logits ``[T, M]`` of the classes ``ids`` (``[M]`` or ``[T, M]``) for ``queries``
    ``[T, D]``, from the rows of ``weight`` and ``bias``."""
    return gathered_logits(queries, weight[ids], None if bias is None else bias[ids])
