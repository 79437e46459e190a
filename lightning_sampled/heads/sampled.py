"""``SampledSoftmaxHead``: softmax over the positive and ``M`` sampled negatives, logQ-corrected.

**The default configuration** is ``convention="corrected_all"`` with the batch's other targets as
further negatives (``in_batch_negatives="auto"``, mixed negative sampling, below), whatever the
proposal. Issue 31's grid (PTB in the MIDX paper's Table 4 setting, GCIDE, MovieLens-1M SASRec
and GRU4Rec, each with uniform, unigram and MIDX-rq negatives, per query and shared) found each
fixed convention a trap somewhere: ``"exact_positive"`` runs away on Zipfian targets with few
negatives, ``"corrected_all"`` alone loses a few percent NDCG@10 on MovieLens with uniform
negatives per query and is far from the full softmax on PTB with negatives shared by the batch;
with the batch's targets added it was the best configuration of every cell measured. The
measurements are in ``benchmarks/results/estimator_grid/estimator_grid.md`` and the README's
section "The sampled-softmax estimator and the default configuration", not here.

The price is a ``[T, U]`` product over the ``U`` distinct targets of the batch's ``T``
positions, which grows with the batch (``benchmarks/results/default_cost.md``: on a CPU, pooled
(:meth:`SampledSoftmaxHead.pooled`), the head's step alone cost 2.0x the plain head's at
MovieLens-1M's batch and 5.9x at a 1M-item recommender's, whose plain head draws 20).
``max_in_batch_draws=K`` bounds it: each row draws ``K`` of the other positions at random, with
replacement, and their targets are its in-batch candidates,
corrected like sampled draws by ``log(M q + K q_b)`` (``K`` draws per query instead of ``T - 1``,
``[T, K]`` work instead of ``[T, U]``). The rows draw independently, so the draws' noise averages
over the batch; ``K`` positions shared by every row, the first form of this limit, carried the
noise of shared negatives and lost the MovieLens-1M recommenders of issue 31's grid half their
NDCG@10: by brute force at MovieLens-1M's batch its gradient's spread from step to step was 0.12
of the gradient's norm, against 0.009 per row and 0.0065 for the plain head's per-query draws
(``benchmarks/results/estimator_gradient.md``, README's section on the default's price). Drawn per
row, the ``[T, K, D]`` gathered vectors cost more than the products they feed;
``in_batch_group_size=g`` lets each group of ``g`` consecutive rows share ``K`` positions drawn
from outside the group, one ``[g, D] x [D, K]`` product per group: by the same brute force
``g = 32`` keeps the spread at 0.010-0.013 (0.014-0.024 at ``g = 200``, a whole MovieLens
sequence). ``in_batch_negatives=False`` is the plain sampled softmax.

The estimator conventions (:mod:`lightning_sampled.ops.conventions`) differ in what they
correct and mask:

- ``"corrected_all"`` (the default): every logit, the positive's included, becomes
  ``o_i - log(M q_i)`` and accidental hits are kept, so the draws estimate all of ``Z`` (the
  target's share included) and the positive's corrected term adds an ``O(1 / M)`` bias:
  consistent, and the positive counts ``1 / (M q_y)`` times in the normaliser, which damps the
  targets the proposal rarely draws. It is never far from the best convention, where
  ``"exact_positive"`` can be very far (issue 31's grid, two seeds on an H200): on a language
  model with Zipfian targets and 20 negatives per token (PTB, the MIDX paper's Table 4) it gives
  1.07-1.54x the full softmax's test perplexity with negatives per query where
  ``"exact_positive"`` gives 1.8-204x (2.6-5.7x against 5.4-170x with negatives shared by the
  batch), and on MovieLens-1M it is within 3% of the best everywhere but on flat
  recommendation targets with uniform negatives per query: 3.5% (GRU4Rec) and 6.4% (SASRec)
  NDCG@10 below ``"exact_positive"``.
- ``"exact_positive"`` (the MIDX paper's Eq. 1): the positive's logit ``o_y`` is left
  uncorrected, each negative becomes ``o_j - log(M q_j)``, and negatives equal to the target
  (accidental hits) get ``-inf``. Then ``sum_j exp(o_j - log(M q_j))`` over the draws is an
  unbiased estimate of ``Z - exp(o_y)`` and the positive contributes its exact share, so the
  estimated normaliser is unbiased and the gradient tends to the full-softmax gradient as ``M``
  grows, whatever ``p_y``; the positive's proposal probability is never needed (one sampler
  call fewer per step). At few negatives on Zipfian targets it is a trap: a frequent target is
  pushed up at nearly every step and down, with weight ``1 / (M q)``, only on the steps that draw
  it, and training runs away (PTB above). Choose it for recommenders with per-query negatives,
  where it gains those 3.5-6.4% with uniform negatives.
- ``"tensorflow"``: every logit corrected *and* accidental hits masked, the defaults of
  TensorFlow's ``sampled_softmax_loss``. The estimated normaliser lacks the target's share
  ``p_y``, so the gradient stays biased however large ``M`` is once a target is likely (on four
  classes with targets ``(.6, .25, .1, .05)`` the first class is learned as ``.996``). Offered to
  reproduce TensorFlow; harmless only when every ``p_y`` is small.

Over a table split across ranks (``sharded=True``) the draws are stratified by rank
(:mod:`.stratified`): each rank draws ``M_r`` negatives from the proposal restricted to its rows,
and each negative is corrected by ``log(M_r q_r(j))``, its probability under that design.

With in-batch negatives (``in_batch_negatives`` ``"auto"``, the default, or ``True``) the other
positions' targets join the negatives (mixed negative
sampling, Yang et al. 2020; pure in-batch softmax with ``num_negatives=0``), and every candidate,
whichever set it came from, is corrected by ``log(M q(j) + (T - 1) q_b(j))`` instead of
``log(M q(j))``, ``q_b`` being the targets' distribution estimated by
:class:`~lightning_sampled.samplers.frequency.TargetFrequency`
(:mod:`lightning_sampled.ops.in_batch`). The conventions apply unchanged: under
``"exact_positive"`` the positive stays uncorrected and batch candidates equal to the target are
accidental hits. Over a split table the batch is every rank's batch, each rank scoring the
targets it holds (:meth:`SampledSoftmaxHead.split_losses`).
"""

from __future__ import annotations

import math
import warnings
from typing import Any, NamedTuple

import torch
from torch import Tensor

from .._validation import check_async, check_int, check_positive_int
from ..ops import chunked
from ..ops.conventions import CONVENTIONS, Convention, convention_named
from ..ops.in_batch import (
    CANDIDATE_METHODS,
    batch_candidates,
    drawn_per_group,
    groups_scored,
    in_batch_logsumexp,
    log_mixture_size,
)
from ..ops.inputs import given_negatives, nothing_scored, reduce_losses
from ..ops.losses import sampled_multi_positive_losses, sampled_softmax_losses, softmax_losses
from ..samplers import Sample, Sampler
from ..samplers.frequency import TargetFrequency
from ..sharding.collectives import all_reduce_sum, combined_logsumexp, gather_rows
from .negative_sources import (
    DrawnNegatives,
    InBatchDraws,
    InBatchNegatives,
    NegativeSource,
    PooledNegatives,
)
from .proposal import ProposalHead
from .stratified import held_candidates, local_logsumexp, stratum_size


class BatchProposal(NamedTuple):
    """In-batch negatives' proposal for one batch: ``q_b``, the draws per query (``T - 1``, or
    ``K`` under ``max_in_batch_draws``; a long scalar tensor where ``mask`` is given) and the
    batch's targets (long ``[T]``), which floor ``q_b`` (:meth:`TargetFrequency.log_prob`), but
    those ``mask`` (bool ``[T]``, or ``None``) leaves out. ``counted``: the batch was just
    counted into a moving estimate, so the floor cannot change it. ``per_row``: each row draws
    ``num_draws`` positions, shared by its group of ``in_batch_group_size`` rows
    (:func:`~lightning_sampled.ops.in_batch.drawn_per_group`), instead of taking every other
    scored one."""

    frequency: TargetFrequency
    num_draws: int | Tensor
    targets: Tensor
    mask: Tensor | None
    counted: bool
    per_row: bool = False

    def log_prob(self, ids: Tensor) -> Tensor:
        """``log q_b`` of class ids of any shape, floored by the batch's targets."""
        if self.counted:
            return self.frequency.log_prob(ids, after_update=True)
        return self.frequency.log_prob(ids, self.targets, self.mask)


class BatchNegatives(NamedTuple):
    """A batch's negatives, drawn and found once before any row is scored.

    Attributes:
        batch: the in-batch proposal (:meth:`SampledSoftmaxHead.batch_proposal`), ``None``
            without in-batch negatives.
        sources: the negative sources, the sampler's draws first (:mod:`.negative_sources`).
        positive_log_q: ``[T]`` the positives' ``log q`` under the sampler where the convention
            corrects the positive and the head draws (else ``None``).
    """

    batch: BatchProposal | None
    sources: list[NegativeSource]
    positive_log_q: Tensor | None

    def rows(self, block: slice) -> BatchNegatives:
        """The negatives of the rows ``block`` of the batch."""
        return BatchNegatives(
            self.batch,
            [source.rows(block) for source in self.sources],
            None if self.positive_log_q is None else self.positive_log_q[block],
        )

    @property
    def num_columns(self) -> int:
        """Candidate columns per row: the positive and every source's."""
        return 1 + sum(source.num_columns for source in self.sources)

    @property
    def gathered_per_row(self) -> int:
        """Class vectors gathered for each row: its positive and its own draws."""
        return 1 + sum(source.gathered_per_row for source in self.sources)

    @property
    def group_size(self) -> int:
        """The rows that share their in-batch draws (:class:`~.negative_sources.InBatchDraws`),
        which a block of rows keeps whole: 1 without them."""
        return next((s.group_size for s in self.sources if isinstance(s, InBatchDraws)), 1)


class SampledSoftmaxHead(ProposalHead):
    """Sampled softmax, consistent at any target probability.

    For each query, ``M`` negatives are drawn from the sampler with replacement, the logits are
    corrected as ``convention`` says (module docstring), and the loss is the cross-entropy of the
    positive among the ``1 + M`` logits. By default the batch's other targets join the draws
    (``in_batch_negatives="auto"``) and every logit, the positive's included, becomes
    ``o_i - log(M q_i + (T - 1) q_b(i))`` (``"corrected_all"``): consistent as ``M`` grows, and
    within reach of the best configuration on every task of issue 31's grid (module docstring,
    with the measured table). The sampler's :meth:`~Sampler.auxiliary_loss` (non-zero only for
    samplers that learn, such as MIDX-Learn) is added to the returned loss, unweighted
    (:class:`ProposalHead`, which also says what the sampler sees).

    Per-position weights: ``forward(z, target, sample_weight)`` is ``sum(w * loss) / sum(w)`` of
    the per-position sampled losses (see :class:`OutputHead`). Label smoothing is refused
    (``ValueError``): the sampled objective has no term for the uniform share over all classes.

    Args:
        num_classes: ``N``.
        dim: ``D``.
        sampler: the proposal (:class:`ProposalHead`); uniform when ``None``.
        num_negatives: ``M``, draws per query (or per batch when shared); ``0`` only with
            ``in_batch_negatives`` (pure in-batch softmax).
        shared_negatives: one set of ``M`` negatives for the whole batch (TensorFlow style: one
            ``[M, D]`` gather) instead of ``M`` per query (the MIDX paper's style, ``[T, M, D]``).
            Needs a query-independent sampler.
        convention: ``"corrected_all"`` (default), ``"exact_positive"`` (both consistent;
            the second gains a few percent on recommenders with per-query negatives, and runs
            away on Zipfian targets with few negatives) or ``"tensorflow"`` (TensorFlow's
            defaults, biased when a target is likely).
        in_batch_negatives: also use the other scored positions' targets in the batch as
            negatives (module docstring); their proposal ``q_b`` is estimated from the training
            targets seen so far (moving averages over about ``1 / frequency_decay`` steps), or
            fixed by ``target_counts``. In-batch negatives assume the positions of a batch are
            independent draws; positions of one sequence are not quite. ``"auto"`` (the
            default, the module docstring says why) uses them wherever the head draws its own
            negatives: a call with ``negatives=`` or ``positives=`` goes without them, and a
            checkpoint saved without ``q_b`` loads with ``q_b`` estimated afresh (a warning).
            ``True`` refuses those calls; ``False`` is the plain sampled softmax.
        target_counts: optional ``[N]`` training counts of the targets, fixing ``q_b``.
        frequency_decay: the weight of the newest step in the estimate of ``q_b``.
        in_batch_candidates: how the batch's distinct targets are found
            (:func:`~lightning_sampled.ops.in_batch.batch_candidates`): ``"auto"`` sorts them
            in fixed shapes (no host sync, no graph break) on a GPU at any batch size and
            under ``torch.compile`` on the CPU up to
            :data:`~lightning_sampled.ops.in_batch.FIXED_SHAPE_POSITIONS` positions, and uses
            ``torch.unique`` elsewhere; ``"sorted"`` or ``"distinct"`` force one (over a split
            table the candidates are always distinct).
        max_in_batch_draws: at most this many in-batch draws per query: where more positions
            are scored (over a split table: in every rank's batch together), each row draws
            this many of the other scored positions, with replacement, and their targets are
            its in-batch candidates (:meth:`in_batch_draws`), ``[T, K]`` gathered vectors
            instead of the ``[T, U]`` block over the batch's distinct targets (on a CPU the
            gathers cost more than the pooled block's products at the recipes' batches:
            ``benchmarks/results/default_cost.md``). ``None`` (the default): every other
            position's target.
        in_batch_group_size: under ``max_in_batch_draws``, each group of this many
            consecutive rows shares its ``K`` draws (from the scored positions outside the
            group), scored by one ``[g, D] x [D, K]`` product per group instead of ``K``
            gathered vectors per row; the draws' noise then averages over the batch's
            ``T / g`` groups instead of its ``T`` rows (at ``K = 256`` and ``g = 32``, 1.26x the
            plain head's step at MovieLens-1M's batch and 2.1x at a 1M-item recommender's, below
            the unbounded default's 2.0x and 5.9x: ``benchmarks/results/default_cost.md``). 1
            (the default): every row its own. Where the batch has no more than ``g`` positions,
            every other position's target.
        **options: ``sparse_grad`` of :class:`ProposalHead`; ``weight``, ``bias``,
            ``padding_idx``, ``ignore_index``, ``chunk_size``, ``temperature``, ``normalize``,
            ``label_smoothing`` (0 only), ``sharded`` and ``process_group`` of
            :class:`OutputHead`. ``sharded=True`` takes the uniform, unigram, log-uniform and
            MIDX (not MIDX-Learn) samplers, with or without in-batch negatives (every rank's
            targets, ``tests/heads/test_sharded.py``).
    """

    sharding_refusal = None

    def __init__(
        self,
        num_classes: int,
        dim: int,
        sampler: Sampler | None = None,
        num_negatives: int = 100,
        *,
        shared_negatives: bool = False,
        convention: str = "corrected_all",
        in_batch_negatives: bool | str = "auto",
        target_counts: Tensor | None = None,
        frequency_decay: float = 0.01,
        in_batch_candidates: str = "auto",
        max_in_batch_draws: int | None = None,
        in_batch_group_size: int = 1,
        **options: Any,
    ) -> None:
        super().__init__(num_classes, dim, sampler, **options)
        if shared_negatives:
            self.require_query_independent("shared_negatives=True")
        if not (isinstance(in_batch_negatives, bool) or in_batch_negatives == "auto"):
            raise ValueError(
                f"in_batch_negatives must be True, False or 'auto', got {in_batch_negatives!r}"
            )
        #: whether the batch's other targets join the drawn negatives
        self.in_batch_negatives = in_batch_negatives is not False
        #: whether they were chosen by default (``"auto"``): then a call that brings its own
        #: negatives (``negatives=``) or several positives (``positives=``) goes without them
        #: instead of raising, and an older checkpoint without ``q_b`` loads
        self.in_batch_by_default = in_batch_negatives == "auto"
        if self.in_batch_by_default:
            self.register_load_state_dict_pre_hook(_fresh_frequency_of_older_checkpoints)
        if in_batch_candidates not in CANDIDATE_METHODS:
            raise ValueError(
                f"in_batch_candidates must be one of {CANDIDATE_METHODS}, got "
                f"{in_batch_candidates!r}"
            )
        self.in_batch_candidates = in_batch_candidates
        if self.in_batch_negatives:
            self.num_negatives = check_int("num_negatives", num_negatives)
            if num_negatives < 0:
                raise ValueError(f"num_negatives must be >= 0, got {num_negatives}")
            self.target_frequency = TargetFrequency(
                num_classes, decay=frequency_decay, counts=target_counts
            )
        else:
            self.num_negatives = check_positive_int("num_negatives", num_negatives)
            if target_counts is not None:
                raise ValueError("target_counts is only used with in_batch_negatives=True")
        #: ``K``, the most in-batch draws per query (``None``: no limit)
        self.max_in_batch_draws = self._checked_limit(max_in_batch_draws)
        #: ``g``, the consecutive rows that share their in-batch draws under the limit
        self.in_batch_group_size = check_positive_int("in_batch_group_size", in_batch_group_size)
        if in_batch_group_size > 1 and max_in_batch_draws is None:
            raise ValueError("in_batch_group_size groups the draws of max_in_batch_draws: set it")
        self.shared_negatives = bool(shared_negatives)
        convention_named(convention)
        #: the convention's name; :attr:`rules` is what it corrects and masks
        self.convention = convention
        #: ``M_r``, this rank's draws per query over a split table (:func:`stratum_size`)
        self.num_local_negatives = self.num_negatives
        self._shard_if_distributed()

    def _checked_limit(self, limit: int | None) -> int | None:
        """``max_in_batch_draws``, checked: a positive int, and only with in-batch negatives."""
        if limit is None:
            return None
        if not self.in_batch_negatives:
            raise ValueError("max_in_batch_draws limits in-batch negatives: not with False")
        return check_positive_int("max_in_batch_draws", limit)

    def _after_growth(self, num_new: int) -> None:
        """:meth:`ProposalHead._after_growth`, and the in-batch frequency estimate grows."""
        super()._after_growth(num_new)
        if self.in_batch_negatives:
            self.target_frequency.add_classes(num_new)

    def _after_split(self) -> None:
        """Sets :attr:`num_local_negatives` from the whole proposal, then restricts it."""
        self.num_local_negatives = (
            stratum_size(self.sampler, self.shard_ids, self.num_negatives, self.dim)
            if self.num_negatives
            else 0
        )
        super()._after_split()

    def forward(
        self,
        z: Tensor,
        target: Tensor,
        sample_weight: Tensor | None = None,
        *,
        reduction: str = "mean",
        negatives: Tensor | None = None,
        negative_log_q: Tensor | None = None,
        target_log_q: Tensor | None = None,
        num_hard_negatives: int | None = None,
        positives: str | None = None,
    ) -> Tensor:
        """The sampled objective (:meth:`ProposalHead.forward`), over drawn negatives or, with
        ``negatives``, over the caller's own (none drawn): the same convention, correction and
        reduction; with ``positives``, of several positives per position.

        Args:
            z, target, sample_weight, reduction: as :meth:`ProposalHead.forward`.
            negatives: long ``[M]`` (shared by every position) or ``[..., M]`` (per position)
                class ids, e.g. another model's hard candidates or a retrieval system's.
            negative_log_q: their log-probability of being drawn in one draw, the shape of
                ``negatives``: each becomes ``o_j - log(M q_j)``. ``log(1 / N)`` for uniform
                draws; for a deterministic list there is no ``q``, and a constant gives the plain
                softmax over the list.
            target_log_q: ``log q_y`` (the shape of ``target``), needed with ``negatives`` by
                the conventions that correct the positive (``"corrected_all"``,
                ``"tensorflow"``).
            num_hard_negatives: keep only each position's ``k`` highest corrected negatives
                (TensorFlow Recommenders' hard-negative mining; biased by design:
                :func:`~lightning_sampled.ops.losses.hardest`).
            positives: ``"each"`` or ``"soft_labels"`` with ``target`` ``[..., P]`` (distinct
                positives, ``ignore_index`` where fewer):
                :func:`~lightning_sampled.ops.losses.sampled_multi_positive_losses`, each
                position's loss the mean over its positives; not with ``in_batch_negatives``.

        Raises:
            ValueError: ``negatives`` with ``in_batch_negatives`` or a table split across ranks,
                or the options of ``negatives`` without it (and the checks of
                :func:`~lightning_sampled.ops.inputs.given_negatives`).
        """
        if negatives is None:
            if not (negative_log_q is None and target_log_q is None and num_hard_negatives is None):
                raise ValueError(
                    "negative_log_q, target_log_q and num_hard_negatives go with negatives="
                )
            if positives is None:
                return self.objective(z, target, sample_weight, reduction, self._drawn_losses)
        if positives is not None:
            return self._several_positives_objective(
                z, target, sample_weight, reduction, positives, negatives,
                negative_log_q, target_log_q, num_hard_negatives,
            )  # fmt: skip
        if self.refuses_batch_free_calls or self.is_split:
            raise ValueError(
                "negatives= replaces the drawn negatives of a head without in_batch_negatives on "
                "a whole table; this head has "
                + ("in_batch_negatives=True" if self.refuses_batch_free_calls else "a split table")
            )
        given = given_negatives(
            negatives, negative_log_q, target_log_q, target, self.num_classes, self.padding_idx
        )

        def losses_of(queries: Tensor, y: Tensor, mask: Tensor) -> Tensor:
            kept = given.at(mask, y.numel())
            pos, neg = self.target_and_candidate_logits(queries, y, kept.ids)
            return sampled_softmax_losses(
                pos,
                neg,
                kept.ids,
                kept.log_q,
                y,
                convention=self.convention,
                target_log_q=kept.target_log_q,
                num_hard_negatives=num_hard_negatives,
            )

        return self.objective(z, target, sample_weight, reduction, losses_of)

    def _several_positives_objective(
        self,
        z: Tensor,
        target: Tensor,
        sample_weight: Tensor | None,
        reduction: str,
        positives: str,
        negatives: Tensor | None,
        negative_log_q: Tensor | None,
        target_log_q: Tensor | None,
        num_hard_negatives: int | None,
    ) -> Tensor:
        """:meth:`forward` with several positives per position (``target`` ``[..., P]``)."""
        if self.refuses_batch_free_calls:
            raise ValueError(
                "positives= does not combine with in_batch_negatives=True (the batch's other "
                "targets would have to be told apart from each position's own positives)"
            )
        kept, queries, weights = self.several_positives(
            z, target, sample_weight, reduction, positives
        )
        if negatives is None and self.num_negatives == 0:
            raise ValueError(
                "positives= scores several positives against the head's drawn negatives, and "
                "this head draws none (num_negatives=0; the batch's other targets are not "
                "negatives when several positives are given): build it with num_negatives > 0, "
                "or pass negatives="
            )
        if queries.shape[0] == 0:
            return nothing_scored(kept.mask, reduction, z)
        if negatives is None:
            draw, positive_log_q = self._draw(queries.detach(), kept.targets)
            ids, log_q = draw.ids, draw.log_q
        else:
            given = given_negatives(
                negatives, negative_log_q, target_log_q, target, self.num_classes,
                self.padding_idx, several=True,
            ).at(kept.mask, queries.shape[0])  # fmt: skip
            ids, log_q, positive_log_q = given.ids, given.log_q, given.target_log_q
        losses = sampled_multi_positive_losses(
            self.candidate_logits(queries, kept.targets),
            kept.present,
            self.candidate_logits(queries, ids),
            ids,
            log_q,
            kept.targets,
            positives=positives,
            convention=self.convention,
            target_log_q=positive_log_q,
            num_hard_negatives=num_hard_negatives,
        )
        return reduce_losses(losses, weights, kept.mask, reduction, z, self.proposal_loss(queries))

    def sampled_logits(self, z: Tensor, target: Tensor, mask: Tensor | None = None) -> Tensor:
        """Corrected logits ``[T, 1 + C]`` of the scored positions: column 0 is the positive,
        then the ``M`` draws and, with ``in_batch_negatives``, the batch's distinct targets
        (:func:`~lightning_sampled.ops.in_batch.batch_candidates`).

        With ``in_batch_negatives``, a call in training mode counts ``target`` into ``q_b``.

        Args:
            z: ``[T, D]`` scored queries of the valid positions (:meth:`_valid_rows`); the
                sampler sees them detached.
            target: long ``[T]`` their targets.
            mask: bool ``[T]`` or ``None``: with ``in_batch_negatives``, the positions whose
                targets are candidates and draws (the others: ignored positions kept, with a
                stand-in target, for static shapes).
        """
        negatives = self.batch_negatives(z, target, mask)
        return self.corrected_logits(z, target, mask, negatives)

    def batch_negatives(self, z: Tensor, target: Tensor, mask: Tensor | None) -> BatchNegatives:
        """The negatives of a batch of scored queries ``z`` ``[T, D]`` with targets ``[T]``
        (``mask`` as in :meth:`sampled_logits`): the sampler's draws and the batch's targets,
        found once (with ``in_batch_negatives``, a call in training mode counts ``target`` into
        ``q_b``)."""
        batch = self.batch_proposal(target, mask) if self.in_batch_negatives else None
        in_batch = None if batch is None else self.in_batch_source(z, target, mask, batch)
        return self.negatives_of(z, target, batch, in_batch)

    def corrected_logits(
        self, z: Tensor, target: Tensor, mask: Tensor | None, negatives: BatchNegatives
    ) -> Tensor:
        """:meth:`sampled_logits` ``[T, 1 + C]`` of queries ``z`` ``[T, D]`` with targets
        ``[T]`` over their ``negatives`` (:meth:`batch_negatives`, or its rows of them)."""
        pos, columns, log_size = self.score(z, target, target, negatives)
        if log_size is not None:
            if mask is not None:  # a left-out position's stand-in may have q_b = 0: keep it finite
                log_size = log_size.where(mask, 0.0)
            pos = pos - log_size
        return torch.cat([pos[:, None], *columns], dim=1)

    def split_losses(self, queries: Tensor, target: Tensor) -> Tensor:
        """The sampled cross-entropy ``[T]`` of this rank's scored ``queries`` ``[T, D]`` and
        global ``target`` ``[T]`` over a table split across ranks, a collective: every rank
        estimates every rank's positions from the negatives it holds (its stratum of the draws,
        :mod:`.stratified`, and of the batch's targets those it holds), and the log-sum-exps
        are combined across ranks.

        With ``in_batch_negatives`` the candidates are the distinct targets of every rank's batch
        (``W T - 1`` in-batch draws per query, as cross-device negatives in contrastive
        training), each corrected by ``log(M_r q_r(j) + (W T - 1) q_b(j))`` on the rank ``r``
        holding it: the objective of the unsharded head on the ranks' batches together.
        """
        group, shard_map = self.process_group, self.shard_map
        z, own = gather_rows(queries, group)
        y, _ = gather_rows(target, group)
        local_y = shard_map.local_or(y)
        owned = local_y >= 0
        batch = self.batch_proposal(y) if self.in_batch_negatives else None
        in_batch = None if batch is None else self.in_batch_source(z, y, None, batch)
        pos, columns, log_size = self.estimate(z, local_y.clamp(min=0), local_y, batch, in_batch)
        pos = all_reduce_sum(pos.masked_fill(~owned, 0.0), group)
        if log_size is not None:  # the log-size of the positive on the rank s that holds it
            pos = pos - all_reduce_sum(torch.where(owned, log_size, 0.0), group)
        lse = combined_logsumexp(local_logsumexp(torch.cat(columns, dim=1)), group, once=pos)
        return (lse - pos)[own]

    def estimate(
        self,
        z: Tensor,
        rows: Tensor,
        hits: Tensor,
        batch: BatchProposal | None,
        in_batch: InBatchNegatives | InBatchDraws | None,
    ) -> tuple[Tensor, list[Tensor], Tensor | None]:
        """The sampled estimate's parts over this head's rows: :meth:`score` of the queries
        over their negatives (:meth:`negatives_of`).

        Args:
            z: ``[T, D]`` scored queries.
            rows: long ``[T]`` their targets' rows in this head's table (over a split table,
                any row where another rank holds the target).
            hits: long ``[T]`` what a drawn candidate equal to the target is: ``rows``, or
                ``-1`` where the target is not in this head's table.
            batch: the in-batch proposal (:meth:`batch_proposal`), ``None`` without in-batch
                negatives.
            in_batch: the batch's targets as negatives (:meth:`in_batch_source`), ``None``
                without in-batch negatives.

        Returns:
            As :meth:`score`.
        """
        return self.score(z, rows, hits, self.negatives_of(z, rows, batch, in_batch))

    def negatives_of(
        self,
        z: Tensor,
        rows: Tensor,
        batch: BatchProposal | None,
        in_batch: InBatchNegatives | InBatchDraws | None,
    ) -> BatchNegatives:
        """The negative sources of queries ``z`` ``[T, D]`` whose targets are ``rows`` ``[T]``
        (:meth:`estimate`): the sampler's draws (made here) and ``in_batch``."""
        sources: list[NegativeSource] = []
        positive_log_q = None
        if self.num_local_negatives:
            draw, positive_log_q = self._draw(z.detach(), rows)
            sources.append(DrawnNegatives(draw.ids, draw.log_q))
        if in_batch is not None:
            sources.append(in_batch)
        return BatchNegatives(batch, sources, positive_log_q)

    def score(
        self, z: Tensor, rows: Tensor, hits: Tensor, negatives: BatchNegatives
    ) -> tuple[Tensor, list[Tensor], Tensor | None]:
        """The one loop over the negative sources (:mod:`.negative_sources`): each source's
        candidates scored against ``z`` ``[T, D]`` and corrected by their log-size (``rows`` and
        ``hits`` ``[T]`` as in :meth:`estimate`; ``negatives`` of these rows).

        Returns:
            The positive's raw logit ``[T]``, each source's corrected columns ``[T, C_s]``, and
            the positive's log-size ``[T]`` where the convention corrects it (else ``None``).
        """
        batch = negatives.batch
        pos, columns = None, []
        for source in negatives.sources:
            if isinstance(source, PooledNegatives):
                columns.append(source.logsumexp[:, None])
                continue
            if isinstance(source, InBatchDraws) and source.group_size > 1:
                logits = self.candidate_logits(z, source.ids, source.group_size)
                log_size = self.group_log_size(source, z.shape[0], batch)
            else:
                if pos is None:
                    pos, logits = self.target_and_candidate_logits(z, rows, source.ids)
                else:
                    logits = self.candidate_logits(z, source.ids)
                log_size = self.log_size(source.ids, source.log_q, batch)
            columns.append(source.columns(logits, log_size, self.rules, hits))
        if pos is None:  # every source pooled or grouped
            pos = self.candidate_logits(z, rows[:, None])[:, 0]
        if not self.rules.corrects_positive:
            return pos, columns, None
        return pos, columns, self.log_size(rows, negatives.positive_log_q, batch)

    def group_log_size(
        self, draws: InBatchDraws, num_rows: int, batch: BatchProposal | None
    ) -> Tensor:
        """``[num_rows, K]`` :meth:`log_size` of grouped in-batch draws, computed once per group
        and repeated for its rows where their ``log q`` is the group's (a sampler that ignores
        the query, or none): the in-batch estimate ``q_b`` of ``[G, K]`` ids instead of
        ``[T, K]``."""
        if draws.log_q_per_group:
            return draws.per_row(self.log_size(draws.ids, draws.log_q, batch), num_rows)
        return self.log_size(draws.per_row(draws.ids, num_rows), draws.log_q, batch)

    def in_batch_source(
        self, z: Tensor, target: Tensor, mask: Tensor | None, batch: BatchProposal
    ) -> InBatchNegatives | InBatchDraws:
        """The batch's targets ``[T]`` (``mask`` as in :meth:`sampled_logits`; over a split
        table every rank's, global ids) as a negative source for queries ``z`` ``[T, D]``, under
        ``batch``'s design: every scored position's distinct target, found by
        ``in_batch_candidates`` (over a split table, always distinct, and those this rank
        holds: :func:`.stratified.held_candidates`), or under ``max_in_batch_draws`` each row's
        own draws (:meth:`in_batch_draws`)."""
        if batch.per_row:
            return self.in_batch_draws(z, target, mask, batch)
        method = "distinct" if self.is_split else self.in_batch_candidates
        candidates = batch_candidates(target, mask, method, self.num_classes)
        ids = candidates.ids
        if self.is_split:
            candidates = held_candidates(candidates, self.shard_map)
            ids = self.shard_map.local_or(candidates.ids)
        return InBatchNegatives(ids, candidates, self.sampler_log_q(z, ids))

    def in_batch_draws(
        self, z: Tensor, target: Tensor, mask: Tensor | None, batch: BatchProposal
    ) -> InBatchDraws:
        """The targets of ``max_in_batch_draws`` scored positions drawn for each group of
        ``in_batch_group_size`` rows from outside it
        (:func:`~lightning_sampled.ops.in_batch.drawn_per_group`), the same on every rank of a
        split table, where each rank keeps the classes it holds; none kept where ``batch``
        counts no draw (:meth:`batch_proposal`)."""
        generator = self.sampler.draw_generator(target.device, per_rank=False)
        limit, group_size, device = self.max_in_batch_draws, self.in_batch_group_size, target.device
        positions = drawn_per_group(target.numel(), limit, group_size, mask, generator, device)
        ids = target[positions]
        kept = batch.num_draws > 0 if isinstance(batch.num_draws, Tensor) else None
        if self.is_split:
            local = self.shard_map.local_or(ids)
            held = local >= 0
            ids, kept = local.clamp(min=0), held if kept is None else held & kept
        draws = InBatchDraws(ids, None, kept, group_size)
        if group_size > 1 and self.sampler.query_independent:  # one log q per group
            log_q = self.sampler_log_q(z, ids.reshape(-1))
            return draws._replace(log_q=None if log_q is None else log_q.view(ids.shape))
        return draws._replace(log_q=self.sampler_log_q(z, draws.per_row(ids, z.shape[0])))

    def sampler_log_q(self, z: Tensor, ids: Tensor) -> Tensor | None:
        """``log q`` of candidates ``ids`` (``[U]`` or ``[T, U]``) under the sampler for queries
        ``z`` ``[T, D]``, the mixture's first term; ``None`` where the head draws none."""
        if not self.num_local_negatives:
            return None
        with torch.no_grad():
            return self.sampler.log_prob(z.detach(), ids)

    def _draw(self, z: Tensor, target: Tensor) -> tuple[Sample, Tensor | None]:
        """The sampler's draws for queries ``z`` ``[T, D]`` and, when the positive is corrected,
        the targets' ``log q`` (``target``'s shape: ``[T]``, or ``[T, P]`` for several
        positives) from the same proposal."""
        m, shared = self.num_local_negatives, self.shared_negatives
        with torch.no_grad():
            if not self.rules.corrects_positive:
                return self.sampler.sample(z, m, shared=shared), None
            ids = target.view(target.shape[0], -1)
            draw, log_q = self.sampler.sample_and_score(z, m, ids, shared=shared)
        return draw, log_q.view(target.shape)

    def batch_proposal(self, target: Tensor, mask: Tensor | None = None) -> BatchProposal:
        """The in-batch proposal of a batch of targets ``[T]`` (over a split table, every
        rank's targets: ``q_b`` is kept for every class on every rank, alike) but those
        ``mask`` (bool ``[T]``) leaves out, counted into ``q_b`` in training mode. Before any
        training step (e.g. Lightning's validation sanity check) the estimate is the batch's
        own target frequencies."""
        scored = target.numel() if mask is None else mask.sum()
        if self.num_negatives == 0:
            # a mask (static shapes) may leave every position out: then nothing is scored
            enough = scored >= 2 if mask is None else scored != 1
            check_async(
                torch.as_tensor(enough),
                "in_batch_negatives with num_negatives=0 needs at least two scored positions "
                "(the others' targets are the negatives)",
            )
        frequency = self.target_frequency
        if self.training:  # counted now, so ready without reading it back (a host sync)
            frequency.update(target, mask)
        elif not frequency.ready:
            weights = None if mask is None else mask.double()
            counts = torch.bincount(target, weights=weights, minlength=self.num_classes)
            frequency = TargetFrequency(self.num_classes, counts=counts)
        counted = self.training and not frequency.fixed
        limit, group_size = self.max_in_batch_draws, self.in_batch_group_size
        if limit is not None and target.numel() > max(limit, group_size):
            # K draws for each row; none where a mask leaves the scored positions in one group
            # (static shapes), which then has none outside it
            enough = None if mask is None else groups_scored(mask, group_size) >= 2
            draws = limit if enough is None else enough.long() * limit
            return BatchProposal(frequency, draws, target, mask, counted, per_row=True)
        # no draw at all where no position is scored (static shapes: every one left out)
        draws = scored - 1 if mask is None else (scored - 1).clamp(min=0)
        return BatchProposal(frequency, draws, target, mask, counted)

    def log_size(self, ids: Tensor, log_q: Tensor | None, batch: BatchProposal | None) -> Tensor:
        """``log(M q(ids))``, or with in-batch negatives the mixture's
        ``log(M q + (T - 1) q_b)``, of candidate ids ``[M]``, ``[T, M]`` or ``[T]`` whose
        ``log q`` under the sampler is ``log_q`` (``None`` with no draws). Over a split table
        (:mod:`.stratified`) the ids are this rank's local rows, ``log_q`` is under its
        restricted proposal and ``M`` is its ``M_r``."""
        m = self.num_local_negatives if self.is_split else self.num_negatives
        if batch is None:
            return math.log(m) + log_q
        global_ids = self.shard_map.global_ids(ids) if self.is_split else ids
        log_q_batch = batch.log_prob(global_ids)
        return log_mixture_size(log_q, m, log_q_batch, batch.num_draws)

    @property
    def rules(self) -> Convention:
        """What :attr:`convention` corrects and masks (:mod:`lightning_sampled.ops.conventions`)."""
        return CONVENTIONS[self.convention]

    @property
    def in_batch_setting(self) -> bool | str:
        """``in_batch_negatives`` as given: ``"auto"``, ``True`` or ``False``."""
        return "auto" if self.in_batch_by_default else self.in_batch_negatives

    @property
    def refuses_batch_free_calls(self) -> bool:
        """Whether a call with ``negatives=`` or ``positives=`` (which cannot use the batch's
        targets) raises: with ``in_batch_negatives=True`` asked for explicitly."""
        return self.in_batch_negatives and not self.in_batch_by_default

    def sampled_losses(self, queries: Tensor, target: Tensor, mask: Tensor | None = None) -> Tensor:
        """Cross-entropy ``[T]`` of each positive among the corrected logits of
        :meth:`sampled_logits` (over a split table: :meth:`split_losses`); ``mask`` as
        there.

        The negatives are drawn and found once (:meth:`batch_negatives`), and the batch's
        targets, where every row shares them and their correction, pooled into one column
        (:meth:`pooled`); the rows are then scored a block at a time
        (:func:`~lightning_sampled.ops.chunked.positions_per_block`), each block under activation
        checkpointing when gradients are on (:meth:`in_blocks`), so that neither the ``[T, 1 +
        C]`` logits nor the ``[T, M, D]`` gathered vectors are ever held whole (at a language
        model's 4,088 positions, 100 draws per query and about 4,000 distinct targets they would
        be 66 MB and 418 MB, several times over): a block is scored again in backward. Every
        gather from the table adds into one gradient (:meth:`row_sink`). Under ``torch.compile``
        the rows are one block.
        """
        if self.is_split:
            return self.split_losses(queries, target)
        negatives = self.batch_negatives(queries, target, mask)
        with self.gathering_into(self._row_sink or self.row_sink()):
            negatives = self.pooled(queries, negatives)
            step = chunked.positions_per_block(
                negatives.num_columns, negatives.gathered_per_row, queries.shape[-1]
            )
            if queries.shape[0] <= step or torch.compiler.is_compiling():
                return self._block_losses(queries, target, mask, negatives)
            blocks = (
                (
                    queries[block],
                    target[block],
                    None if mask is None else mask[block],
                    negatives.rows(block),
                )
                for block in chunked.row_blocks(queries.shape[0], step, negatives.group_size)
            )
            return self.in_blocks(self._block_losses, blocks)

    def pooled(self, z: Tensor, negatives: BatchNegatives) -> BatchNegatives:
        """``negatives`` of queries ``z`` ``[T, D]`` with the batch's targets, where every row
        shares them and their correction (no ``max_in_batch_draws``, a proposal that does not
        depend on the query), reduced to one column (:class:`~.negative_sources.PooledNegatives`):
        the log-sum-exp of their corrected columns, by
        :func:`~lightning_sampled.ops.in_batch.in_batch_logsumexp` (the ``[T, U]`` logits never
        held, their gradient computed a chunk of candidates at a time). The loss is the same
        function of the same logits as with the ``[T, U]`` columns."""
        sources = []
        for source in negatives.sources:
            if isinstance(source, InBatchNegatives) and source.shared_by_rows:
                log_size = self.log_size(source.ids, source.log_q, negatives.batch)  # [U]
                rows, bias = self.class_rows(source.ids)
                remove = self.rules.removes_accidental_hits
                lse = in_batch_logsumexp(z, rows, bias, log_size, source.candidates, remove)
                source = PooledNegatives(lse)
            sources.append(source)
        return negatives._replace(sources=sources)

    def _block_losses(
        self, z: Tensor, target: Tensor, mask: Tensor | None, negatives: BatchNegatives
    ) -> Tensor:
        """:meth:`sampled_losses` ``[t]`` of a block of rows (:meth:`corrected_logits`)."""
        return softmax_losses(self.corrected_logits(z, target, mask, negatives))

    def _drawn_losses(self, queries: Tensor, target: Tensor, mask: Tensor) -> Tensor:
        """:meth:`sampled_losses` of the scored positions of :meth:`objective`: where it keeps
        the ignored ones for static shapes (one entry of ``mask`` per query), their stand-in
        targets are left out of the batch's candidates."""
        static = self.in_batch_negatives and mask.numel() == target.numel()
        return self.sampled_losses(queries, target, mask.reshape(-1) if static else None)

    def scores_positions_apart(self) -> bool:
        """As :meth:`ProposalHead.scores_positions_apart`, and not with ``in_batch_negatives``
        over a split table (its candidates are found by :meth:`split_losses`, which drops the
        ignored positions). On a whole table the in-batch candidates leave the ignored
        positions out by their mask (:meth:`_drawn_losses`)."""
        split_batch = self.in_batch_negatives and self.is_split
        return super().scores_positions_apart() and not split_batch

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, num_negatives={self.num_negatives}, "
            f"in_batch_negatives={self.in_batch_setting!r}, "
            + (
                f"in_batch_candidates={self.in_batch_candidates!r}, "
                if self.in_batch_negatives
                else ""
            )
            + (
                f"max_in_batch_draws={self.max_in_batch_draws}, "
                f"in_batch_group_size={self.in_batch_group_size}, "
                if self.max_in_batch_draws is not None
                else ""
            )
            + f"shared_negatives={self.shared_negatives}, convention={self.convention!r}"
            + (f", num_local_negatives={self.num_local_negatives}" if self.is_split else "")
        )


def _fresh_frequency_of_older_checkpoints(
    module: SampledSoftmaxHead, state_dict: dict[str, Any], prefix: str, *_: Any
) -> None:
    """A checkpoint of a head without in-batch negatives (saved before they became the
    default, or with ``in_batch_negatives=False``) loads into a default head with ``q_b``
    estimated afresh from the next training batches; a warning says so."""
    frequency = prefix + "target_frequency."
    if any(key.startswith(frequency) for key in state_dict):
        return
    if not any(key.startswith(prefix) for key in state_dict):
        return  # nothing of this head in the checkpoint: strict loading reports it
    warnings.warn(
        "loading a checkpoint without an in-batch frequency estimate (saved by a head without "
        "in_batch_negatives) into a head with in_batch_negatives='auto', the default: q_b is "
        "estimated afresh from the next training batches. Pass in_batch_negatives=False to "
        "train on as the checkpoint's head did",
        stacklevel=2,
    )
    for key, value in module.target_frequency.state_dict().items():
        state_dict[frequency + key] = value.clone()
