"""``TapasHead``: two-pass approximate adaptive sampling for the softmax (Bai et al., 2017).

Algorithm 1 of the paper, per batch: a non-adaptive pass draws ``min(r n, N)`` distinct classes
``S'`` from a static proposal (the squashed unigram); an adaptive pass keeps the ``n`` classes of
``S'`` with the largest batch score ``sum_i exp(f_i(c) / tau)``. The batch then trains a sampled
softmax over the positive and these ``n`` shared negatives, deliberately *without* correcting for
the adaptive pass, so that training focuses on hard negatives (the paper targets the rank loss,
not the softmax loss). ``num_shards = m`` is Algorithm 2's approximation: classes are split at
random into ``m`` shards (parameter servers) and each contributes its own top ``n / m``.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, NamedTuple

import torch
from torch import Tensor

from .._class_ids import skip_padding
from .._deprecation import renamed_attribute, take_renamed, warn_renamed
from .._validation import check_finite_number, check_positive_int
from ..ops.conventions import CONVENTIONS, TAPAS_CONVENTIONS, Convention, convention_named
from ..ops.losses import softmax_losses
from ..samplers import Sampler
from .proposal import ProposalHead

# The first pass gives up (with an error) after this many draws per drawable class.
_MAX_DRAWS_PER_CLASS = 16


class FirstPass(NamedTuple):
    """The first pass ``S'`` and the numbers its inclusion probabilities need.

    ``S'`` is the first ``K`` distinct classes of a stream of i.i.d. draws from ``q``. Fix a class
    ``c`` and look only at the draws of the *other* classes: ``c`` is in ``S'`` iff one of its
    draws comes before the draw that brings the ``K``-th distinct other class, the ``m_c``-th
    draw of another class, which happens with probability ``pi_c = 1 - (1 - q_c)^m_c`` given those
    draws. ``m_c`` is observed either way: for ``c`` in ``S'`` the ``K``-th distinct other class is
    the ``(K + 1)``-th distinct class of the stream, so ``m_c`` counts the draws up to its first
    appearance less those of ``c``; for ``c`` outside ``S'`` it is the ``K``-th distinct class, and
    ``m_c`` counts the draws up to its first appearance. Then ``1{c in S'} / pi_c`` has
    expectation exactly 1 for every class (Horvitz-Thompson weights given the other draws).

    Attributes:
        ids: long ``[K]`` distinct classes, sorted.
        exposures: fp64 ``[K]``, ``m_c`` of each class of ``ids`` (``inf`` when ``ids`` is every
            drawable class).
        outside_exposure: ``m_c`` of every class outside ``ids`` (``inf`` likewise).
    """

    ids: Tensor
    exposures: Tensor
    outside_exposure: float

    def exposure(self, classes: Tensor) -> Tensor:
        """``m_c`` of any class ids ``[...]`` (in ``ids`` or not); fp64 ``[...]``."""
        pos = torch.searchsorted(self.ids, classes).clamp(max=self.ids.numel() - 1)
        inside = self.ids[pos] == classes
        return torch.where(inside, self.exposures[pos], self.outside_exposure)

    def log_inclusion(self, classes: Tensor, log_q: Tensor) -> Tensor:
        """``log pi_c = log(1 - (1 - q_c)^m_c)`` of class ids ``[...]`` with ``log q_c`` ``[...]``.

        Returns fp32 ``[...]``; ``0`` where ``m_c`` is ``inf`` (every class is in ``S'``).
        """
        m = self.exposure(classes)
        q = log_q.double().exp()
        log_pi = torch.log(-torch.expm1(m * torch.log1p(-q)))
        return torch.where(torch.isinf(m), 0.0, log_pi).float()


class TapasSelection(NamedTuple):
    """The two passes of one batch.

    Attributes:
        first_pass: the first pass ``S'``: ``K = min(r n, N')`` distinct classes and their
            inclusion probabilities (:class:`FirstPass`).
        scores: fp32 ``[K]``, the batch score ``log sum_i exp(f_i(c) / tau)`` of each class of
            ``first_pass.ids``.
        negatives: long ``[n]``, the second pass ``S`` (fewer than ``n`` only when a shard holds
            fewer than ``n / m`` candidates).
    """

    first_pass: FirstPass
    scores: Tensor
    negatives: Tensor

    @property
    def candidates(self) -> Tensor:
        """long ``[K]``, the first pass ``S'`` (``first_pass.ids``)."""
        return self.first_pass.ids


@torch.no_grad()
def draw_distinct(sampler: Sampler, z: Tensor, k: int) -> FirstPass:
    """``k`` distinct classes from a query-independent proposal, without replacement.

    Successive sampling: i.i.d. draws (in rounds of doubling size) until ``k + 1`` distinct
    classes are seen; the first ``k`` of them are sampling without replacement with probabilities
    proportional to ``q`` (what ``torch.multinomial(q, k, replacement=False)`` draws), at ``O(k)``
    expected cost instead of ``O(N)``, and the ``(k + 1)``-th gives their inclusion probabilities
    (:class:`FirstPass`). When ``k`` covers every drawable class they are all returned.

    Args:
        sampler: a query-independent proposal.
        z: ``[T, D]`` queries (only their device matters).
        k: how many classes, ``>= 1``.

    Returns:
        The :class:`FirstPass` of ``min(k, N')`` classes.

    Raises:
        RuntimeError: if ``k + 1`` distinct classes do not turn up within ``16 N'`` draws (a
            proposal far too skewed for the requested ``k``).
    """
    drawable = sampler.num_drawable
    if k >= drawable:
        ids = skip_padding(torch.arange(drawable, device=z.device), sampler.padding_idx)
        every = torch.full(ids.shape, math.inf, dtype=torch.float64, device=z.device)
        return FirstPass(ids, every, math.inf)
    draws = torch.empty(0, dtype=torch.long, device=z.device)
    size = k + 1
    while True:
        draws = torch.cat([draws, sampler.sample(z, size, shared=True).ids])
        uniq, inverse = torch.unique(draws, return_inverse=True)
        if uniq.numel() > k:
            return first_k_distinct(uniq, inverse, k)
        if draws.numel() >= _MAX_DRAWS_PER_CLASS * drawable:
            raise RuntimeError(
                f"the presampler gave only {uniq.numel()} distinct classes in {draws.numel()} "
                f"draws, fewer than the {k + 1} needed: lower presample_factor * num_negatives "
                f"or use a flatter presampler"
            )
        size = draws.numel()


def first_k_distinct(uniq: Tensor, inverse: Tensor, k: int) -> FirstPass:
    """The first ``k`` distinct classes of a stream of draws that holds more than ``k``.

    Args:
        uniq: long ``[U]``, the sorted distinct classes of the stream, ``U > k``.
        inverse: long ``[L]``, the stream as positions in ``uniq``.
        k: how many classes.
    """
    positions = torch.arange(inverse.numel(), device=inverse.device)
    first = torch.full_like(uniq, inverse.numel())
    first = first.scatter_reduce(0, inverse, positions, reduce="amin")
    kth, next_one = first.kthvalue(k).values, first.kthvalue(k + 1).values
    inside = first <= kth
    # Draws of each class before the (k + 1)-th distinct class turns up at draw next_one + 1.
    counts = torch.bincount(inverse[:next_one], minlength=uniq.numel())
    exposures = (next_one + 1 - counts[inside]).double()
    return FirstPass(uniq[inside], exposures, float(kth) + 1.0)


class TapasHead(ProposalHead):
    """Sampled softmax over ``n`` negatives chosen by TAPAS' two passes, shared by the batch.

    First pass: ``K = min(floor(r n), N')`` distinct classes ``S'`` from ``sampler`` (``N'`` =
    classes other than ``padding_idx``), drawn without replacement as the paper's subset
    ``S' c [V]`` of size ``min(r n, |V|)`` reads (see :func:`draw_distinct`). Second pass: the
    top ``n`` of ``S'`` by ``log sum_i exp(f_i(c) / tau)`` over the batch's scored queries ``i``
    (a log-sum-exp, so small ``tau`` does not overflow), computed in chunks of ``chunk_size``
    candidates so that memory is ``[T, chunk_size]``. ``f_i(c) = q_i . v_c + b_c`` is the model's
    logit (:meth:`~OutputHead.score_queries`; the paper's ``phi(x) . psi(y)`` with the default
    ``temperature``, ``normalize`` and ``bias``).

    Loss: cross-entropy of the positive among itself and the ``n`` negatives, as ``convention``
    says (:data:`~lightning_sampled.ops.conventions.TAPAS_CONVENTIONS`):

    - ``"uncorrected"`` (default, the paper's): no correction; negatives equal to a query's target
      get ``-inf`` for that query.
    - ``"exact_positive"``: the negatives are corrected by the log inclusion probability of the
      first pass, ``log(1 - (1 - q_c)^m_c)`` with ``m_c`` the draws of other classes that decide
      whether ``c`` is in (:class:`FirstPass`: exact Horvitz-Thompson weights, so
      ``sum_{c in S'} exp(f(c)) / pi_c`` estimates the normaliser without bias); the positive
      stays uncorrected and accidental hits are removed, the library's consistent convention
      (:mod:`~lightning_sampled.heads.sampled`).
    - ``"corrected_all"``: the positive is corrected too and accidental hits are kept.
    - ``"uncorrected_with_hits"``: no correction, accidental hits kept.

    The adaptive pass is never corrected. With ``r = 1`` the second pass keeps all of ``S'`` and
    the head is a sampled softmax with ``n`` shared negatives drawn without replacement.

    Args:
        num_classes: ``N``.
        dim: ``D``.
        sampler: the first pass' proposal, query-independent, e.g.
            ``UnigramSampler(counts, alpha=0.75)``, the paper's squashed unigram; uniform when
            ``None``. Uncorrected, a skewed proposal pushes the likely classes down as negatives,
            and an ``S'`` far above the paper's 1% to 10% of the classes makes the second pass
            the top ``n`` of nearly everything: together they cost more than half the NDCG@10 of
            uniform negatives on MovieLens-100k (``recipes/results/tapas_ml-100k.md``).
        num_negatives: ``n``, negatives per batch, ``<= N'``.
        presample_factor: ``r >= 1``; the first pass draws ``min(floor(r n), N')`` classes.
        selection_temperature: ``tau > 0`` of the second pass (``None``: 1), settable during
            training (the paper lowers it: ``TemperatureSchedule(attribute=
            "selection_temperature")``).
        num_shards: ``m``, Algorithm 2's number of shards; must divide ``n`` (hence ``m <= N'``).
            Classes are assigned to shards by a random balanced partition made at construction
            (a buffer, saved in checkpoints); each shard contributes its top ``n / m`` candidates
            (all of them if it holds fewer).
        convention: one of :data:`~lightning_sampled.ops.conventions.TAPAS_CONVENTIONS` (above).
        **options: ``sparse_grad`` of :class:`ProposalHead`; ``weight``, ``bias``,
            ``padding_idx``, ``ignore_index``, ``chunk_size`` (which also chunks the second
            pass), ``temperature`` (of the logits, as on every head), ``normalize`` and
            ``label_smoothing`` (0 only) of :class:`OutputHead`. Old names, with a
            ``FutureWarning``: ``presampler`` (``sampler``), ``logit_temperature``
            (``temperature``), ``logq_correction`` / ``remove_accidental_hits``
            (``convention``); and ``temperature`` meant ``tau`` before it meant the logits'
            temperature: a ``temperature`` other than 1 without ``selection_temperature`` warns.
    """

    sharding_refusal = "its second pass ranks the first pass's candidates across the whole table"

    schedulable = ("temperature", "selection_temperature")
    positions_apart = False  # the second pass ranks candidates by the whole batch's queries

    def __init__(
        self,
        num_classes: int,
        dim: int,
        sampler: Sampler | None = None,
        num_negatives: int = 100,
        *,
        presample_factor: float = 8,
        selection_temperature: float | None = None,
        num_shards: int = 1,
        convention: str = "uncorrected",
        **options: Any,
    ) -> None:
        sampler = take_renamed(options, "presampler", "sampler", sampler, owner="TapasHead")
        selection_temperature = _old_temperatures(options, selection_temperature)
        convention = _old_corrections(options, convention)
        super().__init__(num_classes, dim, sampler, **options)
        self.require_query_independent("TapasHead (the first pass is shared by the batch)")
        drawable = self.sampler.num_drawable
        self.num_negatives = check_positive_int("num_negatives", num_negatives)
        if num_negatives > drawable:
            raise ValueError(
                f"num_negatives must be <= {drawable} (the drawable classes), got {num_negatives}"
            )
        self.presample_factor = check_finite_number(
            "presample_factor", presample_factor, minimum=1.0, strict=False
        )
        self.num_candidates = min(math.floor(presample_factor * num_negatives), drawable)
        self.selection_temperature = selection_temperature
        self.num_shards = check_positive_int("num_shards", num_shards)
        if num_negatives % num_shards:  # then also num_shards <= num_negatives <= drawable
            raise ValueError(
                f"num_shards must divide num_negatives={num_negatives} (each shard contributes "
                f"num_negatives / num_shards), got {num_shards}"
            )
        if num_shards > 1:
            shard_of = torch.empty(num_classes, dtype=torch.int32)
            shard_of[torch.randperm(num_classes)] = (
                torch.arange(num_classes, dtype=torch.int32) % num_shards
            )
        else:
            shard_of = None
        self.register_buffer("shard_of", shard_of, persistent=True)
        convention_named(convention, TAPAS_CONVENTIONS)
        #: the convention's name; :attr:`rules` is what it corrects and masks
        self.convention = convention

    presampler = renamed_attribute("presampler", "sampler")

    @property
    def rules(self) -> Convention:
        """What :attr:`convention` corrects and masks
        (:mod:`lightning_sampled.ops.conventions`): the negatives' correction is their log
        inclusion probability in the first pass."""
        return CONVENTIONS[self.convention]

    @property
    def selection_temperature(self) -> float:
        """``tau``, the second pass' temperature; must stay positive and finite."""
        return self._selection_temperature

    @selection_temperature.setter
    def selection_temperature(self, value: float) -> None:
        self._selection_temperature = check_finite_number(
            "selection_temperature", value, minimum=0.0, strict=True
        )

    @torch.no_grad()
    def batch_scores(self, z: Tensor, candidates: Tensor) -> Tensor:
        """``log sum_i exp(f_i(c) / tau)`` over the queries ``z`` ``[T, D]`` of each candidate.

        Args:
            z: ``[T, D]`` queries.
            candidates: long ``[K]`` class ids.

        Returns:
            fp32 ``[K]``; computed ``chunk_size`` candidates at a time.
        """
        parts = [
            torch.logsumexp(self.candidate_logits(z, chunk) / self._selection_temperature, dim=0)
            for chunk in candidates.split(self.chunk_for(z.shape[0]))
        ]
        return torch.cat(parts)

    @torch.no_grad()
    def select_negatives(self, z: Tensor) -> TapasSelection:
        """Runs both passes for the batch of scored queries ``z`` ``[T, D]``."""
        first_pass = draw_distinct(self.sampler, z, self.num_candidates)
        candidates = first_pass.ids
        scores = self.batch_scores(z, candidates)
        n = self.num_negatives
        if self.num_shards == 1:
            negatives = candidates[scores.topk(min(n, scores.numel())).indices]
            return TapasSelection(first_pass, scores, negatives)
        # Sort by score, then stably by shard: each shard's candidates in decreasing score.
        order = scores.argsort(descending=True)
        shard = self.shard_of[candidates[order]].long()
        by_shard = shard.argsort(stable=True)
        order, shard = order[by_shard], shard[by_shard]
        counts = torch.bincount(shard, minlength=self.num_shards)
        rank_in_shard = (
            torch.arange(order.numel(), device=z.device) - (counts.cumsum(0) - counts)[shard]
        )
        negatives = candidates[order[rank_in_shard < n // self.num_shards]]
        return TapasSelection(first_pass, scores, negatives)

    def sampled_losses(self, queries: Tensor, target: Tensor) -> Tensor:
        """Cross-entropy ``[T]`` of each positive among the logits of :meth:`sampled_logits`."""
        return softmax_losses(self.sampled_logits(queries, target))

    def sampled_logits(self, z: Tensor, target: Tensor) -> Tensor:
        """Logits ``[T, 1 + n]`` of the scored positions: column 0 is the positive.

        Args:
            z: ``[T, D]`` valid queries.
            target: long ``[T]`` their targets.
        """
        selection = self.select_negatives(z.detach())
        ids = selection.negatives
        pos, neg = self.target_and_candidate_logits(z, target, ids)
        rules = self.rules
        neg = rules.negatives(neg, ids, self._log_inclusion(selection, z, ids), target)
        if rules.corrects_positive:
            pos = rules.positive(pos, self._log_inclusion(selection, z, target[:, None])[:, 0])
        return torch.cat([pos[:, None], neg], dim=1)

    def _log_inclusion(self, selection: TapasSelection, z: Tensor, ids: Tensor) -> Tensor:
        """The first pass' log inclusion probability of class ids ``[C]`` or ``[T, 1]``
        (queries ``z`` ``[T, D]``), or ``0`` where the convention corrects nothing."""
        if not self.rules.corrects_negatives:
            return ids.new_zeros((), dtype=torch.float32)
        with torch.no_grad():
            log_q = self.sampler.log_prob(z.detach(), ids)
            return selection.first_pass.log_inclusion(ids, log_q)

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, presample_factor={self.presample_factor}, "
            f"selection_temperature={self._selection_temperature:.4g}, "
            f"num_shards={self.num_shards}, convention={self.convention!r}"
        )


def _old_temperatures(options: dict[str, Any], selection_temperature: float | None) -> float:
    """``tau`` from TapasHead's arguments, taking the old names out of ``options``: before the
    rename, ``temperature`` was ``tau`` and ``logit_temperature`` the logits' temperature."""
    if "logit_temperature" in options:  # an old-style call: its temperature is tau
        logit_temperature = options.pop("logit_temperature")
        warn_renamed("TapasHead(logit_temperature=...)", "temperature=...")
        if "temperature" in options:
            if selection_temperature is not None:
                raise ValueError(
                    "TapasHead got logit_temperature=, temperature= and selection_temperature=: "
                    "with the old logit_temperature, temperature is the old name of "
                    "selection_temperature"
                )
            warn_renamed(
                "TapasHead(temperature=tau, logit_temperature=...)", "selection_temperature=tau"
            )
            selection_temperature = options.pop("temperature")
        options["temperature"] = logit_temperature
    elif selection_temperature is None and options.get("temperature", 1.0) != 1.0:
        warnings.warn(
            "TapasHead(temperature=...) is now the temperature of the logits, as on every head; "
            "the second pass' tau is selection_temperature=... (pass both to silence this)",
            FutureWarning,
            stacklevel=3,
        )
    return 1.0 if selection_temperature is None else selection_temperature


def _old_corrections(options: dict[str, Any], convention: str) -> str:
    """``convention`` from TapasHead's arguments, taking the old switches ``logq_correction``
    and ``remove_accidental_hits`` out of ``options`` (with a ``FutureWarning``)."""
    old = [name for name in ("logq_correction", "remove_accidental_hits") if name in options]
    if not old:
        return convention
    switches = (
        bool(options.pop("logq_correction", False)),
        bool(options.pop("remove_accidental_hits", True)),
    )
    name = next(
        name
        for name in TAPAS_CONVENTIONS
        if (CONVENTIONS[name].corrects_negatives, CONVENTIONS[name].removes_accidental_hits)
        == switches
    )
    warn_renamed(f"TapasHead({'=..., '.join(old)}=...)", f"convention={name!r}")
    return name
