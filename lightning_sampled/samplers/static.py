"""Query-independent proposals: uniform, squashed unigram and log-uniform (Zipfian)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .base import Sample, Sampler, lookup, padding_to_rank, skip_padding


class _StaticSampler(Sampler):
    """A proposal that ignores the query: draws of shape ``[M]`` or ``[B, M]`` from one ``q``."""

    query_independent = True

    def _sample(
        self, z: Tensor, num_samples: int, shared: bool, generator: torch.Generator | None
    ) -> Sample:
        shape = (num_samples,) if shared else (z.shape[0], num_samples)
        ids = self._draw(shape, z.device, generator)
        return Sample(ids, self._log_q(ids))

    def _log_prob(self, z: Tensor, ids: Tensor) -> Tensor:
        return self._log_q(ids)

    def _mask_padding(self, ids: Tensor, log_q: Tensor) -> Tensor:
        if self.padding_idx is None:
            return log_q
        return log_q.masked_fill(ids == self.padding_idx, -math.inf)

    def _draw(
        self, shape: tuple[int, ...], device: torch.device, generator: torch.Generator | None
    ) -> Tensor:
        raise NotImplementedError

    def _log_q(self, ids: Tensor) -> Tensor:
        raise NotImplementedError


class UniformSampler(_StaticSampler):
    """``q(i) = 1 / N'`` over the ``N'`` classes other than ``padding_idx``.

    Args:
        num_classes: the number of classes ``N``.
        padding_idx: a class that is never drawn.
    """

    def _draw(self, shape, device, generator):
        ranks = torch.randint(self.num_drawable, shape, device=device, generator=generator)
        return skip_padding(ranks, self.padding_idx)

    def _log_q(self, ids: Tensor) -> Tensor:
        log_q = torch.full(ids.shape, -math.log(self.num_drawable), device=ids.device)
        return self._mask_padding(ids, log_q)


class LogUniformSampler(_StaticSampler):
    """Zipfian proposal over frequency-sorted ids (id 0 the most frequent).

    With ranks ``r`` in ``[0, N')`` over the classes other than ``padding_idx`` (in id order),
    ``q(r) = (log(r + 2) - log(r + 1)) / log(N' + 1)``, the distribution of TensorFlow's
    ``log_uniform_candidate_sampler``. Draws use the closed-form inverse CDF: O(1) memory.

    Args:
        num_classes: the number of classes ``N``; ids must be sorted by decreasing frequency.
        padding_idx: a class that is never drawn (the ranks skip it).
    """

    def _draw(self, shape, device, generator):
        u = torch.rand(shape, device=device, generator=generator, dtype=torch.float64)
        ranks = torch.floor(torch.exp(u * math.log(self.num_drawable + 1))).long() - 1
        ranks = ranks.clamp_(0, self.num_drawable - 1)
        return skip_padding(ranks, self.padding_idx)

    def _log_q(self, ids: Tensor) -> Tensor:
        r = padding_to_rank(ids, self.padding_idx).double()
        log_q = torch.log(torch.log1p(1.0 / (r + 1.0))) - math.log(math.log(self.num_drawable + 1))
        return self._mask_padding(ids, log_q.float())


class UnigramSampler(_StaticSampler):
    """The squashed empirical distribution of the TAPAS paper: ``q(i) ∝ max(f_i^alpha, floor)``.

    ``f_i = counts_i / sum(counts)`` is the empirical frequency; ``alpha`` in ``[0, 1]`` flattens it
    and ``floor > 0`` keeps classes never seen in training drawable. Draws invert a float64
    cumulative table through a guide table (Chen and Asau's indexed search): ``N`` equal buckets
    of ``[0, 1)`` each know the first class whose interval reaches them, so a draw reads the
    guide and walks forward about one class on average; ``O(1)`` expected time per draw
    whatever ``N`` is (a binary search would miss the cache about ``log2 N`` times in a row),
    ``O(N)`` memory.

    Args:
        counts: ``[N]`` non-negative class counts (or frequencies).
        alpha: the squash exponent, in ``[0, 1]``.
        floor: the lower bound ``beta`` on ``f^alpha``; default ``(1 / sum(counts))^alpha``,
            the squashed frequency of a class seen once.
        padding_idx: a class that is never drawn, whatever its count.
    """

    def __init__(
        self,
        counts: Tensor,
        alpha: float = 0.75,
        floor: float | None = None,
        *,
        padding_idx: int | None = None,
    ) -> None:
        counts = torch.as_tensor(counts)
        if counts.dim() != 1 or counts.numel() == 0:
            raise ValueError(
                f"counts must be a non-empty 1-D tensor, got shape {tuple(counts.shape)}"
            )
        counts = counts.double()
        if not bool(torch.isfinite(counts).all()) or bool((counts < 0).any()):
            bad = counts[~torch.isfinite(counts) | (counts < 0)][0].item()
            raise ValueError(f"counts must be finite and non-negative, got an entry {bad}")
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {alpha}")
        super().__init__(counts.numel(), padding_idx=padding_idx)
        total = float(counts.sum())
        if total <= 0:
            raise ValueError("counts must have a positive sum, got all zeros")
        if floor is None:
            floor = (1.0 / total) ** alpha
        if not (isinstance(floor, (int, float)) and math.isfinite(floor) and floor > 0):
            raise ValueError(f"floor must be a positive finite number, got {floor!r}")
        self.alpha = float(alpha)
        self.floor = float(floor)
        weights = torch.clamp((counts / total) ** alpha, min=floor)
        if padding_idx is not None:
            weights[padding_idx] = 0.0
        probs = weights / weights.sum()
        self.register_buffer("log_probs", probs.log().float(), persistent=True)
        cdf = torch.cumsum(probs, 0)
        self.register_buffer("cdf", cdf / cdf[-1], persistent=True)
        self.register_buffer("guide", guide_table(self.cdf), persistent=False)

    def _draw(self, shape, device, generator):
        u = torch.rand(shape, device=device, generator=generator, dtype=torch.float64)
        return invert_cdf(self.cdf, self.guide, u.reshape(-1)).reshape(shape)

    def _log_q(self, ids: Tensor) -> Tensor:
        return lookup(self.log_probs, ids)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, alpha={self.alpha}, floor={self.floor:.3g}"


_GUIDE_SLACK = 1.0 - 2.0**-40  # below the rounding of floor(u * N) to the next bucket


def guide_table(cdf: Tensor) -> Tensor:
    """For each of ``N`` equal buckets of ``[0, 1)``, a class at or before the first class whose
    cumulative probability exceeds the bucket's start (a hair below it, so that rounding in
    ``floor(u * N)`` never lands a draw before its bucket's guide).

    Args:
        cdf: ``[N]`` float64 non-decreasing cumulative probabilities, ``cdf[-1] == 1``.

    Returns:
        long ``[N]``, non-decreasing.
    """
    n = cdf.numel()
    starts = torch.arange(n, dtype=torch.float64, device=cdf.device) / n * _GUIDE_SLACK
    return torch.searchsorted(cdf, starts, right=True).clamp_(max=n - 1)


_WALK_STEPS = 4


def invert_cdf(cdf: Tensor, guide: Tensor, u: Tensor) -> Tensor:
    """``searchsorted(cdf, u, right=True)``: the first class ``i`` with ``cdf[i] > u``, found
    from the guide by a short forward walk; the rare draws still behind after a few steps (a
    bucket holding many tiny classes) finish with a binary search.

    Args:
        cdf: ``[N]`` float64 cumulative probabilities, ``cdf[-1] == 1``; zero-probability classes
            have empty intervals and are never returned.
        guide: long ``[N]`` from :func:`guide_table` of ``cdf``.
        u: ``[S]`` float64 uniforms in ``[0, 1)``.

    Returns:
        long ``[S]`` class ids.
    """
    n = cdf.numel()
    ids = lookup(guide, (u * n).long().clamp_(max=n - 1))
    for _ in range(_WALK_STEPS):
        behind = lookup(cdf, ids) <= u
        if not bool(behind.any()):
            return ids
        ids += behind
    behind = (lookup(cdf, ids) <= u).nonzero().squeeze(1)
    ids[behind] = torch.searchsorted(cdf, u[behind], right=True)
    return ids
