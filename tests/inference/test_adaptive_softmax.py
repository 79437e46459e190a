"""AdaptiveSoftmax: sampling primitives, estimators, the guarantee, state and the head API."""

from __future__ import annotations

import io
import itertools
import math

import pytest
import torch

from lightning_sampled.heads import FullSoftmaxHead
from lightning_sampled.inference import (
    AdaptiveSoftmax,
    adaptive_success,
    exact_topk_softmax,
)
from lightning_sampled.inference import arm_estimates as arm_estimates_module
from lightning_sampled.inference.arm_estimates import ArmEstimates
from lightning_sampled.inference.calibration import smallest_passing_factor
from lightning_sampled.inference.importance_sampling import (
    gumbel_permutation,
    inclusion_probabilities,
    pull_schedule,
    sample_thresholds,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def planted_instance(
    num_classes: int, dim: int, queries: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``A`` iid ``N(0, 1/d^2)``; query ``b`` is ``sign`` of three planted rows (weights 1, .7,
    .45) plus noise, so its top-3 logits are about 0.8, 0.56, 0.36 above a bulk near 0."""
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(num_classes, dim, generator=g) / dim
    planted = torch.stack([torch.randperm(num_classes, generator=g)[:3] for _ in range(queries)])
    scales = torch.tensor([1.0, 0.7, 0.45]).view(1, 3, 1)
    x = (scales * torch.sign(weight[planted])).sum(1)
    return weight, x + 0.3 * torch.randn(queries, dim, generator=g)


def with_sentinel(weight: torch.Tensor) -> torch.Tensor:
    """``[A^T | 0]``, the layout :class:`ArmEstimates` reads."""
    return torch.cat([weight.T, weight.new_zeros(weight.shape[1], 1)], dim=1)


# -- sampling primitives -------------------------------------------------------------------------


def test_pull_schedule_starts_at_16_grows_by_half_and_ends_at_d():
    sizes = pull_schedule(1000)
    assert sizes[:4] == [16, 24, 36, 54]
    assert sizes[-1] == 1000
    assert all(b > a for a, b in itertools.pairwise(sizes))
    assert pull_schedule(10) == [10]


def plackett_luce_inclusion(weights: list[float], size: int) -> list[float]:
    """Exact ``P(j in first size draws)`` of sequential sampling without replacement."""
    total = [0.0] * len(weights)
    for seq in itertools.permutations(range(len(weights)), size):
        p, left = 1.0, sum(weights)
        for j in seq:
            p *= weights[j] / left
            left -= weights[j]
        for j in seq:
            total[j] += p
    return total


def test_gumbel_inclusion_probabilities_match_frequencies():
    """Empirical inclusion frequencies of the Gumbel top-N and the mean of the Gumbel-CDF
    inclusion probabilities (eq. 17) both match the exact without-replacement probabilities."""
    weights = [5.0, 3.0, 1.0, 0.5, 0.25, 0.25]
    size, draws = 2, 200_000
    exact = torch.tensor(plackett_luce_inclusion(weights, size), dtype=torch.float64)
    log_w = torch.tensor(weights, dtype=torch.float64).log().expand(draws, -1).contiguous()
    order, keys = gumbel_permutation(log_w, torch.Generator().manual_seed(0))
    included = torch.zeros(draws, len(weights), dtype=torch.bool)
    included.scatter_(1, order[:, :size], True)
    frequency = included.double().mean(0)
    bound = 4.5 * torch.sqrt(exact * (1 - exact) / draws)
    assert torch.all((frequency - exact).abs() <= bound), (frequency, exact)
    chi2 = (draws * (frequency - exact) ** 2 / (exact * (1 - exact))).sum()
    assert chi2 < 22.5  # 6 dof (dependent cells make it conservative), p ~ 0.001
    # The Gumbel-CDF probability of j given the others' keys: threshold = the size-th largest of
    # the others, i.e. the (size+1)-th key overall when j is in the sample, the size-th otherwise.
    tau = torch.where(included, keys[:, size : size + 1], keys[:, size - 1 : size])
    pi, _ = inclusion_probabilities(log_w, tau)
    assert torch.allclose(pi.mean(0), exact, atol=4.5 * float(pi.std(0).max()) / draws**0.5)
    # Eq. 18 with the threshold of sample_thresholds: E[1{j in S} / pi_j] = 1 for every j.
    pi_hat, _ = inclusion_probabilities(log_w, sample_thresholds(keys, [size]))
    ratio = included.double() / pi_hat
    assert torch.all((ratio.mean(0) - 1).abs() <= 4.5 * ratio.std(0) / draws**0.5)


def test_each_query_gets_its_own_gumbel_noise():
    log_w = torch.zeros(4, 50, dtype=torch.float64)
    order, _ = gumbel_permutation(log_w, torch.Generator().manual_seed(0))
    assert len({tuple(row.tolist()) for row in order}) == 4


def test_inclusion_probabilities_of_a_full_sample_are_one():
    log_w = torch.tensor([[0.0, -3.0, -math.inf]], dtype=torch.float64)
    pi, complement = inclusion_probabilities(log_w, sample_thresholds(log_w, [3]))
    assert torch.equal(pi, torch.ones_like(pi))
    assert torch.equal(complement, torch.zeros_like(complement))


# -- the arm estimators --------------------------------------------------------------------------


def test_importance_weighted_mean_is_unbiased_and_variance_estimate_calibrated():
    """Over many independent Gumbel orders, the Horvitz-Thompson estimate at every pull level
    averages to ``<A_i, x>``, and the eq. 23 variance estimate averages to the estimates'
    variance."""
    g = torch.Generator().manual_seed(0)
    num_arms, dim, draws = 3, 40, 20_000
    weight = torch.randn(num_arms, dim, generator=g) * torch.rand(dim, generator=g) * 2
    x = torch.randn(dim, generator=g)
    exact = weight @ x
    arms = ArmEstimates(
        with_sentinel(weight),
        weight.abs().sum(0),
        x.expand(draws, dim).contiguous(),
        [4, 10, 20, 40],
        torch.Generator().manual_seed(1),
    )
    everything = torch.ones(draws, num_arms, dtype=torch.bool)
    for _ in range(3):
        arms.advance(everything)
        mean, var = arms.mean(), arms.variance()
        z = (mean.mean(0) - exact) / (mean.std(0) / draws**0.5)
        assert torch.all(z.abs() < 4.5), z
        ratio = var.mean(0) / mean.var(0)
        assert torch.all((ratio - 1).abs() < 0.1), ratio
    arms.advance(everything)
    assert torch.all(arms.is_exact())
    assert torch.allclose(arms.mean(), exact.expand(draws, -1), atol=1e-4)
    assert torch.all(arms.variance() == 0)


def test_samples_used_equals_the_entries_of_a_read_once_each(monkeypatch):
    """Every entry of ``A`` read is counted, and no entry is read twice (pulls are reused), where
    every read gathers its arms' entries (no whole rows, whose other arms' entries go unused)."""
    monkeypatch.setattr(arm_estimates_module, "ROW_READ_SHARE", 2.0)
    weight, x = planted_instance(30, 3000, 5, seed=1)
    sentinel = weight.shape[0]
    reads: list[torch.Tensor] = []
    original = arm_estimates_module.read_entries

    def counting(columns: torch.Tensor, flat_index: torch.Tensor) -> torch.Tensor:
        reads.append(flat_index.reshape(-1).long().clone())
        return original(columns, flat_index)

    monkeypatch.setattr(arm_estimates_module, "read_entries", counting)
    module = AdaptiveSoftmax(weight, temperature=0.5, seed=0, fallback_gain=None)
    for query in x:  # one query per call: flat indices identify (coordinate, arm) within a call
        reads.clear()
        result = module.topk(query, k=2)
        index = torch.cat(reads)
        real = index[index % (sentinel + 1) != sentinel]
        assert real.numel() == int(result.samples_used)
        assert real.unique().numel() == real.numel()
        assert 0 < int(result.samples_used) < weight.numel()
    reads.clear()
    batch = module.topk(x, k=2)
    index = torch.cat(reads)
    assert int((index % (sentinel + 1) != sentinel).sum()) == int(batch.samples_used.sum())


@pytest.mark.parametrize("share", [0.5, 0.875])
def test_whole_row_reads_give_the_estimates_of_entry_gathers(monkeypatch, share):
    """Reads that concern most arms take whole rows of ``A^T``; the sums they add, to the arms of
    the read only, are those of gathering each arm's entries, at every level and for exactness."""
    g = torch.Generator().manual_seed(3)
    num_arms, dim, batch = 40, 300, 3
    weight = torch.randn(num_arms, dim, generator=g)
    x = torch.randn(batch, dim, generator=g)
    groups = [torch.ones(batch, num_arms, dtype=torch.bool)]
    groups += [torch.rand(batch, num_arms, generator=g) < p for p in (0.95, 0.9, 0.6, 0.3)]
    rows_read = []
    original = arm_estimates_module.read_rows

    def counting(columns, coordinates):
        rows_read.append(coordinates.numel())
        return original(columns, coordinates)

    monkeypatch.setattr(arm_estimates_module, "read_rows", counting)
    states = []
    for row_share in (share, 2.0):  # whole rows where a read covers the share; never
        monkeypatch.setattr(arm_estimates_module, "ROW_READ_SHARE", row_share)
        arms = ArmEstimates(
            with_sentinel(weight),
            weight.abs().sum(0),
            x,
            pull_schedule(dim),
            torch.Generator().manual_seed(4),
        )
        for group in groups:
            arms.advance(group)
        arms.make_exact(groups[3])
        states.append((arms.mean(), arms.variance(), arms.level.clone()))
        if row_share == share:
            assert rows_read, "some read must take whole rows"
            rows_read.clear()
    assert not rows_read
    (mean_rows, var_rows, level_rows), (mean, var, level) = states
    assert torch.equal(level_rows, level)
    torch.testing.assert_close(mean_rows, mean, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(var_rows, var, rtol=1e-5, atol=1e-5)
    exact = (level == arms.exact_level[:, None]) & groups[3]
    torch.testing.assert_close(mean_rows[exact], (x @ weight.T)[exact], rtol=1e-4, atol=1e-4)


# -- the guarantee -------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 3])
def test_planted_topk_and_probabilities_within_eps_on_200_queries(k):
    weight, x = planted_instance(100, 20_000, 200, seed=0)
    eps, delta = 0.3, 0.1
    module = AdaptiveSoftmax(weight, temperature=0.5, eps=eps, delta=delta, seed=k)
    result = module.topk(x, k)
    exact = exact_topk_softmax(weight, x, k, temperature=0.5)
    identified, success = adaptive_success(result.indices, result.probs, exact, eps)
    assert success.double().mean() >= 1 - delta
    assert identified.double().mean() >= 1 - delta
    log_z_error = (result.log_partition.double() - exact.log_partition).abs()
    assert (log_z_error <= math.log1p(eps)).double().mean() >= 1 - delta
    gain = weight.numel() / result.samples_used.double()
    assert gain.mean() > 2.5, "the instance must exercise adaptivity"
    assert torch.all(result.indices[:, :-1] != result.indices[:, 1:])


def test_normalization_estimation_meets_a_tight_eps_that_the_warm_up_alone_misses(monkeypatch):
    """Three runners-up hold a third of the mass and are eliminated early, so only Algorithm 2's
    second pull phase makes ``log Z`` accurate to ``eps / 2``; the exact top logit (C.2) is needed
    for the probability to be within ``eps``."""
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(4, 20_000, generator=g) / 20_000
    signs = torch.sign(weight)
    x = signs[0] + 0.6 * signs[1:].sum(0) + 0.3 * torch.randn(200, 20_000, generator=g)
    eps, delta, temperature = 0.02, 0.1, 0.21
    exact = exact_topk_softmax(weight, x, 1, temperature=temperature)

    def rates() -> tuple[float, float]:
        module = AdaptiveSoftmax(weight, temperature, eps, delta, seed=0)
        result = module.topk(x)
        _, success = adaptive_success(result.indices, result.probs, exact, eps)
        error = (result.log_partition.double() - exact.log_partition).abs()
        return float(success.double().mean()), float((error <= math.log1p(eps / 2)).double().mean())

    success, log_z_ok = rates()
    assert success >= 1 - delta and log_z_ok >= 1 - delta
    # The same instance without the second phase of NormalizationEstimation fails the target.
    original = ArmEstimates.pull_to_variance

    def warm_up_and_bandit_only(self, target, mask, scale=1.0):
        if not torch.is_tensor(target):  # the per-arm targets of Algorithm 2 are tensors
            original(self, target, mask, scale)

    monkeypatch.setattr(ArmEstimates, "pull_to_variance", warm_up_and_bandit_only)
    assert rates()[1] < 1 - delta


def test_stages_pull_to_the_paper_targets_with_half_of_eps_and_delta_each(monkeypatch):
    """Algorithm 4 (Appendix C) gives best-arm identification ``delta / 2`` and
    NormalizationEstimation ``eps / 2``, ``delta / 2``. Every variance target the stages pull to
    equals its closed form with that split: the warm-up ``1 / (17 beta^2 log(6 n / delta_Z))``,
    round ``r`` of the bandit ``w_r^2 / (2 log(4 n r^2 / delta_B))`` with ``w_r = 2^-(r+1) / beta``,
    and Algorithm 2's per-arm ``1 / (beta^2 max(17 L, 16 sqrt(2) L s_i / eps_Z,
    16 log(12 / delta_Z) f_i / eps_Z^2))`` from the lower confidence bounds of the estimates."""
    n, eps, delta, temperature = 100, 0.1, 0.1, 0.1
    beta, eps_z, delta_z, delta_b = 1 / temperature, eps / 2, delta / 2, delta / 2
    weight, x = planted_instance(n, 4000, 6, seed=7)
    calls: list[tuple[object, torch.Tensor, torch.Tensor]] = []
    original = ArmEstimates.pull_to_variance

    def recording(self, target, mask, scale=1.0):
        calls.append((target, self.mean().double(), self.variance().double()))
        original(self, target, mask, scale)

    monkeypatch.setattr(ArmEstimates, "pull_to_variance", recording)
    AdaptiveSoftmax(weight, temperature, eps, delta, seed=0, fallback_gain=None).topk(x, k=2)
    (warm_up, *rounds), (norm_target, mean, variance) = [c[0] for c in calls[:-1]], calls[-1]
    assert warm_up == pytest.approx(1 / (17 * beta**2 * math.log(6 * n / delta_z)), rel=1e-12)
    assert rounds, "the instance must take an elimination round"
    for r, target in enumerate(rounds, start=1):
        width = 2.0 ** -(r + 1) / beta
        assert target == pytest.approx(width**2 / (2 * math.log(4 * n * r**2 / delta_b)))
    log_term = math.log(6 * n / delta_z)
    half_log_alpha = 0.5 * beta * (mean - torch.sqrt(2 * variance * log_term))
    log_norm = torch.logsumexp(2 * half_log_alpha, dim=1, keepdim=True)
    first = torch.exp(2 * half_log_alpha - log_norm)
    second = torch.exp(half_log_alpha + torch.logsumexp(half_log_alpha, 1, keepdim=True) - log_norm)
    terms = torch.stack(
        [
            torch.full_like(first, 17 * log_term),
            16 * math.sqrt(2) * log_term * second / eps_z,
            16 * math.log(12 / delta_z) * first / eps_z**2,
        ]
    )
    assert bool((terms.argmax(0) == 2).any()), "the eps_Z^2 term must bind for some arm"
    expected = 1 / (beta**2 * terms.amax(0))
    torch.testing.assert_close(norm_target.double(), expected, rtol=1e-4, atol=0)


def test_zero_coordinates_and_zero_query_are_exact():
    weight, x = planted_instance(20, 500, 2, seed=2)
    x[0, 100:] = 0.0
    x[1] = 0.0
    result = AdaptiveSoftmax(weight, seed=0).topk(x, k=2)
    exact = exact_topk_softmax(weight, x, 2)
    assert torch.allclose(result.probs.double()[0], exact.probs[0], rtol=0.3)
    assert result.indices[0].tolist() == exact.indices[0].tolist()
    assert torch.allclose(result.probs[1], torch.full((2,), 1 / 20))
    assert result.log_partition[1].item() == pytest.approx(math.log(20), rel=1e-5)
    assert torch.all(result.samples_used <= 20 * 500)


# -- calibration and state ----------------------------------------------------------------------


def test_log_space_bisection_finds_the_smallest_passing_factor():
    calls: list[float] = []

    def passes(c: float) -> bool:
        calls.append(c)
        return c >= 3e-3

    found = smallest_passing_factor(passes)
    assert 3e-3 <= found <= 3e-3 * 10**0.01
    assert len(calls) <= 2 + math.ceil(math.log2(6 / 0.01))
    assert smallest_passing_factor(lambda c: False) == 1.0
    assert smallest_passing_factor(lambda c: True) == 1e-6


def test_calibration_lowers_cost_keeps_target_and_round_trips_through_a_state_dict():
    weight, x = planted_instance(50, 8000, 160, seed=3)
    train, test = x[:80], x[80:]
    module = AdaptiveSoftmax(weight, temperature=0.5, delta=0.1, seed=0)
    before = module.topk(test, generator=torch.Generator().manual_seed(5))
    found = module.calibrate(train, tolerance=0.1)
    assert 1e-6 <= found.bandit_scale <= 1 and 1e-6 <= found.norm_scale <= 1
    assert found.success_rate >= 0.9 and found.identification_rate >= 0.9
    assert float(module.bandit_scale) == found.bandit_scale
    after = module.topk(test, generator=torch.Generator().manual_seed(5))
    assert after.samples_used.sum() < before.samples_used.sum()

    buffer = io.BytesIO()
    torch.save(module.state_dict(), buffer)
    buffer.seek(0)
    restored = AdaptiveSoftmax(weight, temperature=2.0, delta=0.2)
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    assert (restored.temperature, restored.eps, restored.delta) == (0.5, 0.3, 0.1)
    assert float(restored.norm_scale) == found.norm_scale
    again = restored.topk(test, generator=torch.Generator().manual_seed(5))
    for a, b in zip(after, again, strict=True):
        assert torch.equal(a, b)
    assert "weight" not in module.state_dict()


def test_seeded_module_is_repeatable_and_each_call_draws_new_noise():
    weight, x = planted_instance(20, 2000, 4, seed=4)
    first, second = AdaptiveSoftmax(weight, seed=7), AdaptiveSoftmax(weight, seed=7)
    a, b = first.topk(x), second.topk(x)
    assert torch.equal(a.samples_used, b.samples_used) and torch.equal(a.probs, b.probs)
    calls = [first.topk(x).probs for _ in range(3)]
    assert not all(torch.equal(calls[0], c) for c in calls[1:])


# -- the dense fall-back -------------------------------------------------------------------------


def flat_and_planted(num_classes, dim, seed):
    """:func:`planted_instance` with a small bias: four planted queries, which sampling answers
    with a gain of about 4 at ``(100, 20,000)``, after two flat ones (``sqrt(d)`` times a random
    direction: every arm's logit about ``N(0, 1)``, whose estimates need nearly every
    coordinate, gain 1)."""
    weight, planted = planted_instance(num_classes, dim, 4, seed)
    g = torch.Generator().manual_seed(seed + 1)
    flat = math.sqrt(dim) * torch.randn(2, dim, generator=g)
    bias = 0.01 * torch.randn(num_classes, generator=g)
    return weight, bias, torch.cat([flat, planted])


def test_flat_queries_get_the_exact_dense_answer_and_planted_ones_are_sampled():
    n, d, k = 100, 20_000, 2
    weight, bias, x = flat_and_planted(n, d, seed=0)
    padding = int((x[0] @ weight.T + bias).argmax())  # the dense path must leave it out
    kwargs = dict(temperature=0.5, bias=bias, padding_idx=padding, seed=0)
    module = AdaptiveSoftmax(weight, **kwargs)  # the default fall-back
    result = module.topk(x, k)
    exact = exact_topk_softmax(weight, x, k, temperature=0.5, bias=bias, padding_idx=padding)
    flat, planted = slice(0, 2), slice(2, 6)
    assert torch.equal(result.indices[flat], exact.indices[flat])
    torch.testing.assert_close(result.probs[flat], exact.probs[flat].float(), rtol=1e-4, atol=0)
    torch.testing.assert_close(
        result.log_partition[flat], exact.log_partition[flat].float(), rtol=1e-5, atol=1e-5
    )
    looked = n * 4  # LOOK_PULLS products of every arm
    assert torch.equal(result.samples_used[flat], torch.full((2,), n * d + looked))
    assert bool((result.samples_used[planted] < n * d / 2.5).all()), "sampled, with a gain"
    identified, success = adaptive_success(result.indices, result.probs, exact, module.eps)
    assert bool(success.all())
    # without the fall-back the flat queries read nearly all of A through the sampled path
    paper = AdaptiveSoftmax(weight, **kwargs, fallback_gain=None)
    assert bool((paper.topk(x[flat], k).samples_used > 0.9 * n * d).all())


def test_a_batch_whose_looks_would_cost_too_much_goes_dense_at_once(monkeypatch):
    """At ``batch * LOOK_PULLS * fallback_gain >= d`` no query is looked at: every answer is
    the dense one, and ``samples_used`` is ``n d`` exactly; below it, queries are looked at."""
    n, d = 50, 256
    weight, bias, x = flat_and_planted(n, d, seed=1)
    reads = []
    monkeypatch.setattr(
        arm_estimates_module, "read_rows", lambda c, rows: reads.append(rows) or c[rows].float()
    )
    module = AdaptiveSoftmax(weight, bias=bias, seed=0, fallback_gain=16.0)  # 6 * 4 * 16 >= 256
    result = module.topk(x, 1)
    exact = exact_topk_softmax(weight, x, 1, bias=bias)
    assert not reads
    assert torch.equal(result.indices, exact.indices)
    assert torch.equal(result.samples_used, torch.full((6,), n * d))
    AdaptiveSoftmax(weight, bias=bias, seed=0, fallback_gain=8.0).topk(x, 1)  # 6 * 4 * 8 < 256
    assert reads and reads[0].shape == (6, 4)


# -- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"eps": 0.0}, "eps"),
        ({"eps": 1.0}, "eps"),
        ({"delta": -0.1}, "delta"),
        ({"delta": 1.5}, "delta"),
        ({"temperature": 0.0}, "temperature"),
        ({"bias": torch.zeros(3)}, "bias"),
        ({"seed": 1.5}, "seed"),
        ({"fallback_gain": 0.5}, "fallback_gain"),
        ({"fallback_gain": True}, "fallback_gain"),
        ({"fallback_gain": math.nan}, "fallback_gain"),
    ],
)
def test_bad_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AdaptiveSoftmax(torch.randn(5, 8), **kwargs)


def test_bad_queries_raise():
    weight = torch.randn(5, 8)
    module = AdaptiveSoftmax(weight)
    with pytest.raises(ValueError, match="k must be <= the 5"):
        module.topk(torch.randn(8), k=6)
    with pytest.raises(ValueError, match="k must be a positive integer"):
        module.topk(torch.randn(8), k=0)
    with pytest.raises(ValueError, match=r"x must have shape \[8\] or \[B, 8\]"):
        module.topk(torch.randn(9))
    with pytest.raises(ValueError, match="x must have shape"):
        module.topk(torch.randn(2, 3, 8))
    with pytest.raises(ValueError, match="x contains NaN"):
        module.topk(torch.tensor([math.nan] + [0.0] * 7))
    with pytest.raises(ValueError, match="x_train contains inf"):
        module.calibrate(torch.full((2, 8), math.inf))
    bad = weight.clone()
    bad[1, 2] = math.nan
    with pytest.raises(ValueError, match="weight contains NaN"):
        AdaptiveSoftmax(bad)
    with pytest.raises(ValueError, match="weight must be a non-empty"):
        AdaptiveSoftmax(torch.randn(8))


# -- the head API --------------------------------------------------------------------------------


def test_head_adaptive_topk_matches_exact_with_bias_and_padding():
    weight, x = planted_instance(40, 4000, 6, seed=5)
    head = FullSoftmaxHead(40, 4000, bias=True, padding_idx=3)
    with torch.no_grad():
        head.weight.copy_(weight)
        head.bias.copy_(torch.linspace(-0.2, 0.2, 40))
    z = x.view(2, 3, 4000)
    # Make the padding class the best one: it must still never be returned.
    with torch.no_grad():
        head.bias[3] = 10.0
    result = head.adaptive_topk(z, k=2, temperature=0.5, seed=0)
    assert result.indices.shape == (2, 3, 2) and result.probs.shape == (2, 3, 2)
    assert result.log_partition.shape == (2, 3) and result.samples_used.shape == (2, 3)
    _, exact_indices = head.topk(z, 2)
    assert torch.equal(result.indices, exact_indices)
    logits = head.logits(z).double() / 0.5
    exact_probs = torch.softmax(logits, dim=-1).gather(-1, exact_indices)
    assert torch.allclose(result.probs.double(), exact_probs, rtol=0.3)
    again = head.adaptive_topk(z, k=2, temperature=0.5, seed=0)
    assert torch.equal(again.samples_used, result.samples_used)
    assert "_adaptive_softmax" not in str(list(head.state_dict()))


def test_head_adaptive_topk_sees_weight_updates_and_rejects_bad_input():
    head = FullSoftmaxHead(10, 64)
    z = torch.randn(64)
    with torch.no_grad():
        head.weight.zero_()
        head.weight[7] = z.sign()
    assert head.adaptive_topk(z, seed=0).indices.item() == 7
    with torch.no_grad():
        head.weight.zero_()
        head.weight[2] = z.sign()
    assert head.adaptive_topk(z, seed=0).indices.item() == 2
    with pytest.raises(ValueError, match="z must have shape"):
        head.adaptive_topk(torch.randn(63))
    with pytest.raises(ValueError, match="eps"):
        head.adaptive_topk(z, eps=1.2)


def test_autocast_does_not_lower_the_precision_of_the_estimates():
    weight, x = planted_instance(20, 3000, 4, seed=6)
    plain = AdaptiveSoftmax(weight, seed=0).topk(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = AdaptiveSoftmax(weight, seed=0).topk(x)
    assert mixed.probs.dtype == torch.float32
    assert torch.equal(plain.probs, mixed.probs)
