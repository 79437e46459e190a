"""The heads' losses as functions of tensors, for code that keeps its own class table:
:func:`sampled_softmax_loss` (TensorFlow's ``tf.nn.sampled_softmax_loss`` with the caller's
negatives, ``sampled_values``) and :func:`full_softmax_loss` (the exact cross-entropy in class
chunks, never an ``[T, N]`` logit matrix).

Both score ``z @ weight.T + bias`` (no temperature, no normalisation: scale ``z`` first), skip
the positions whose target is ``ignore_index``, weight by ``sample_weight`` and reduce as the
heads do (``reduction="mean" | "sum" | "none"``); the sampled loss applies the same conventions,
logQ correction and hard-negative mining as
:class:`~lightning_sampled.heads.SampledSoftmaxHead` through the functions both call
(:mod:`lightning_sampled.heads.losses`, :mod:`lightning_sampled.heads.inputs`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .heads.chunked import chunked_nll, in_compute_dtype, resolve_chunk_size
from .heads.inputs import (
    ScoredPositions,
    check_reduction,
    given_negatives,
    position_weights,
    reduce_losses,
    scored_positions,
)
from .heads.losses import sampled_softmax_losses

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
    convention: str = "exact_positive",
    num_hard_negatives: int | None = None,
    sample_weight: Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> Tensor:
    """Sampled softmax cross-entropy of ``target`` among the given ``negatives``.

    Args:
        z: ``[..., D]`` queries.
        weight: ``[N, D]`` class vectors; only the rows of the targets and the negatives are
            read (the gradient reaches only them).
        target: long ``[...]`` class ids, or ``ignore_index``.
        negatives: long ``[M]`` (shared by the positions) or ``[..., M]`` (per position).
        negative_log_q: the negatives' log-probability in one draw, their shape; each logit
            becomes ``o_j - log(M q_j)``.
        bias: optional ``[N]``.
        target_log_q: ``[...]`` ``log q_y``, for the conventions that correct the positive.
        convention: ``"exact_positive"`` (default), ``"corrected_all"`` or ``"tensorflow"``
            (:class:`~lightning_sampled.heads.SampledSoftmaxHead`).
        num_hard_negatives: keep each position's ``k`` highest corrected negatives.
        sample_weight: optional non-negative ``[...]``.
        ignore_index: the target of positions to skip.
        reduction: ``"mean"``, ``"sum"`` or ``"none"`` (``[...]``, 0 where ignored).

    Returns:
        fp32: a scalar, or ``[...]`` under ``"none"``.
    """
    kept, weights = _scored(z, weight, bias, target, sample_weight, ignore_index, reduction)
    given = given_negatives(negatives, negative_log_q, target_log_q, target, weight.shape[0])
    given = given.at(kept.mask, kept.target.numel())
    y = kept.target
    ids = (
        torch.cat([y, given.ids]) if given.ids.dim() == 1 else torch.cat([y[:, None], given.ids], 1)
    )
    queries, rows = in_compute_dtype(kept.z, weight[ids])
    if given.ids.dim() == 1:
        pos = (queries * rows[: y.numel()]).sum(-1)
        neg = queries @ rows[y.numel() :].T
    else:
        both = torch.einsum("td,tcd->tc", queries, rows)
        pos, neg = both[:, 0], both[:, 1:]
    if bias is not None:
        pos, neg = pos + bias[y], neg + bias[given.ids]
    losses = sampled_softmax_losses(
        pos.float(),
        neg.float(),
        given.ids,
        given.log_q,
        y,
        convention=convention,
        target_log_q=given.target_log_q,
        num_hard_negatives=num_hard_negatives,
    )
    return reduce_losses(losses, weights, kept.mask, reduction, z)


def full_softmax_loss(
    z: Tensor,
    weight: Tensor,
    target: Tensor,
    *,
    bias: Tensor | None = None,
    label_smoothing: float = 0.0,
    sample_weight: Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    chunk_size: int | None = None,
) -> Tensor:
    """Exact cross-entropy of ``target`` under ``softmax(z @ weight.T + bias)``, computed over
    chunks of ``chunk_size`` classes (default: a ``[T, C]`` block of bounded size) without the
    ``[T, N]`` logits, and equal to ``F.cross_entropy`` of those logits (with
    ``label_smoothing``, ``ignore_index``, and the weights and ``reduction`` of
    :func:`sampled_softmax_loss`).

    Returns:
        fp32: a scalar, or ``[...]`` under ``"none"``.
    """
    kept, weights = _scored(z, weight, bias, target, sample_weight, ignore_index, reduction)
    if kept.target.numel() == 0:
        return reduce_losses(z.new_zeros(0, dtype=torch.float32), None, kept.mask, reduction, z)
    chunk = resolve_chunk_size(chunk_size, kept.target.numel(), weight.shape[0])
    losses = chunked_nll(kept.z, weight, bias, kept.target, chunk, label_smoothing=label_smoothing)
    return reduce_losses(losses, weights, kept.mask, reduction, z)


def _scored(
    z: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    target: Tensor,
    sample_weight: Tensor | None,
    ignore_index: int,
    reduction: str,
) -> tuple[ScoredPositions, Tensor | None]:
    """Checks the arguments both losses take and keeps the scored positions: ``(positions,
    their weights [T] or None)``."""
    check_reduction(reduction)
    if not isinstance(weight, Tensor) or weight.dim() != 2:
        raise ValueError(f"weight must be a [N, D] tensor, got {getattr(weight, 'shape', weight)}")
    num_classes, dim = weight.shape
    if bias is not None and tuple(bias.shape) != (num_classes,):
        raise ValueError(f"bias must have shape [{num_classes}], got {tuple(bias.shape)}")
    kept = scored_positions(
        z, target, num_classes, dim, ignore_index=ignore_index, padding_idx=None
    )
    weights = position_weights(
        sample_weight, target, kept.mask, ignore_index=ignore_index, mean=reduction == "mean"
    )
    return kept, weights
