"""Input checks of a head's methods: queries, targets, sample weights and ``k``.

Eager calls on CPU tensors raise ``ValueError`` (``IndexError`` for class ids) naming the argument
and the bad value. Under ``torch.compile`` and on CUDA (:func:`~lightning_sampled._validation.
sync_free`) the checks of tensor values are ``torch._assert_async`` calls (a ``RuntimeError``
without a host sync), and ``static`` keeps every position so that no shape depends on the data.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .._validation import check_class_ids, check_finite, check_positive_int, sync_free

#: how a head reduces its per-position losses (:func:`reduce_losses`)
REDUCTIONS = ("mean", "sum", "none")


class ScoredPositions(NamedTuple):
    """The positions a head scores.

    Attributes:
        z: ``[T, D]`` their queries (raw: the head scores them with ``score_queries``).
        target: long ``[T]`` their targets.
        mask: bool ``[...]`` (the shape of the target), the positions whose target is not
            ``ignore_index``.
    """

    z: Tensor
    target: Tensor
    mask: Tensor


def check_queries(z: Tensor, num_classes: int, dim: int) -> None:
    """Checks that ``z`` is a finite float tensor ``[..., dim]`` (for a ``[num_classes, dim]``
    class table)."""
    if not z.is_floating_point():
        raise ValueError(f"z must be a floating-point tensor, got dtype {z.dtype}")
    if z.dim() < 1 or z.shape[-1] != dim:
        raise ValueError(
            f"z must have shape [..., {dim}] to match the class table [{num_classes}, {dim}], "
            f"got {tuple(z.shape)}"
        )
    check_finite("z", z)


class ScoredPositives(NamedTuple):
    """The positions a head scores when each has several positives (``target`` ``[..., P]``).

    Attributes:
        z: ``[T, D]`` the queries of the positions with at least one positive (raw).
        targets: long ``[T, P]`` their positives; absent ones (``ignore_index``) replaced by
            the row's first positive, so that every entry is a class id.
        present: bool ``[T, P]``, the positives that are there.
        mask: bool ``[...]`` (``target.shape[:-1]``), the positions kept.
    """

    z: Tensor
    targets: Tensor
    present: Tensor
    mask: Tensor


def scored_positives(
    z: Tensor,
    target: Tensor,
    num_classes: int,
    dim: int,
    *,
    ignore_index: int,
    padding_idx: int | None,
) -> ScoredPositives:
    """Validates ``z`` ``[..., dim]`` and several positives per position ``target``
    ``[..., P]`` (class ids, or ``ignore_index`` where a position has fewer than ``P``; all
    ``ignore_index``: the position is skipped) and keeps the positions with a positive.

    Raises:
        ValueError: if ``target`` is not ``[*z.shape[:-1], P]``, or a position lists a class
            twice.
        IndexError: for ids out of range or the padding class (:func:`check_class_ids`).
    """
    check_queries(z, num_classes, dim)
    if target.dim() != z.dim() or tuple(target.shape[:-1]) != tuple(z.shape[:-1]):
        raise ValueError(
            f"with several positives, target must have shape {tuple(z.shape[:-1])} + (P,) "
            f"(z without its last dim, then the positives), got {tuple(target.shape)}"
        )
    check_class_ids(
        "target", target, num_classes, ignore_index=ignore_index, padding_idx=padding_idx
    )
    there = target != ignore_index
    mask = there.any(dim=-1)
    targets, present = target[mask].long(), there[mask]
    first = targets.gather(1, present.long().argmax(dim=1, keepdim=True))
    targets = torch.where(present, targets, first)
    listed = targets.masked_fill(~present, -1).sort(dim=1).values
    if bool(((listed[:, 1:] == listed[:, :-1]) & (listed[:, 1:] >= 0)).any()):
        raise ValueError("a position lists the same positive twice; list each class once")
    return ScoredPositives(z[mask], targets, present, mask)


def check_k(k: int, num_classes: int) -> None:
    """Checks that ``k`` is an integer in ``[1, num_classes]``."""
    check_positive_int("k", k)
    if k > num_classes:
        raise ValueError(f"k must be <= num_classes={num_classes}, got {k}")


def scored_positions(
    z: Tensor,
    target: Tensor,
    num_classes: int,
    dim: int,
    *,
    ignore_index: int,
    padding_idx: int | None,
    static: bool = False,
) -> ScoredPositions:
    """Validates ``z`` ``[..., dim]`` and ``target`` ``[...]`` (class ids in
    ``[0, num_classes)``) and keeps the scored positions.

    With ``static`` under ``torch.compile`` or on CUDA (:func:`~lightning_sampled._validation.
    sync_free`) every position is kept instead (``T`` is then ``target.numel()``), so that no
    shape depends on the data and nothing breaks the graph or syncs the host: ignored positions
    get a stand-in target (class 0, or 1 when 0 is ``padding_idx``), and the caller must weight
    them 0 (:func:`position_weights` with ``static``).
    """
    check_queries(z, num_classes, dim)
    if tuple(target.shape) != tuple(z.shape[:-1]):
        raise ValueError(
            f"target must have shape {tuple(z.shape[:-1])} (z without its last dim), "
            f"got {tuple(target.shape)}"
        )
    check_class_ids(
        "target", target, num_classes, ignore_index=ignore_index, padding_idx=padding_idx
    )
    mask = target != ignore_index
    if static and sync_free(target):
        stand_in = int(padding_idx == 0)
        kept = target.long().where(mask, stand_in).reshape(-1)
        return ScoredPositions(z.reshape(-1, dim), kept, mask)
    return ScoredPositions(z[mask], target[mask].long(), mask)


def position_weights(
    sample_weight: Tensor | None,
    target: Tensor,
    mask: Tensor,
    *,
    ignore_index: int,
    static: bool = False,
    mean: bool = True,
) -> Tensor | None:
    """Validates ``sample_weight`` ``[...]`` (the shape of ``target``) and keeps the scored
    positions ``mask``: fp32 ``[T]``, or ``None`` when no weights are given. Weights that are 0
    at every scored position are refused where they divide (``mean``, the weighted mean) and
    allowed where they do not (the ``"sum"`` and ``"none"`` reductions).

    With ``static`` under ``torch.compile`` or on CUDA (the positions of
    :func:`scored_positions` with ``static``): fp32 ``[target.numel()]`` weights, 0 at the
    ignored positions, also without ``sample_weight``; their checks are ``torch._assert_async``
    calls (``RuntimeError``).
    """
    static = static and sync_free(target)
    if sample_weight is None:
        return mask.reshape(-1).float() if static else None
    if not isinstance(sample_weight, Tensor) or sample_weight.shape != target.shape:
        shape = (
            tuple(sample_weight.shape)
            if isinstance(sample_weight, Tensor)
            else type(sample_weight).__name__
        )
        raise ValueError(
            f"sample_weight must be a tensor of shape {tuple(target.shape)} (that of target), "
            f"got {shape}"
        )
    if sample_weight.dtype == torch.bool or sample_weight.is_complex():
        raise ValueError(f"sample_weight must be real numbers, got dtype {sample_weight.dtype}")
    weights = sample_weight.float()
    check_finite("sample_weight", weights)
    if static:
        torch._assert_async((weights >= 0).all(), "sample_weight must be non-negative")
        weights = (weights * mask).reshape(-1)
        if mean:
            torch._assert_async(
                (weights > 0).any() | ~mask.any(),
                "sample_weight is 0 at all scored positions: the weighted mean is undefined",
            )
        return weights
    if bool((weights < 0).any()):
        raise ValueError(
            f"sample_weight must be non-negative, got {float(weights.min()):g} (shape "
            f"{tuple(weights.shape)})"
        )
    weights = weights[mask]
    if mean and weights.numel() and not bool((weights > 0).any()):
        raise ValueError(
            f"sample_weight is 0 at all {weights.numel()} scored positions (targets other than "
            f"ignore_index={ignore_index}): the weighted mean is undefined"
        )
    return weights


class GivenNegatives(NamedTuple):
    """Negatives a caller supplies instead of drawing them (:func:`given_negatives`).

    Attributes:
        ids: long ``[M]`` (shared by every position) or ``[..., M]`` (per position, the target's
            shape then ``M``).
        log_q: fp32, the shape of ``ids``: ``log q_j``, each negative's probability in one draw
            from the proposal that produced it.
        target_log_q: fp32 ``[...]`` (the target's shape) ``log q_y``, or ``None``.
    """

    ids: Tensor
    log_q: Tensor
    target_log_q: Tensor | None

    def at(self, mask: Tensor, num_kept: int) -> GivenNegatives:
        """The same negatives for the ``num_kept`` positions of :func:`scored_positions`: those
        ``mask`` ``[...]`` marks, or all of them when ``num_kept`` is ``mask``'s size (its
        ``static`` form). Per-position tensors become ``[T, M]`` / ``[T]``; shared ones stay."""

        def kept(x: Tensor | None) -> Tensor | None:
            if x is None:
                return None
            if num_kept == mask.numel():
                return x.reshape(num_kept, *x.shape[mask.dim() :])
            return x[mask]

        if self.ids.dim() > 1:
            return GivenNegatives(kept(self.ids).long(), kept(self.log_q), kept(self.target_log_q))
        return GivenNegatives(self.ids.long(), self.log_q, kept(self.target_log_q))


def given_negatives(
    negatives: Tensor,
    negative_log_q: Tensor | None,
    target_log_q: Tensor | None,
    target: Tensor,
    num_classes: int,
    padding_idx: int | None = None,
    *,
    several: bool = False,
) -> GivenNegatives:
    """Validates negatives a caller supplies (:class:`GivenNegatives`) for targets ``target``
    (``[...]``, or ``[..., P]`` with ``several`` positives per position, whose ``target_log_q``
    is then ``[..., P]``).

    Raises:
        ValueError: naming the argument, if ``negatives`` is not ``[M]`` or
            ``[*target.shape, M]`` with ``M >= 1``, ``negative_log_q`` is missing or not of its
            shape, or a log-probability is NaN or infinite.
        IndexError: if a negative is out of ``[0, num_classes)`` or the padding class.
    """
    shape = tuple(target.shape[:-1] if several else target.shape)
    if not isinstance(negatives, Tensor) or negatives.dim() not in (1, len(shape) + 1):
        raise ValueError(f"negatives must be a tensor [M] or {shape + ('M',)}, got {negatives!r}")
    if negatives.dim() > 1 and tuple(negatives.shape[:-1]) != shape:
        raise ValueError(
            f"per-position negatives must have shape {shape + ('M',)} (the target's, then M), "
            f"got {tuple(negatives.shape)}"
        )
    if negatives.shape[-1] == 0:
        raise ValueError("negatives must hold at least one negative per position (M >= 1)")
    check_class_ids("negatives", negatives, num_classes, padding_idx=padding_idx)
    if negative_log_q is None:
        raise ValueError(
            "negatives need negative_log_q, each negative's log-probability under the proposal "
            "that drew it (log(1 / N) for uniform draws), for the logQ correction"
        )
    if not isinstance(negative_log_q, Tensor) or negative_log_q.shape != negatives.shape:
        got = tuple(negative_log_q.shape) if isinstance(negative_log_q, Tensor) else negative_log_q
        raise ValueError(
            f"negative_log_q must have the shape of negatives {tuple(negatives.shape)}, got {got}"
        )
    check_finite("negative_log_q", negative_log_q.float())
    if target_log_q is not None:
        if not isinstance(target_log_q, Tensor) or target_log_q.shape != target.shape:
            raise ValueError(f"target_log_q must have the shape of target {tuple(target.shape)}")
        check_finite("target_log_q", target_log_q.float())
        target_log_q = target_log_q.float()
    return GivenNegatives(negatives, negative_log_q.float(), target_log_q)


def check_reduction(reduction: str) -> None:
    """Checks that ``reduction`` is one of :data:`REDUCTIONS`."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")


def reduce_losses(
    losses: Tensor,
    weights: Tensor | None,
    mask: Tensor,
    reduction: str,
    z: Tensor,
    auxiliary: Tensor | None = None,
) -> Tensor:
    """The per-position ``losses`` ``[T]`` of the positions ``mask`` ``[...]`` kept (all of
    them, ignored ones weighted 0, where :func:`scored_positions` was ``static``), reduced:

    - ``"mean"``: :func:`weighted_mean` (``sum(w * loss) / sum(w)``), a scalar;
    - ``"sum"``: ``sum(w * loss)``, a scalar;
    - ``"none"``: ``w * loss`` in the shape of ``mask``, 0 at the ignored positions.

    ``w`` is 1 without ``weights``. A batch-level ``auxiliary`` loss (a sampler's, e.g.
    MIDX-Learn's) is added to the scalars and, under ``"none"``, shared among the scored
    positions in proportion to ``w``, so that the ``"none"`` losses sum to the ``"sum"`` loss.
    With no scored position (``T = 0``) the result is 0, attached to the graph of ``z``.
    """
    if losses.numel() == 0:  # a rank of a split table with nothing to score still backpropagates
        losses = losses + z.sum() * 0.0
    if reduction == "mean":
        out = weighted_mean(losses, weights) if losses.numel() else losses.sum()
        return out if auxiliary is None else out + auxiliary
    weighted = losses if weights is None else losses * weights
    if reduction == "sum":
        return weighted.sum() if auxiliary is None else weighted.sum() + auxiliary
    if auxiliary is not None and losses.numel():
        share = torch.ones_like(losses) if weights is None else weights
        weighted = weighted + auxiliary * share / share.sum().clamp(min=torch.finfo().tiny)
    if losses.numel() == mask.numel():  # every position kept (static, or none ignored)
        return torch.where(mask, weighted.reshape(mask.shape), 0.0)
    return weighted.new_zeros(mask.shape).masked_scatter(mask, weighted)


def nothing_scored(mask: Tensor, reduction: str, z: Tensor) -> Tensor:
    """:func:`reduce_losses` of a call that scores no position (``mask`` ``[...]`` all
    ``False``): 0, or zeros of ``mask``'s shape under ``"none"``, attached to ``z``'s graph."""
    return reduce_losses(z.new_zeros(0, dtype=torch.float32), None, mask, reduction, z)


def weighted_mean(losses: Tensor, weights: Tensor | None) -> Tensor:
    """``mean(losses)``, or ``sum(weights * losses) / sum(weights)`` whatever the weights'
    scale; ``losses`` and ``weights`` are ``[T]``. Where
    :func:`~lightning_sampled._validation.sync_free`, weights that are all 0 (every position
    ignored, see :func:`scored_positions` with ``static``) give 0, as eager CPU heads do, not
    ``0 / 0``."""
    if weights is None:
        return losses.mean()
    # divided by their largest first, so the mean is scale-invariant: weights of 1e38 would
    # overflow the sums, weights of 1e-45 (fp32 denormals) lose their digits
    largest = weights.amax()
    weights = weights / torch.where(largest > 0, largest, 1.0)
    total = weights.sum()
    if sync_free(total):
        total = torch.where(total > 0, total, 1.0)
    return (losses * weights).sum() / total
