"""``ProposalHead``: the base of every head that draws classes from a proposal (a ``Sampler``).

It holds what such heads share, once: the ``sampler`` argument and its checks, ``sparse_grad``,
``refresh_index`` (which rebuilds the proposal's index from the class vectors the head scores),
the proposal's auxiliary loss, and the training step's frame (validate, score the kept positions,
weight, add the auxiliary loss). A subclass implements :meth:`ProposalHead.sampled_losses`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..ops.chunked import scored_rows
from ..ops.inputs import check_reduction, nothing_scored, reduce_losses
from ..samplers import Sampler, UniformSampler
from .base import OutputHead
from .sharded import agreed


class ProposalHead(OutputHead, abc.ABC):
    """A head whose training objective looks at classes drawn from ``sampler``.

    Args:
        num_classes: ``N``.
        dim: ``D``.
        sampler: the proposal; a :class:`~lightning_sampled.samplers.UniformSampler` over the
            head's classes when ``None``. Its ``num_classes`` and ``padding_idx`` must match the
            head's. It sees the scored queries ``normalize(z) / temperature``
            (:meth:`~OutputHead.score_queries`, detached), and :meth:`refresh_index` gives its
            ``refresh`` the class vectors the head scores, so that a query-dependent proposal
            (MIDX) approximates the head's own softmax (without its bias).
        sparse_grad: make the class table's gradient row-sparse (a sparse COO tensor over the
            gathered rows), so that a step costs what the touched rows cost instead of a dense
            ``[N, D]`` gradient. Needs an optimizer that takes sparse gradients
            (:class:`~lightning_sampled.optim.LazyAdam`, ``SparseAdam``, ``SGD``, ``Adagrad``);
            the exact methods (``full_loss``, ...) still give dense gradients.
        **options: the options every head shares (``weight``, ``bias``, ``padding_idx``,
            ``ignore_index``, ``chunk_size``, ``temperature``, ``normalize``,
            ``label_smoothing``), see :class:`OutputHead`.

    Raises:
        ValueError: ``sampler`` is not a ``Sampler`` or covers other classes or another padding
            class; ``normalize=True`` with a sampler that has parameters (its auxiliary loss
            trains codewords on the raw class table, not the unit rows the head scores).
    """

    #: whether a position's loss depends only on that position's query and target, so that
    #: under ``torch.compile`` ignored positions may be kept, weighted 0 (static shapes)
    positions_apart: bool = True

    def __init__(
        self,
        num_classes: int,
        dim: int,
        sampler: Sampler | None = None,
        *,
        sparse_grad: bool = False,
        **options: Any,
    ) -> None:
        super().__init__(num_classes, dim, **options)
        self.sampler = checked_sampler(sampler, num_classes, self.padding_idx)
        if self.normalize and self.sampler.learns:
            raise ValueError(
                f"normalize=True cannot train {type(self.sampler).__name__}'s parameters: its "
                f"auxiliary loss reads the raw class table, not the unit rows the head scores; "
                f"use a sampler without parameters (e.g. MIDXSampler with learnable=False)"
            )
        self.sparse_grad = bool(sparse_grad)

    def require_query_independent(self, why: str) -> None:
        """Raises ``ValueError`` unless the sampler ignores the queries (``why`` says what needs
        it, e.g. ``"shared_negatives=True"``)."""
        if not self.sampler.query_independent:
            raise ValueError(
                f"{why} needs a query-independent sampler, got {type(self.sampler).__name__}"
            )

    def _after_split(self) -> None:
        """The proposal becomes its restriction to this rank's rows
        (:meth:`~lightning_sampled.samplers.Sampler.restricted`), numbered as they are."""
        self.sampler = self.sampler.restricted(self.shard_ids)

    @torch.no_grad()
    def refresh_index(self) -> None:
        """Rebuilds the sampler's index from the class vectors the head scores: the unit rows of
        :meth:`~OutputHead.class_table` when ``normalize``, else the table itself (a no-op for
        static samplers)."""
        with torch.no_grad():  # a candidate tower runs over every class: no graph for it
            table = self.class_table()
        self.sampler.refresh(scored_rows(table, self.normalize))

    def _check_new_rows(self, rows: Tensor) -> None:
        """:meth:`OutputHead._check_new_rows`: the rows the proposal's index must hold."""
        self.sampler.check_class_rows(rows)

    def _after_growth(self, num_new: int) -> None:
        """The proposal's support grows to the table's new rows
        (:meth:`~lightning_sampled.samplers.Sampler.add_classes`: on a split table, those of
        the ``num_new`` classes this rank holds, to which its proposal is restricted) and its
        index is rebuilt from the grown table."""
        added_here = self.shard_ids.numel() - self.sampler.num_classes
        if added_here:
            self.sampler.add_classes(added_here)
        self.refresh_index()

    def proposal_loss(self, queries: Tensor) -> Tensor:
        """The sampler's :meth:`~lightning_sampled.samplers.Sampler.auxiliary_loss` on the
        step's scored queries ``[T, D]`` and the class table: ``0`` unless the sampler learns
        (MIDX-Learn), added to the training loss unweighted. The class table is not read for a
        sampler without parameters (CANE's path sums cost ``O(N D)``)."""
        if not self.sampler.learns:
            return queries.new_zeros((), dtype=torch.float32)
        return self.sampler.auxiliary_loss(queries, self.class_table())

    def forward(
        self,
        z: Tensor,
        target: Tensor,
        sample_weight: Tensor | None = None,
        *,
        reduction: str = "mean",
        positives: str | None = None,
    ) -> Tensor:
        """The head's sampled objective: the (``sample_weight``-weighted) mean of
        :meth:`sampled_losses` over the positions whose target is not ``ignore_index``, plus
        :meth:`proposal_loss`; a scalar (``0``, attached to the graph, when no position is
        scored).

        Args:
            z: ``[..., D]`` queries.
            target: long ``[...]`` targets.
            sample_weight: optional non-negative ``[...]`` (see :class:`OutputHead`).
            reduction: ``"mean"`` (above), ``"sum"`` (the weighted sum plus
                :meth:`proposal_loss`) or ``"none"`` (the weighted losses in the shape of
                ``target``, 0 where ignored, with :meth:`proposal_loss` shared among the scored
                positions in proportion to their weights, so that they sum to ``"sum"``'s loss;
                :func:`~lightning_sampled.ops.inputs.reduce_losses`).
            positives: several positives per position, where the head takes them
                (:class:`~lightning_sampled.heads.SampledSoftmaxHead`); refused here.

        Under ``torch.compile`` the ignored positions are weighted 0 instead of dropped (static
        shapes, see :meth:`~OutputHead._valid_rows`) where :meth:`scores_positions_apart`.
        """
        if positives is not None:
            raise ValueError(
                f"{type(self).__name__} scores one positive per position; SampledSoftmaxHead and "
                "FullSoftmaxHead take several (positives=), and every head's full_loss does"
            )
        return self.objective(
            z,
            target,
            sample_weight,
            reduction,
            lambda queries, y, mask: self.sampled_losses(queries, y),
        )

    @agreed("forward")
    def objective(
        self,
        z: Tensor,
        target: Tensor,
        sample_weight: Tensor | None,
        reduction: str,
        losses_of: Callable[[Tensor, Tensor, Tensor], Tensor],
    ) -> Tensor:
        """:meth:`forward` with the per-position objective ``losses_of(queries [T, D],
        target [T], mask [...]) -> [T]`` of the scored positions (``mask`` marks them among
        ``target``'s, or ``T`` is all of them: :meth:`~OutputHead._valid_rows`)."""
        check_reduction(reduction)
        static = self.scores_positions_apart()
        queries, y, mask = self._valid_rows(z, target, static=static)
        weights = self._valid_weights(
            sample_weight, target, mask, static=static, reduction=reduction
        )
        if y.numel() == 0 and not self.is_split:
            return nothing_scored(mask, reduction, z)
        losses = losses_of(queries, y, mask)
        return reduce_losses(losses, weights, mask, reduction, z, self.proposal_loss(queries))

    @abc.abstractmethod
    def sampled_losses(self, queries: Tensor, target: Tensor) -> Tensor:
        """The objective of each scored position: fp32 ``[T]``.

        Args:
            queries: ``[T, D]`` scored queries (:meth:`~OutputHead.score_queries`).
            target: long ``[T]`` their targets.
        """

    def scores_positions_apart(self) -> bool:
        """Whether no position's loss depends on another's query or target: the class's
        :attr:`positions_apart`, and not with a sampler with parameters (its auxiliary loss
        would see the ignored positions' queries)."""
        return self.positions_apart and not self.sampler.learns

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, sampler={type(self.sampler).__name__}, "
            f"sparse_grad={self.sparse_grad}"
        )


def checked_sampler(sampler: Sampler | None, num_classes: int, padding_idx: int | None) -> Sampler:
    """The proposal a head draws from: ``sampler`` checked against the head's ``num_classes``
    and ``padding_idx``, or a :class:`~lightning_sampled.samplers.UniformSampler` when ``None``.

    Raises:
        ValueError: naming ``sampler``, if it is not a ``Sampler`` or covers other classes or
            another padding class.
    """
    if sampler is None:
        return UniformSampler(num_classes, padding_idx=padding_idx)
    if not isinstance(sampler, Sampler):
        raise ValueError(f"sampler must be a Sampler, got {type(sampler).__name__}")
    if sampler.num_classes != num_classes:
        raise ValueError(
            f"sampler.num_classes={sampler.num_classes} does not match num_classes={num_classes}"
        )
    if sampler.padding_idx != padding_idx:
        raise ValueError(
            f"sampler.padding_idx={sampler.padding_idx} does not match padding_idx={padding_idx}"
        )
    return sampler
