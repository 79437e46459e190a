"""Query-independent proposals: uniform, squashed unigram and log-uniform (Zipfian)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from .._class_ids import padding_to_rank, skip_padding
from .._random import rand, randint
from .._validation import check_class_ids
from .base import Sample, Sampler, lookup
from .distinct import distinct_draws, expected_count_log_q


class _StaticSampler(Sampler):
    """A proposal that ignores the query: draws of shape ``[M]`` or ``[B, M]`` from one ``q``,
    with replacement, or with ``unique`` ``M`` distinct classes per set (:mod:`.distinct`:
    drawn until ``M`` distinct came up, each then scored so that a head's ``log(M q)`` is its
    expected count ``log(1 - (1 - q)^tries)``, TensorFlow's approximation)."""

    query_independent = True

    def __init__(
        self, num_classes: int, *, padding_idx: int | None = None, unique: bool = False
    ) -> None:
        super().__init__(num_classes, padding_idx=padding_idx)
        if not isinstance(unique, bool):
            raise ValueError(f"unique must be a bool, got {unique!r}")
        self.unique = unique

    def _sample(
        self, z: Tensor, num_samples: int, shared: bool, generator: torch.Generator | None
    ) -> Sample:
        return self._sample_with_tries(z, num_samples, shared, generator)[0]

    def _sample_and_score(
        self,
        z: Tensor,
        num_samples: int,
        ids: Tensor,
        shared: bool,
        generator: torch.Generator | None,
    ) -> tuple[Sample, Tensor]:
        """The draw and ``log q`` of ``ids``; with ``unique``, scored with the draw's
        ``tries`` as its own classes are."""
        sample, tries = self._sample_with_tries(z, num_samples, shared, generator)
        log_q = self._log_q(ids)
        if tries is None:
            return sample, log_q
        return sample, expected_count_log_q(log_q, tries, num_samples)

    def _sample_with_tries(
        self, z: Tensor, num_samples: int, shared: bool, generator: torch.Generator | None
    ) -> tuple[Sample, Tensor | None]:
        """A draw and, with ``unique``, its ``tries`` (:func:`distinct_draws`; else ``None``)."""
        shape = _draw_shape(z, num_samples, shared)
        if not self.unique:
            return Sample(*self._draws(shape, z.device, generator)), None
        if num_samples > self.num_drawable:
            raise ValueError(
                f"unique=True cannot draw {num_samples} distinct classes out of "
                f"{self.num_drawable}; lower num_negatives"
            )
        ids, tries = distinct_draws(lambda s: self._draws(s, z.device, generator)[0], shape)
        return Sample(ids, expected_count_log_q(self._log_q(ids), tries, num_samples)), tries

    def _draws(
        self, shape: tuple[int, ...], device: torch.device, generator: torch.Generator | None
    ) -> tuple[Tensor, Tensor]:
        """Ids of ``shape`` drawn with replacement, and their ``log q``."""
        ids = self._draw(shape, device, generator)
        return ids, self._log_q(ids)

    def add_classes(self, num_new: int) -> None:
        """:meth:`Sampler.add_classes`: ``q`` over the grown support (ids are ranks for
        :class:`LogUniformSampler`: the new classes come last, the least frequent)."""
        self._grow_support(num_new)

    def extra_repr(self) -> str:
        return super().extra_repr() + (", unique=True" if self.unique else "")

    def _log_prob(self, z: Tensor, ids: Tensor) -> Tensor:
        return self._log_q(ids)

    def restricted(self, ids: Tensor) -> Sampler:
        """:meth:`Sampler.restricted`: a :class:`UnigramSampler` holding ``q(ids) / q(ids).sum()``
        (:class:`UniformSampler` restricts to a uniform one)."""
        check_class_ids("ids", ids, self.num_classes)
        log_q = self._log_q(ids).double()
        weights = torch.exp(log_q - log_q.max())
        smallest = float(weights[weights > 0].min() / weights.sum())
        # alpha 1 keeps the weights; a floor no larger than the smallest changes none
        return UnigramSampler(
            weights,
            alpha=1.0,
            floor=smallest,
            padding_idx=self.local_padding(ids),
            unique=self.unique,
        )

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
        unique: ``M`` distinct classes per draw (:class:`_StaticSampler`).
    """

    def restricted(self, ids: Tensor) -> Sampler:
        """:meth:`Sampler.restricted`: uniform over the classes ``ids``."""
        check_class_ids("ids", ids, self.num_classes)
        return UniformSampler(ids.numel(), padding_idx=self.local_padding(ids), unique=self.unique)

    def _draw(self, shape, device, generator):
        ranks = randint(self.num_drawable, shape, device, generator)
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
        unique: ``M`` distinct classes per draw (:class:`_StaticSampler`), as TensorFlow's
            ``log_uniform_candidate_sampler(unique=True)``.
    """

    def _draw(self, shape, device, generator):
        u = rand(shape, device, generator, torch.float64)
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
    and ``floor > 0`` keeps classes never seen in training drawable. Draws use Walker's alias
    method (:func:`alias_table`) with each cell's class, alias and both log-probabilities packed
    in one 32-byte row: a draw reads one row, so it costs ``O(1)`` and at most one cache miss
    whatever ``N`` is; ``O(N)`` memory (``36 N`` bytes with :attr:`log_probs`).

    The state dict holds :attr:`log_probs` only; the alias table is rebuilt from it on load.

    Args:
        counts: ``[N]`` non-negative class counts (or frequencies).
        alpha: the squash exponent, in ``[0, 1]``.
        floor: the lower bound ``beta`` on ``f^alpha``; default ``(1 / sum(counts))^alpha``,
            the squashed frequency of a class seen once.
        padding_idx: a class that is never drawn, whatever its count.
        unique: ``M`` distinct classes per draw (:class:`_StaticSampler`).
    """

    def __init__(
        self,
        counts: Tensor,
        alpha: float = 0.75,
        floor: float | None = None,
        *,
        padding_idx: int | None = None,
        unique: bool = False,
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
        super().__init__(counts.numel(), padding_idx=padding_idx, unique=unique)
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
        self.register_buffer("alias_rows", self._packed_alias_rows(), persistent=False)
        self.register_load_state_dict_pre_hook(_drop_legacy_cdf)
        self.register_load_state_dict_post_hook(_rebuild_alias_rows)

    def _packed_alias_rows(self) -> Tensor:
        """float64 ``[N, 4]``: per cell ``c``, its threshold, its alias, ``log q(c)`` and
        ``log q(alias)``, built from :attr:`log_probs` so that draws follow exactly the stored
        distribution."""
        log_probs = self.log_probs.double()
        threshold, alias = alias_table(log_probs.exp())
        return torch.stack([threshold, alias.double(), log_probs, log_probs[alias]], dim=1)

    def _draws(
        self, shape: tuple[int, ...], device: torch.device, generator: torch.Generator | None
    ) -> tuple[Tensor, Tensor]:
        """Alias draws: each id and its ``log q`` from one packed row."""
        u = rand((math.prod(shape),), device, generator, torch.float64)
        ids, log_q = alias_draw(self.alias_rows, u)
        return ids.view(shape), log_q.float().view(shape)

    def _log_q(self, ids: Tensor) -> Tensor:
        return lookup(self.log_probs, ids)

    def add_classes(self, num_new: int) -> None:
        """:meth:`Sampler.add_classes`: each new class, unseen in training, gets the smallest
        probability of a drawable class (that of the ``floor`` where some class sits on it),
        and all are renormalised; the old classes keep their ratios."""
        self._grow_support(num_new)
        drawable = torch.isfinite(self.log_probs)
        smallest = self.log_probs[drawable].min()
        log_probs = torch.cat([self.log_probs, smallest.expand(num_new)]).double()
        self.log_probs = (log_probs - torch.logsumexp(log_probs, 0)).float()
        self.alias_rows = self._packed_alias_rows()

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, alpha={self.alpha}, floor={self.floor:.3g}"


def _draw_shape(z: Tensor, num_samples: int, shared: bool) -> tuple[int, ...]:
    """``[M]`` draws shared by the batch, else ``[B, M]`` for the ``B`` queries of ``z``."""
    return (num_samples,) if shared else (z.shape[0], num_samples)


def _drop_legacy_cdf(module: UnigramSampler, state_dict: dict, prefix: str, *_: Any) -> None:
    # Checkpoints written before the alias table also hold the cumulative table it replaced.
    state_dict.pop(prefix + "cdf", None)


def _rebuild_alias_rows(module: UnigramSampler, incompatible_keys: Any) -> None:
    module.alias_rows = module._packed_alias_rows()


def alias_table(probs: Tensor) -> tuple[Tensor, Tensor]:
    """Walker's alias table of a distribution, built without a loop over the classes.

    Cell ``c`` of ``N`` equal cells keeps class ``c`` with probability ``threshold[c]`` and
    otherwise gives ``alias[c]``, so that class ``k`` is drawn with probability
    ``(threshold[k] + sum over cells c aliased to k of (1 - threshold[c])) / N = probs[k]``.

    The construction is the sweep of Hübschle-Schneider and Sanders ("Parallel weighted random
    sampling", 2019), written with prefix sums. With scaled weights ``s = N * probs``, the light
    classes (``s < 1``) in id order lack ``1 - s`` each, the heavy ones (``s >= 1``) in id order
    hold ``s - 1`` to spare. Light ``i`` takes its lack from the first heavy ``j`` whose
    cumulative spare ``H_j`` exceeds the lack ``D`` of the lights before ``i``; heavy ``j``, once
    the lights before cumulative lack ``H_j`` are served, keeps ``1 + H_j - D`` (``D`` the lack
    of the lights it and the heavies before it served) and takes the rest of its cell from heavy
    ``j + 1``. The last heavy keeps its whole cell.

    Args:
        probs: ``[N]`` non-negative probabilities, summing to 1 (renormalised here);
            zero-probability classes are never drawn.

    Returns:
        ``(threshold float64 [N], alias long [N])``.
    """
    n = probs.numel()
    probs = probs.double()
    scaled = probs * (n / probs.sum())
    light = scaled < 1.0
    if bool(light.all()):  # every class within rounding of 1 / N: each keeps its own cell
        return torch.ones_like(scaled), torch.arange(n, device=probs.device)
    lights, heavies = light.nonzero().squeeze(1), (~light).nonzero().squeeze(1)
    threshold = scaled.clamp(max=1.0)
    alias = torch.arange(n, device=probs.device)
    lack = 1.0 - scaled[lights]
    lack_through = torch.cumsum(lack, 0)
    lack_before = lack_through - lack
    spare = torch.cumsum(scaled[heavies] - 1.0, 0)
    server = torch.searchsorted(spare, lack_before, right=True).clamp_(max=heavies.numel() - 1)
    alias[lights] = heavies[server]
    served = torch.searchsorted(lack_before, spare)  # lights served by heavies 1..j
    lack_served = torch.cat([lack.new_zeros(1), lack_through])[served]
    threshold[heavies] = (1.0 + spare - lack_served).clamp_(0.0, 1.0)
    threshold[heavies[-1]] = 1.0
    alias[heavies[:-1]] = heavies[1:]
    return threshold, alias


def alias_draw(rows: Tensor, u: Tensor) -> tuple[Tensor, Tensor]:
    """Draws from an alias table, one uniform each: cell ``floor(u * N)``, and the fraction
    ``u * N - cell`` against the cell's threshold.

    Args:
        rows: float64 ``[N, 4]`` packed rows (threshold, alias, ``log q(cell)``,
            ``log q(alias)``), as :class:`UnigramSampler` holds them.
        u: float64 ``[S]`` uniforms in ``[0, 1)``.

    Returns:
        ``(ids long [S], log_q float64 [S])``.
    """
    n = rows.shape[0]
    scaled = u * n
    cell = scaled.long().clamp_(max=n - 1)
    row = rows.index_select(0, cell)
    keep = (scaled - cell) < row[:, 0]
    ids = torch.where(keep, cell, row[:, 1].long())
    return ids, torch.where(keep, row[:, 2], row[:, 3])
