"""``SampledSoftmaxHead``: softmax over the positive and ``M`` sampled negatives, logQ-corrected.

The estimator conventions (:data:`CONVENTIONS`) differ in what they correct and mask:

- ``"exact_positive"`` (the default; the MIDX paper's Eq. 1): the positive's logit ``o_y`` is left
  uncorrected, each negative becomes ``o_j - log(M q_j)``, and negatives equal to the target
  (accidental hits) get ``-inf``. Then ``sum_j exp(o_j - log(M q_j))`` over the draws is an unbiased
  estimate of ``Z - exp(o_y)`` and the positive contributes its exact share, so the estimated
  normaliser is unbiased and the gradient tends to the full-softmax gradient as ``M`` grows,
  whatever ``p_y``. The target's share is computed, not estimated, and the positive's proposal
  probability is never needed (one sampler call fewer per step).
- ``"corrected_all"``: every logit, the positive's included, becomes ``o_i - log(M q_i)`` and
  accidental hits are kept, so the draws estimate all of ``Z`` (the target's share included) and
  the positive's corrected term adds an ``O(1 / M)`` bias. Consistent too.
- ``"tensorflow"``: every logit corrected *and* accidental hits masked, the defaults of
  TensorFlow's ``sampled_softmax_loss``. The estimated normaliser lacks the target's share
  ``p_y``, so the gradient stays biased however large ``M`` is once a target is likely (on four
  classes with targets ``(.6, .25, .1, .05)`` the first class is learned as ``.996``). Offered to
  reproduce TensorFlow; harmless only when every ``p_y`` is small.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .._validation import check_positive_int
from ..samplers import Sampler, UniformSampler
from .base import OutputHead, weighted_mean
from .chunked import scored_rows

CONVENTIONS = ("exact_positive", "corrected_all", "tensorflow")


class SampledSoftmaxHead(OutputHead):
    """Sampled softmax, consistent at any target probability by default.

    For each query, ``M`` negatives are drawn from the sampler with replacement, the logits are
    corrected as ``convention`` says (module docstring), and the loss is the cross-entropy of the
    positive among the ``1 + M`` logits. By default (``"exact_positive"``, the MIDX paper's Eq. 1)
    the positive is uncorrected, each negative becomes ``o_j - log(M q_j)`` and accidental hits get
    ``-inf``: the gradient tends to the full-softmax gradient as ``M`` grows, also for likely
    targets. The sampler's :meth:`~Sampler.auxiliary_loss` (non-zero only for samplers that learn,
    such as MIDX-Learn) is added to the returned loss, unweighted.

    What the sampler sees: its ``sample`` and ``log_prob`` get the scored queries
    ``normalize(z) / temperature`` (:meth:`~OutputHead.score_queries`, detached), and
    :meth:`refresh_index` gives its ``refresh`` the class vectors the head scores (unit rows when
    ``normalize=True``, else ``weight``), both without the bias. A query-dependent proposal such as
    MIDX thus approximates ``softmax(q . v)``, the head's softmax without its bias, at any
    temperature and with cosine logits.

    Per-position weights: ``forward(z, target, sample_weight)`` is ``sum(w * loss) / sum(w)`` of
    the per-position sampled losses (see :class:`OutputHead`). Label smoothing is refused
    (``ValueError``): the sampled objective has no term for the uniform share over all classes.

    Args:
        num_classes: ``N``.
        dim: ``D``.
        sampler: the proposal; a :class:`UniformSampler` over the head's classes when ``None``.
            Its ``num_classes`` and ``padding_idx`` must match the head's.
        num_negatives: ``M``, draws per query (or per batch when shared).
        shared_negatives: one set of ``M`` negatives for the whole batch (TensorFlow style: one
            ``[M, D]`` gather) instead of ``M`` per query (the MIDX paper's style, ``[T, M, D]``).
            Needs a query-independent sampler.
        convention: ``"exact_positive"`` (default), ``"corrected_all"`` (both consistent) or
            ``"tensorflow"`` (TensorFlow's defaults, biased when a target is likely).
        sparse_grad: make the class table's gradient row-sparse (a sparse COO tensor over the
            ``T + M`` gathered rows), so that a step costs what the touched rows cost instead of
            allocating and filling a dense ``[N, D]`` gradient. Needs an optimizer that takes
            sparse gradients (``torch.optim.SGD``, ``SparseAdam``, ``Adagrad``). The exact
            methods (``full_loss``, ...) still give dense gradients.
        **kwargs: ``weight``, ``bias``, ``padding_idx``, ``ignore_index``, ``chunk_size``,
            ``temperature``, ``normalize``, ``label_smoothing`` (0 only) of :class:`OutputHead`.
            ``normalize=True`` refuses a sampler with parameters (MIDX-Learn): its auxiliary loss
            trains codewords on the raw class table.
    """

    def __init__(
        self,
        num_classes: int,
        dim: int,
        sampler: Sampler | None = None,
        num_negatives: int = 100,
        *,
        shared_negatives: bool = False,
        convention: str = "exact_positive",
        sparse_grad: bool = False,
        weight: nn.Parameter | None = None,
        bias: bool | nn.Parameter = False,
        padding_idx: int | None = None,
        ignore_index: int = -100,
        chunk_size: int | None = None,
        temperature: float = 1.0,
        normalize: bool = False,
        label_smoothing: float = 0.0,
    ) -> None:
        super().__init__(
            num_classes,
            dim,
            weight=weight,
            bias=bias,
            padding_idx=padding_idx,
            ignore_index=ignore_index,
            chunk_size=chunk_size,
            temperature=temperature,
            normalize=normalize,
            label_smoothing=label_smoothing,
        )
        if sampler is None:
            sampler = UniformSampler(num_classes, padding_idx=padding_idx)
        if not isinstance(sampler, Sampler):
            raise ValueError(f"sampler must be a Sampler, got {type(sampler).__name__}")
        if sampler.num_classes != num_classes:
            raise ValueError(
                f"sampler.num_classes={sampler.num_classes} does not match "
                f"num_classes={num_classes}"
            )
        if sampler.padding_idx != self.padding_idx:
            raise ValueError(
                f"sampler.padding_idx={sampler.padding_idx} does not match "
                f"padding_idx={self.padding_idx}"
            )
        if shared_negatives and not sampler.query_independent:
            raise ValueError(
                f"shared_negatives=True needs a query-independent sampler, "
                f"got {type(sampler).__name__}"
            )
        if normalize and any(True for _ in sampler.parameters()):
            raise ValueError(
                f"normalize=True cannot train {type(sampler).__name__}'s parameters: its "
                f"auxiliary loss reads the raw class table, not the unit rows the head scores; "
                f"use a sampler without parameters (e.g. MIDXSampler with learnable=False)"
            )
        self.sampler = sampler
        self.num_negatives = check_positive_int("num_negatives", num_negatives)
        self.shared_negatives = bool(shared_negatives)
        if convention not in CONVENTIONS:
            raise ValueError(f"convention must be one of {CONVENTIONS}, got {convention!r}")
        self.convention = convention
        self.sparse_grad = bool(sparse_grad)

    def refresh_index(self) -> None:
        """Rebuilds the sampler's index from the class vectors the head scores: the unit rows of
        the class table when ``normalize``, else the table itself (no-op for static samplers)."""
        self.sampler.refresh(scored_rows(self.weight.detach(), self.normalize))

    def sampled_logits(self, z: Tensor, target: Tensor) -> Tensor:
        """Corrected logits ``[T, 1 + M]`` of the scored positions: column 0 is the positive.

        Args:
            z: ``[T, D]`` scored queries of the valid positions (:meth:`_valid_rows`); the
                sampler sees them detached.
            target: long ``[T]`` their targets.
        """
        m = self.num_negatives
        with torch.no_grad():
            if self.corrects_positive:
                draw, pos_log_q = self.sampler.sample_and_score(
                    z.detach(), m, target[:, None], shared=self.shared_negatives
                )
                pos_log_q = pos_log_q[:, 0]
            else:
                draw = self.sampler.sample(z.detach(), m, shared=self.shared_negatives)
        pos, neg = self.target_and_candidate_logits(z, target, draw.ids)
        log_m = math.log(m)
        neg = neg - (log_m + draw.log_q)
        if self.corrects_positive:
            pos = pos - (log_m + pos_log_q)
        if self.removes_accidental_hits:
            neg = neg.masked_fill(draw.ids.expand_as(neg) == target[:, None], -math.inf)
        return torch.cat([pos[:, None], neg], dim=1)

    @property
    def corrects_positive(self) -> bool:
        """Whether the positive's logit is logQ-corrected (all but ``"exact_positive"``)."""
        return self.convention != "exact_positive"

    @property
    def removes_accidental_hits(self) -> bool:
        """Whether negatives equal to the target get ``-inf`` (all but ``"corrected_all"``)."""
        return self.convention != "corrected_all"

    def forward(self, z: Tensor, target: Tensor, sample_weight: Tensor | None = None) -> Tensor:
        """Mean sampled-softmax loss of ``target`` ``[...]`` given ``z`` ``[..., D]``, weighted by
        ``sample_weight`` ``[...]`` when given; a scalar."""
        queries, y, mask = self._valid_rows(z, target)
        weights = self._valid_weights(sample_weight, target, mask)
        if y.numel() == 0:
            return z.sum() * 0.0
        logits = self.sampled_logits(queries, y)
        loss = weighted_mean(torch.logsumexp(logits, dim=1) - logits[:, 0], weights)
        return loss + self.sampler.auxiliary_loss(queries, self.weight)

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, num_negatives={self.num_negatives}, "
            f"shared_negatives={self.shared_negatives}, "
            f"convention={self.convention!r}, sparse_grad={self.sparse_grad}"
        )
