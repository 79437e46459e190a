"""AdaptiveSoftmax: bandit top-k softmax of ``A x`` with ``(eps, delta)`` guarantees.

Baharav et al., "Adaptive Sampling for Efficient Softmax Approximation" (NeurIPS 2024), in the form
the paper ran (Algorithm 4 with Appendices A.3 and C), vectorised over a batch of queries:

1. importance weights and a Gumbel order of the coordinates per query (Algorithms 5-7);
2. a warm-up: every arm pulled (16 coordinates, then x1.5) until its variance estimate is at most
   ``1 / (17 beta^2 log(6 n / delta_Z))``, the ``T_0`` phase of Algorithm 2;
3. successive elimination (Algorithm 3 on the empirical variances), extended to top-``k``;
4. the exact logits of the ``k`` identified arms, reusing their pulls (Appendix C.2);
5. NormalizationEstimation (Algorithm 2) to ``eps / 2`` and ``delta / 2`` on the empirical
   variances, reusing all earlier pulls (Appendix C.1).

Not in the paper: after the warm-up's first level a query whose estimates predict too little
gain (a flat softmax, whose normalisation needs nearly every entry of ``A``) is finished with the
dense product instead, exactly (:attr:`AdaptiveSoftmax.fallback_gain`).

Here ``beta = 1 / temperature`` is the paper's inverse temperature and ``delta_Z = delta / 2``.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from .._validation import check_finite, check_padding_idx, check_positive_int
from .adaptive_reference import adaptive_success, exact_topk_softmax
from .arm_estimates import ArmEstimates
from .calibration import CalibrationResult, smallest_passing_factor
from .importance_sampling import pull_schedule


class AdaptiveResult(NamedTuple):
    """The output of :meth:`AdaptiveSoftmax.topk`.

    Shapes are for a ``[B, d]`` batch; a single ``[d]`` query drops the leading ``B``.

    Attributes:
        indices: long ``[B, k]`` classes in decreasing logit order.
        probs: fp32 ``[B, k]`` their estimated softmax probabilities.
        log_partition: fp32 ``[B]`` the estimated ``log sum_i exp(logit_i / temperature)``.
        samples_used: long ``[B]`` the scalar products ``A_ij x_j`` computed; the gain over the
            dense computation is ``n * d / samples_used``.
    """

    indices: Tensor
    probs: Tensor
    log_partition: Tensor
    samples_used: Tensor


class StageBudgets(NamedTuple):
    """How ``(eps, delta)`` is split between the stages of Algorithm 4 (Appendix C).

    Attributes:
        bandit_delta: failure probability of best-arm identification (line 8), ``delta / 2``.
        norm_eps: multiplicative accuracy of NormalizationEstimation (line 10), ``eps / 2``:
            the top arms' logits are exact (C.2), so ``Z`` to ``1 +- eps / 2`` puts each
            probability within ``1 +- eps``.
        norm_delta: its failure probability ``delta_Z``, ``delta / 2``; it also sets the warm-up
            target (Algorithm 2's ``T_0`` phase).
    """

    bandit_delta: float
    norm_eps: float
    norm_delta: float


#: the predicted gain below which a query is finished with the dense product
#: (``benchmarks/adaptive_softmax_wallclock.py`` measures the sampled path's cost per entry)
DEFAULT_FALLBACK_GAIN = 8.0
#: the coordinates per query whose products predict the gain: at a batch of ``B`` queries the
#: look reads ``B * LOOK_PULLS`` rows of ``A^T``, against the dense product's one pass over ``A``
LOOK_PULLS = 4


def stage_budgets(eps: float, delta: float) -> StageBudgets:
    """The per-stage budgets of :class:`StageBudgets`; failures of the two stages add up to at
    most ``delta`` by a union bound."""
    return StageBudgets(bandit_delta=delta / 2, norm_eps=eps / 2, norm_delta=delta / 2)


def _check_open_unit(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value < 1.0:
        raise ValueError(f"{name} must be in the open interval (0, 1), got {value!r}")
    return float(value)


def _check_fallback_gain(value: float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 1.0:
        raise ValueError(f"fallback_gain must be a number >= 1 or None, got {value!r}")
    return float(value)


def _check_temperature(value: float) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"temperature must be a finite number > 0, got {value!r}")
    return float(value)


class AdaptiveSoftmax(nn.Module):
    """Top-``k`` classes of ``softmax((A x + b) / temperature)`` and their probabilities, reading
    only part of ``A`` adaptively.

    With probability at least ``1 - delta`` per query (under the paper's sub-Gaussian assumption,
    with variance estimates in place of the unknown variance proxy), the returned classes are the
    exact top-``k`` and each returned probability is within ``(1 +- eps)`` of the exact one.

    Choices where the paper's text and the implementation it ran (the authors' released code)
    differ:

    - Pull counts start at 16 per arm and grow by x1.5 (Algorithm 8 writes x1.1, Appendix C.3 a
      fixed ``d / 10`` first phase, which would cap the gain at 10x); the benchmark numbers of the
      paper were produced this way.
    - The warm-up variance target is Algorithm 2's ``1 / (17 beta^2 log(6 n / delta_Z))`` (what
      the released code runs), not Algorithm 4's ``1 / beta``; it is scaled by ``norm_scale``.
    - Best-arm identification targets the confidence half-width ``2^-(r+1) / beta`` in round ``r``
      (a quarter of ``1 / beta`` first, halving each round): Algorithm 3's ``eps_r / 2`` in units of
      ``1 / beta``, with the width of each arm ``sqrt(2 var_i log(4 n r^2 / delta_B))`` from its own
      variance estimate and ``delta_B = delta / 2``. An arm leaves when its upper bound is below the
      ``k``-th largest lower bound; rounds end when ``k`` arms remain or every remaining arm is
      exact.
    - The estimator of eq. 20 is used without its ``1 / |S|`` factor: with inclusion
      probabilities (which sum to ``|S|``), ``sum_{j in S} A_ij x_j / pi_j`` is the unbiased
      Horvitz-Thompson estimate of ``<A_i, x>``, and the threshold is the ``(|S| + 1)``-th largest
      perturbed key (Appendix A.3.3).

    ``A`` is read through a cached copy of ``A^T`` with one zero column appended (so that arms
    pulling the same coordinate read neighbouring memory, Appendix C.5, and the padding slots of
    ragged per-query arm sets in a batch read the zero column, not ``A``): this doubles the memory
    of ``A``. The column l1 norms of Algorithm 5 are cached beside it; both are preprocessing,
    recomputed when ``A`` changes, and not counted in ``samples_used``. A bias is added exactly
    (it is not an ``A_ij x_j`` product).

    State: ``A`` and ``b`` are referenced, not copied nor saved (they belong to the caller, e.g. a
    head: register this module beside the head's weight so that it is saved with it). The state
    dict holds the two tuned factors (buffers ``bandit_scale`` and ``norm_scale``, 1 until
    :meth:`calibrate`) and ``temperature``, ``eps``, ``delta`` (extra state).

    Args:
        weight: ``[n, d]`` the matrix ``A`` (e.g. a head's class table).
        temperature: softmax temperature (``beta = 1 / temperature``), > 0.
        eps: multiplicative accuracy of the returned probabilities, in (0, 1).
        delta: failure probability per query, in (0, 1).
        seed: seed of this module's private generator of Gumbel noise (successive calls continue
            its stream); ``None`` uses torch's global generator (repeatable under
            ``lightning.seed_everything``).
        bias: optional ``[n]`` per-class offsets ``b``.
        padding_idx: a class that is never predicted (its logit is ``-inf``; it is never pulled).
        fallback_gain: a query whose predicted gain ``n d / samples`` is below this is
            answered by the dense product (below); ``None``: never (the paper's algorithm
            alone, e.g. to count its samples).

    The dense fall-back (not in the paper, whose wall-clock version is future work, Appendix
    C.5): before any pull, each query's products on the first :data:`LOOK_PULLS` coordinates
    of its order give every arm's variance estimate, and with it the pulls the warm-up's
    variance target asks (``N v_N / target``: a Horvitz-Thompson variance falls at least as
    ``1 / N``), from ``T_0`` up to ``d``. Where their sum leaves less than ``fallback_gain`` of
    the ``n d`` products to save (a flat softmax: the normalisation needs nearly every arm to a
    few percent), sampling would read nearly all of ``A`` at a higher cost per entry than the
    dense product, so the query gets the dense logits ``A x + b`` and their exact top-``k``,
    probabilities and ``log Z`` (which meet the guarantee with probability one); its
    ``samples_used`` is then ``n d`` plus the look's ``n LOOK_PULLS``. The prediction counts
    only the warm-up, the first of the three stages, so it errs towards sampling. A batch so
    large that its looks alone would read ``1 / fallback_gain`` of ``A`` goes to the dense
    product at once (the dense product reads ``A`` once for the whole batch; the looks read
    each query's own rows).
    """

    def __init__(
        self,
        weight: Tensor,
        temperature: float = 1.0,
        eps: float = 0.3,
        delta: float = 0.1,
        seed: int | None = None,
        *,
        bias: Tensor | None = None,
        padding_idx: int | None = None,
        fallback_gain: float | None = DEFAULT_FALLBACK_GAIN,
    ) -> None:
        super().__init__()
        if not isinstance(weight, Tensor) or weight.dim() != 2 or weight.numel() == 0:
            shape = tuple(weight.shape) if isinstance(weight, Tensor) else type(weight).__name__
            raise ValueError(f"weight must be a non-empty [n, d] tensor, got {shape}")
        if not weight.is_floating_point():
            raise ValueError(f"weight must be a floating-point tensor, got dtype {weight.dtype}")
        num_classes = weight.shape[0]
        bad_bias = not isinstance(bias, Tensor) or tuple(bias.shape) != (num_classes,)
        if bias is not None and bad_bias:
            shape = tuple(bias.shape) if isinstance(bias, Tensor) else type(bias).__name__
            raise ValueError(f"bias must have shape ({num_classes},), got {shape}")
        if bias is not None:
            check_finite("bias", bias)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"seed must be an int or None, got {seed!r}")
        self.padding_idx = check_padding_idx(padding_idx, num_classes)
        self.temperature = _check_temperature(temperature)
        self.eps = _check_open_unit("eps", eps)
        self.delta = _check_open_unit("delta", delta)
        self.seed = seed
        self.fallback_gain = _check_fallback_gain(fallback_gain)
        # References, not registered: A and b are the caller's state (no copy in the state dict).
        object.__setattr__(self, "_weight", weight)
        object.__setattr__(self, "_bias", bias)
        object.__setattr__(self, "_generator", None)
        object.__setattr__(self, "_columns_cache", None)
        object.__setattr__(self, "_columns_key", None)
        self.register_buffer("bandit_scale", torch.tensor(1.0, dtype=torch.float64))
        self.register_buffer("norm_scale", torch.tensor(1.0, dtype=torch.float64))
        self._columns()

    @property
    def num_classes(self) -> int:
        """``n``, the number of rows of ``A``."""
        return self._weight.shape[0]

    @property
    def dim(self) -> int:
        """``d``, the number of columns of ``A``."""
        return self._weight.shape[1]

    # -- state ------------------------------------------------------------------------------------

    def get_extra_state(self) -> dict[str, float]:
        """The hyperparameters the tuned factors were found for."""
        return {"temperature": self.temperature, "eps": self.eps, "delta": self.delta}

    def set_extra_state(self, state: Any) -> None:
        """Restores what :meth:`get_extra_state` saved (validated)."""
        self.temperature = _check_temperature(state["temperature"])
        self.eps = _check_open_unit("eps", state["eps"])
        self.delta = _check_open_unit("delta", state["delta"])

    def _columns(self) -> tuple[Tensor, Tensor]:
        """``[A^T | 0]`` ``[d, n + 1]`` and the fp32 column l1 norms ``sum_i |A_ij|`` ``[d]``.

        Cached, and recomputed (with ``A`` checked for non-finite entries) when ``A`` changed.
        """
        weight = self._weight
        key = (weight.data_ptr(), weight._version, weight.device, weight.dtype)
        if key != self._columns_key:
            columns = torch.cat([weight.detach().T, weight.new_zeros(weight.shape[1], 1)], dim=1)
            rows = max(1, (1 << 24) // columns.shape[1])
            sums = torch.cat([chunk.float().abs().sum(1) for chunk in columns.split(rows)])
            if not bool(torch.isfinite(sums).all()):
                raise ValueError(
                    f"weight contains NaN or inf values (or overflows fp32), "
                    f"shape {tuple(weight.shape)}"
                )
            object.__setattr__(self, "_columns_cache", (columns, sums))
            object.__setattr__(self, "_columns_key", key)
        return self._columns_cache

    def _default_generator(self) -> torch.Generator | None:
        if self.seed is None:
            return None
        device = self._weight.device
        if self._generator is None or self._generator.device != device:
            object.__setattr__(
                self, "_generator", torch.Generator(device=device).manual_seed(self.seed)
            )
        return self._generator

    # -- input checks -----------------------------------------------------------------------------

    def _check_queries(self, x: Tensor, name: str) -> Tensor:
        """Validates ``x`` ``[d]`` or ``[B, d]``; returns fp32 ``[B, d]`` on ``A``'s device."""
        if not isinstance(x, Tensor) or x.dim() not in (1, 2) or x.shape[-1] != self.dim:
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"{name} must have shape [{self.dim}] or [B, {self.dim}], got {shape}")
        check_finite(name, x)
        return x.reshape(-1, self.dim).to(device=self._weight.device, dtype=torch.float32)

    def _check_k(self, k: int) -> int:
        check_positive_int("k", k)
        available = self.num_classes - (self.padding_idx is not None)
        if k > available:
            raise ValueError(f"k must be <= the {available} predictable classes, got {k}")
        return k

    # -- the algorithm ----------------------------------------------------------------------------

    @torch.no_grad()
    def topk(
        self, x: Tensor, k: int = 1, *, generator: torch.Generator | None = None
    ) -> AdaptiveResult:
        """The top-``k`` classes of each query with their estimated probabilities.

        Args:
            x: ``[d]`` or ``[B, d]`` queries.
            k: how many classes, ``1 <= k <= n``.
            generator: source of the Gumbel noise for this call (default: the module's own, see
                ``seed``). Every query of the batch gets independent noise.

        Returns:
            :class:`AdaptiveResult` (without the batch dimension for a ``[d]`` query).

        Raises:
            ValueError: on a shape mismatch, non-finite entries or a bad ``k``.
        """
        queries = self._check_queries(x, "x")
        k = self._check_k(k)
        if generator is None:
            generator = self._default_generator()
        result = self._run(queries, k, generator, float(self.bandit_scale), float(self.norm_scale))
        if x.dim() == 1:
            return AdaptiveResult(*(t.squeeze(0) for t in result))
        return result

    def _run(
        self,
        x: Tensor,
        k: int,
        generator: torch.Generator | None,
        bandit_scale: float,
        norm_scale: float,
    ) -> AdaptiveResult:
        """Algorithm 4 on ``x`` ``[B, d]`` with the given tuned factors (always in fp32)."""
        with torch.autocast(device_type=x.device.type, enabled=False):
            return self._run_fp32(x, k, generator, bandit_scale, norm_scale)

    def _run_fp32(
        self,
        x: Tensor,
        k: int,
        generator: torch.Generator | None,
        bandit_scale: float,
        norm_scale: float,
    ) -> AdaptiveResult:
        batch = x.shape[0]
        device = x.device
        if batch == 0:
            empty = torch.empty(0, k, device=device)
            return AdaptiveResult(
                empty.long(), empty, empty[:, 0], torch.empty(0, dtype=torch.long, device=device)
            )
        beta = 1.0 / self.temperature
        if self._look_costs_too_much(batch):
            nothing_read = torch.zeros(batch, dtype=torch.long, device=device)
            return self._dense_answers(x, k, beta, nothing_read)
        arms = ArmEstimates(*self._columns(), x, pull_schedule(self.dim), generator)
        candidates = torch.ones(batch, self.num_classes, dtype=torch.bool, device=device)
        if self.padding_idx is not None:
            candidates[:, self.padding_idx] = False
        num_arms = self.num_classes - (self.padding_idx is not None)
        budgets = stage_budgets(self.eps, self.delta)
        warm_up = 1.0 / (17.0 * beta**2 * math.log(6.0 * num_arms / budgets.norm_delta))
        dense = self._flat(arms, candidates, warm_up / norm_scale)
        if bool(dense.all()):
            looked = torch.full((batch,), self._looked_at(), device=device)
            return self._dense_answers(x, k, beta, looked)
        candidates &= ~dense.unsqueeze(1)
        arms.pull_to_variance(warm_up, candidates, norm_scale)
        top = self._best_arms(
            arms, candidates, num_arms, k, beta, budgets.bandit_delta, bandit_scale
        )
        arms.make_exact(torch.zeros_like(candidates).scatter_(1, top, True) & candidates)
        logits = self._logits(arms).gather(1, top)
        logits, order = logits.sort(dim=1, descending=True)
        top = top.gather(1, order)
        log_z = self._log_partition(
            arms, candidates, num_arms, beta, budgets.norm_eps, budgets.norm_delta, norm_scale
        )
        probs = torch.exp(beta * logits - log_z.unsqueeze(1))
        used = arms.samples_used() + self._looked_at()
        if not bool(dense.any()):
            return AdaptiveResult(top, probs, log_z, used)
        rows = dense.nonzero()[:, 0]
        answers = self._dense_answers(x[rows], k, beta, used[rows])
        return AdaptiveResult(
            *(part.index_put((rows,), answer) for part, answer in zip(
                (top, probs, log_z, used), answers, strict=True
            ))
        )  # fmt: skip

    def _flat(self, arms: ArmEstimates, candidates: Tensor, target: float) -> Tensor:
        """bool ``[B]``: the queries to finish with the dense product, whose predicted gain is
        below :attr:`fallback_gain` (class docstring), from the arms' variances at ``T_0``
        pulls (:meth:`ArmEstimates.prefix_variances` of :data:`LOOK_PULLS` coordinates, so
        ``T_0 / LOOK_PULLS`` times the variance at ``T_0``) and the warm-up's variance ``target``
        (for the unscaled estimates)."""
        if self.fallback_gain is None:
            return torch.zeros(candidates.shape[0], dtype=torch.bool, device=candidates.device)
        look = self._look_pulls
        variances = arms.prefix_variances(look)
        pulls = (look * variances / target).clamp(min=arms.schedule[0], max=self.dim)
        predicted = pulls.masked_fill(~candidates, 0.0).sum(1)
        return predicted * self.fallback_gain > self.num_classes * self.dim

    def _look_costs_too_much(self, batch: int) -> bool:
        """Whether a batch of ``batch`` queries goes to the dense product without a look: the
        looks of :meth:`_flat` read ``batch * LOOK_PULLS`` rows of ``A^T``, each query its own,
        while the dense product reads ``A`` once for the whole batch; where they would read
        ``1 / fallback_gain`` of it or more (``batch * LOOK_PULLS * fallback_gain >= d``:
        batch 32 at ``d = 1,024``), sampling cannot repay them."""
        if self.fallback_gain is None:
            return False
        return batch * self._look_pulls * self.fallback_gain >= self.dim

    @property
    def _look_pulls(self) -> int:
        """The coordinates of each query that :meth:`_flat` looks at (at most ``T_0``)."""
        return min(LOOK_PULLS, self.dim)

    def _looked_at(self) -> int:
        """The products per query that :meth:`_flat` computes, or none."""
        return 0 if self.fallback_gain is None else self.num_classes * self._look_pulls

    def _dense_answers(
        self, x: Tensor, k: int, beta: float, samples_before: Tensor
    ) -> AdaptiveResult:
        """The exact answers for queries ``x`` ``[F, d]`` from the dense logits ``A x + b``:
        their top ``k``, probabilities and ``log Z``, and ``samples_before`` ``[F]`` plus the
        ``n d`` products."""
        weight = self._weight.detach()
        logits = x @ weight.float().T
        if self._bias is not None:
            logits += self._bias.detach().float()
        if self.padding_idx is not None:
            logits[:, self.padding_idx] = -math.inf
        values, top = logits.topk(k, dim=1)
        log_z = torch.logsumexp(beta * logits, dim=1)
        probs = torch.exp(beta * values - log_z.unsqueeze(1))
        return AdaptiveResult(top, probs, log_z, samples_before + weight.numel())

    def _logits(self, arms: ArmEstimates) -> Tensor:
        """``[B, n]`` estimated ``<A_i, x> + b_i``."""
        mean = arms.mean()
        return mean if self._bias is None else mean + self._bias.detach().float()

    def _best_arms(
        self,
        arms: ArmEstimates,
        candidates: Tensor,
        num_arms: int,
        k: int,
        beta: float,
        delta_b: float,
        bandit_scale: float,
    ) -> Tensor:
        """Successive elimination (Algorithm 3 with empirical variances) among the ``num_arms``
        arms for the top ``k``, with failure probability ``delta_b``; a query with no candidate
        (finished densely) is done at once.

        Returns:
            long ``[B, k]`` the identified arms.
        """
        survivors = candidates.clone()
        done = torch.zeros(survivors.shape[0], dtype=torch.bool, device=survivors.device)
        rounds = 0
        while True:
            unresolved = (survivors & ~arms.is_exact()).any(1)
            done |= (survivors.sum(1) <= k) | ~unresolved
            if bool(done.all()):
                break
            rounds += 1
            log_term = math.log(4.0 * num_arms * rounds**2 / delta_b)
            half_width = 2.0 ** -(rounds + 1) / beta
            active = survivors & ~done.unsqueeze(1)
            arms.pull_to_variance(half_width**2 / (2.0 * log_term), active, bandit_scale)
            mean = self._logits(arms)
            radius = torch.sqrt(2.0 * bandit_scale * arms.variance() * log_term)
            lower = (mean - radius).masked_fill(~survivors, -math.inf)
            kth_lower = lower.topk(k, dim=1).values[:, -1:]
            survivors &= ~(active & (mean + radius < kth_lower))
        return self._logits(arms).masked_fill(~survivors, -math.inf).topk(k, dim=1).indices

    def _log_partition(
        self,
        arms: ArmEstimates,
        candidates: Tensor,
        num_arms: int,
        beta: float,
        eps_z: float,
        delta_z: float,
        norm_scale: float,
    ) -> Tensor:
        """NormalizationEstimation (Algorithm 2) over the ``num_arms`` arms to accuracy ``eps_z``
        with failure probability ``delta_z``; ``[B]`` ``log Z``.

        Each arm's target variance is ``1 / (beta^2 max(...))`` with the three terms of Algorithm
        2, line 7 (``n_i`` pulls of variance proxy ``sigma^2`` give variance ``sigma^2 / n_i``),
        with ``alpha_i``, ``gamma_i`` from the lower confidence bounds of the warm-up estimates.
        """
        log_term = math.log(6.0 * num_arms / delta_z)
        radius = torch.sqrt(2.0 * norm_scale * arms.variance() * log_term)
        half_log_alpha = (0.5 * beta * (self._logits(arms) - radius)).masked_fill(
            ~candidates, -math.inf
        )
        log_alpha_sum = torch.logsumexp(2.0 * half_log_alpha, dim=1, keepdim=True)
        first_order = torch.exp(2.0 * half_log_alpha - log_alpha_sum)
        second_order = torch.exp(
            half_log_alpha + torch.logsumexp(half_log_alpha, dim=1, keepdim=True) - log_alpha_sum
        )
        needed = torch.maximum(
            torch.full_like(first_order, 17.0 * log_term),
            torch.maximum(
                16.0 * math.sqrt(2.0) * log_term * second_order / eps_z,
                16.0 * math.log(12.0 / delta_z) * first_order / eps_z**2,
            ),
        )
        arms.pull_to_variance(1.0 / (beta**2 * needed), candidates, norm_scale)
        scaled = (beta * self._logits(arms)).masked_fill(~candidates, -math.inf)
        return torch.logsumexp(scaled, dim=1)

    # -- tuning -----------------------------------------------------------------------------------

    @torch.no_grad()
    def calibrate(
        self,
        x_train: Tensor,
        k: int = 1,
        *,
        seed: int = 0,
        tolerance: float = 1e-2,
        batch_size: int = 64,
    ) -> CalibrationResult:
        """Tunes the two variance factors on calibration queries (Appendix C.4) and keeps them.

        First the factor on the best-arm-identification variances, the smallest in
        ``[1e-6, 1]`` (bisection in ``log10`` space to ``tolerance``) for which the exact top-``k``
        set is found on at least ``1 - delta`` of the queries; then, with it in place, the factor on
        the normalisation variances for which the whole success event (set and every probability
        within ``1 +- eps``) holds on at least ``1 - delta``. Every evaluation reuses the same
        Gumbel noise (``seed``), so the success rate is a deterministic function of the factors.
        The guarantee becomes empirical, as in the paper.

        Args:
            x_train: ``[m, d]`` calibration queries (the paper uses about 100).
            k: the ``k`` the module will be queried with.
            seed: seed of the noise shared by every evaluation.
            tolerance: ``log10`` width at which the bisection stops.
            batch_size: queries per vectorised call (memory grows as ``batch_size * n * L``
                floats, ``L`` the number of pull levels, about 14 at ``d = 4096``).

        Returns:
            :class:`CalibrationResult`; the factors are stored in ``bandit_scale`` and
            ``norm_scale``.
        """
        queries = self._check_queries(x_train, "x_train")
        k = self._check_k(k)
        check_positive_int("batch_size", batch_size)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        if not (isinstance(tolerance, (int, float)) and 0 < tolerance < 6):
            raise ValueError(f"tolerance must be in (0, 6) (log10 units), got {tolerance!r}")
        exact = exact_topk_softmax(
            self._weight.detach(),
            queries,
            k,
            bias=None if self._bias is None else self._bias.detach(),
            temperature=self.temperature,
            padding_idx=self.padding_idx,
        )
        target = 1.0 - self.delta

        def rates(bandit_scale: float, norm_scale: float) -> tuple[float, float]:
            generator = torch.Generator(device=queries.device).manual_seed(seed)
            parts = [
                self._run(chunk, k, generator, bandit_scale, norm_scale)
                for chunk in queries.split(batch_size)
            ]
            indices = torch.cat([p.indices for p in parts])
            probs = torch.cat([p.probs for p in parts])
            identified, success = adaptive_success(indices, probs, exact, self.eps)
            return float(identified.double().mean()), float(success.double().mean())

        bandit = smallest_passing_factor(lambda c: rates(c, 1.0)[0] >= target, tolerance=tolerance)
        norm = smallest_passing_factor(lambda c: rates(bandit, c)[1] >= target, tolerance=tolerance)
        self.bandit_scale.fill_(bandit)
        self.norm_scale.fill_(norm)
        return CalibrationResult(bandit, norm, *rates(bandit, norm))

    def extra_repr(self) -> str:
        return (
            f"num_classes={self.num_classes}, dim={self.dim}, temperature={self.temperature}, "
            f"eps={self.eps}, delta={self.delta}, bandit_scale={float(self.bandit_scale):.3g}, "
            f"norm_scale={float(self.norm_scale):.3g}"
        )
