"""``MixtureSampler``: a fixed share of the draws from each of several proposals.

Why: an adaptive proposal (MIDX) built from a freshly initialised class table is close to
uniform, and with a Zipfian target distribution (words, popular items) the frequent classes are
then almost never drawn as negatives while they are pushed up as positives at every step, so their
scores run away early in training. Mixing in a frequency prior (``LogUniformSampler`` over
frequency-sorted ids, or ``UnigramSampler``) keeps them drawn from the first step, while the
adaptive share supplies the hard negatives once the index is informative.

Draws are stratified, as in multiple importance sampling: of ``M`` draws, component ``c`` makes
``m_c`` (``round(w_c M)``, the remainder going to the largest weights), and every draw reports the
mixture's probability ``q(i | z) = sum_c (m_c / M) q_c(i | z)``. The expected number of draws of
class ``i`` is then exactly ``M q(i | z)``, so the ``o_i - log(M q_i)`` correction of a sampled head
stays unbiased and its estimator consistent, with lower variance than drawing the component at
random for each draw.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .base import Sample, Sampler


class MixtureSampler(Sampler):
    """Stratified mixture of proposals over the same classes.

    Args:
        components: two or more samplers with equal ``num_classes`` and ``padding_idx``.
        weights: the share of the draws of each component (positive; normalised); equal shares
            when ``None``. :meth:`log_prob` scores ids under these weights; the draws of a call
            with ``M`` samples report the shares ``m_c / M`` they were made with, which equal the
            weights whenever every ``w_c M`` is an integer.
    """

    def __init__(self, components: Sequence[Sampler], weights: Sequence[float] | None = None):
        components = list(components)
        if len(components) < 2 or not all(isinstance(c, Sampler) for c in components):
            raise ValueError(
                f"components must be two or more Samplers, got "
                f"{[type(c).__name__ for c in components]}"
            )
        first = components[0]
        for c in components[1:]:
            if (c.num_classes, c.padding_idx) != (first.num_classes, first.padding_idx):
                raise ValueError(
                    f"components must share num_classes and padding_idx: "
                    f"{type(first).__name__} has ({first.num_classes}, {first.padding_idx}), "
                    f"{type(c).__name__} has ({c.num_classes}, {c.padding_idx})"
                )
        if any(getattr(c, "unique", False) for c in components):
            raise ValueError(
                "a mixture scores every draw by the mixture's probability of one draw; its "
                "components must draw with replacement (unique=False)"
            )
        weights = [1.0] * len(components) if weights is None else [float(w) for w in weights]
        if len(weights) != len(components) or not all(math.isfinite(w) and w > 0 for w in weights):
            raise ValueError(
                f"weights must be {len(components)} positive finite numbers, got {weights}"
            )
        super().__init__(first.num_classes, padding_idx=first.padding_idx)
        self.components = nn.ModuleList(components)
        total = sum(weights)
        self.weights = [w / total for w in weights]
        self.query_independent = all(c.query_independent for c in components)

    def draws_per_component(self, num_samples: int) -> list[int]:
        """``m_c``: ``floor(w_c M)``, the remainder to the largest fractional parts (then the
        earlier components); they sum to ``M``."""
        exact = [w * num_samples for w in self.weights]
        counts = [math.floor(x) for x in exact]
        order = sorted(range(len(exact)), key=lambda c: (counts[c] - exact[c], c))
        for c in order[: num_samples - sum(counts)]:
            counts[c] += 1
        return counts

    def refresh(self, class_embeddings: Tensor) -> None:
        for c in self.components:
            c.refresh(class_embeddings)

    def check_class_rows(self, rows: Tensor) -> None:
        for c in self.components:
            c.check_class_rows(rows)

    def auxiliary_loss(self, z: Tensor, class_embeddings: Tensor) -> Tensor:
        return sum(c.auxiliary_loss(z, class_embeddings) for c in self.components)

    def _sample(
        self, z: Tensor, num_samples: int, shared: bool, generator: torch.Generator | None
    ) -> Sample:
        ids = [
            c.sample(z, m, shared=shared, generator=generator).ids
            for c, m in zip(self.components, self.draws_per_component(num_samples), strict=True)
            if m > 0
        ]
        ids = torch.cat(ids, dim=-1)
        return Sample(ids, self._mixture_log_prob(z, ids, self.draws_per_component(num_samples)))

    def _log_prob(self, z: Tensor, ids: Tensor) -> Tensor:
        return self._mixture_log_prob(z, ids, self.weights)

    def _mixture_log_prob(self, z: Tensor, ids: Tensor, shares: Sequence[float]) -> Tensor:
        """``log sum_c s_c q_c(ids | z)`` with shares ``s_c`` (normalised here)."""
        total = float(sum(shares))
        parts = [
            c.log_prob(z, ids).float() + math.log(s / total)
            for c, s in zip(self.components, shares, strict=True)
            if s > 0
        ]
        return torch.logsumexp(torch.stack(torch.broadcast_tensors(*parts)), dim=0)

    def add_classes(self, num_new: int) -> None:
        """:meth:`Sampler.add_classes` of every component."""
        for component in self.components:
            component.add_classes(num_new)
        self._grow_support(num_new)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, weights={[round(w, 4) for w in self.weights]}"
