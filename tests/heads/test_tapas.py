"""TapasHead: the two passes of Algorithm 1, Algorithm 2's shards, and the loss on top of them."""

import math

import pytest
import torch
import torch.nn.functional as F
from fake_samplers import PerQueryOnly, Stream, restart_draws

from lightning_sampled.heads import SampledSoftmaxHead, TapasHead
from lightning_sampled.heads.tapas import draw_distinct
from lightning_sampled.samplers import UniformSampler, UnigramSampler


def randomize(head, seed=0, scale=2.0):
    torch.manual_seed(seed)
    with torch.no_grad():
        head.weight.normal_(0.0, scale / math.sqrt(head.dim))
        if head.bias is not None:
            head.bias.normal_()
    return head


def brute_scores(head, z, ids):
    """log sum_i exp(f_i(c) / tau), float64, straight from the definition."""
    w = head.weight.double()[ids]
    b = 0.0 if head.bias is None else head.bias.double()[ids]
    logits = z.double() @ w.T + b
    return torch.log(torch.exp(logits / head.selection_temperature).sum(0))


def grads(head, z, y):
    head.zero_grad()
    z = z.clone().requires_grad_(True)
    loss = head(z, y)
    loss.backward()
    return loss.detach(), z.grad, head.weight.grad.clone()


def test_r_equal_1_without_correction_is_sampled_softmax_on_the_same_draws():
    n_classes, d, n = 50, 6, 8
    draws = torch.randperm(n_classes)[: n + 1]  # the first pass reads one class past the n
    uniform = torch.full((n_classes,), 1.0 / n_classes)
    tapas = randomize(
        TapasHead(
            n_classes,
            d,
            Stream(uniform, draws),
            n,
            presample_factor=1,
            selection_temperature=0.3,
            bias=True,
        )
    )
    ssm = SampledSoftmaxHead(
        n_classes,
        d,
        Stream(uniform, draws),
        n,
        shared_negatives=True,
        weight=tapas.weight,
        bias=True,
        convention="tensorflow",  # under a uniform proposal: every logit shifted alike
        in_batch_negatives=False,
    )
    with torch.no_grad():
        ssm.bias.copy_(tapas.bias)
    z = torch.randn(10, d)
    y = torch.randint(0, n_classes, (10,))
    y[0] = draws[3]  # an accidental hit, masked by both
    for got, want in zip(grads(tapas, z, y), grads(ssm, z, y), strict=True):
        torch.testing.assert_close(got, want)
    # and with a skewed proposal, TAPAS stays uncorrected: plain cross-entropy over [y, S]
    skewed = torch.softmax(torch.randn(n_classes) * 3, 0)
    tapas.sampler = Stream(skewed, draws)
    o = z @ tapas.weight.T + tapas.bias
    neg = o[:, draws[:n]].masked_fill(draws[:n] == y[:, None], -math.inf)
    logits = torch.cat([o.gather(1, y[:, None]), neg], 1)
    want = F.cross_entropy(logits, torch.zeros(10, dtype=torch.long))
    torch.testing.assert_close(tapas(z, y), want)


def test_r_equal_1_matches_sampled_softmax_with_seeded_draws():
    n_classes, d, n = 5000, 4, 6
    tapas = TapasHead(n_classes, d, None, n, presample_factor=1)
    ssm = SampledSoftmaxHead(
        n_classes,
        d,
        num_negatives=n,
        shared_negatives=True,
        weight=tapas.weight,
        convention="tensorflow",  # uniform proposal: every logit shifted alike, as uncorrected
        in_batch_negatives=False,
    )
    z = torch.randn(7, d)
    y = torch.randint(0, n_classes, (7,))
    first = UniformSampler(n_classes)
    restart_draws(first, 11)
    assert first.sample(z, n, shared=True).ids.unique().numel() == n
    restart_draws(tapas, 11)
    got = tapas(z, y)
    restart_draws(ssm, 11)
    torch.testing.assert_close(got, ssm(z, y))


@pytest.mark.parametrize("tau", [0.7, 1e-3])
def test_second_pass_is_the_top_n_of_the_first_by_batch_score(tau):
    counts = torch.arange(1, 301).float()
    head = TapasHead(
        300,
        6,
        num_negatives=10,
        presample_factor=5,
        selection_temperature=tau,
        sampler=UnigramSampler(counts, alpha=0.5, padding_idx=0),
        bias=True,
        padding_idx=0,
        chunk_size=7,
    )
    randomize(head, scale=3.0)
    z = torch.randn(12, 6)
    torch.manual_seed(3)
    sel = head.select_negatives(z)
    assert sel.candidates.numel() == 50 and sel.candidates.unique().numel() == 50
    assert not bool((sel.candidates == 0).any())
    want = brute_scores(head, z, sel.candidates)
    if tau < 0.01:  # exp overflows: the definition in the log domain, in float64
        logits = z.double() @ head.weight.double()[sel.candidates].T
        want = torch.logsumexp((logits + head.bias.double()[sel.candidates]) / tau, 0)
    assert bool(torch.isfinite(sel.scores).all())
    torch.testing.assert_close(sel.scores.double(), want, rtol=1e-5, atol=1e-4)
    top = set(sel.candidates[want.topk(10).indices].tolist())
    assert set(sel.negatives.tolist()) == top


def test_first_pass_keeps_the_first_k_distinct_draws_and_their_exposures():
    probs = torch.full((10,), 0.1)
    stream = torch.tensor([3, 3, 1, 3, 4, 1, 0, 0, 0, 0, 0, 0])
    first = draw_distinct(Stream(probs, stream), torch.zeros(2, 1), 3)
    assert first.ids.tolist() == [1, 3, 4]
    # the fourth distinct class (0) turns up at draw 7; before it: 3 x3, 1 x2, 4 x1
    assert first.exposures.tolist() == [7 - 2, 7 - 3, 7 - 1]
    assert first.outside_exposure == 5.0  # 4, the third distinct class, at draw 5
    assert first.exposure(torch.tensor([[4, 0], [9, 1]])).tolist() == [[6, 5], [5, 5]]
    first = draw_distinct(UniformSampler(6, padding_idx=2), torch.zeros(1, 1), 5)
    assert first.ids.tolist() == [0, 1, 3, 4, 5] and math.isinf(first.outside_exposure)
    assert bool(torch.isinf(first.exposures).all())
    assert first.log_inclusion(first.ids, torch.full((5,), math.log(0.2))).tolist() == [0.0] * 5


def test_first_pass_inclusion_probabilities_are_exact():
    """Over repeated first passes, ``1{c in S'} / pi_c`` averages 1 for every class (so the
    correction's estimate of the normaliser is unbiased) and ``1{c in S'} - pi_c`` averages 0,
    ``pi_c`` taken from the exposure inside ``S'`` or outside it."""
    presampler = UnigramSampler(torch.tensor([32.0, 16, 8, 4, 4, 2, 2, 1]), alpha=1.0)
    classes = torch.arange(8)
    log_q = presampler.log_prob(torch.zeros(1, 1), classes)
    torch.manual_seed(0)
    reps = 2000
    weights, residuals = torch.zeros(reps, 8), torch.zeros(reps, 8)
    for i in range(reps):
        first = draw_distinct(presampler, torch.zeros(1, 1), 3)
        pi = first.log_inclusion(classes, log_q).exp()
        member = torch.isin(classes, first.ids).float()
        weights[i], residuals[i] = member / pi, member - pi
    for values, want in ((weights, 1.0), (residuals, 0.0)):
        z_score = (values.mean(0) - want) / (values.std(0) / math.sqrt(reps))
        assert bool((z_score.abs() < 4).all()), z_score


def test_presample_size_is_capped_by_the_drawable_classes():
    head = TapasHead(20, 3, num_negatives=4, presample_factor=8, padding_idx=5)
    sel = head.select_negatives(torch.randn(3, 3))
    assert sorted(sel.candidates.tolist()) == [k for k in range(20) if k != 5]
    assert sel.negatives.numel() == 4 and math.isinf(sel.first_pass.outside_exposure)
    assert TapasHead(100, 3, num_negatives=4, presample_factor=2.5).num_candidates == 10


def test_each_shard_contributes_its_top_n_over_m():
    torch.manual_seed(5)
    head = randomize(TapasHead(400, 5, num_negatives=12, presample_factor=8, num_shards=4))
    assert torch.bincount(head.shard_of.long()).tolist() == [100] * 4
    z = torch.randn(9, 5)
    sel = head.select_negatives(z)
    cand_shard = head.shard_of[sel.candidates].long()
    assert bool((torch.bincount(cand_shard, minlength=4) >= 3).all())
    assert torch.bincount(head.shard_of[sel.negatives].long(), minlength=4).tolist() == [3] * 4
    want = brute_scores(head, z, sel.candidates)
    for j in range(4):
        in_j = cand_shard == j
        top = sel.candidates[in_j][want[in_j].topk(3).indices]
        assert set(top.tolist()) == set(sel.negatives[head.shard_of[sel.negatives] == j].tolist())
    # the partition is a buffer: a checkpoint restores it
    other = TapasHead(400, 5, num_negatives=12, presample_factor=8, num_shards=4)
    assert not torch.equal(other.shard_of, head.shard_of)
    other.load_state_dict(head.state_dict())
    assert torch.equal(other.shard_of, head.shard_of)


def test_sharding_misses_global_top_classes_crowded_into_one_shard():
    """Algorithm 2 is an approximation: when the batch's best candidates sit in one shard, that
    shard still gives only its top n / m, and weaker candidates of the other shards take the
    remaining places of the exact top n (brute force)."""
    n_classes, d, n, m = 40, 2, 4, 2
    head = TapasHead(n_classes, d, num_negatives=n, presample_factor=10, num_shards=m)
    assert head.num_candidates == n_classes  # S' is every class: the second pass alone decides
    in_0 = (head.shard_of == 0).nonzero().flatten()
    z = torch.eye(2)
    with torch.no_grad():
        head.weight.zero_()
        head.weight[in_0[:4], 0] = torch.tensor([8.0, 7.0, 6.0, 5.0])  # the best four: shard 0
        head.weight[:, 1] = torch.linspace(0.0, 1.0, n_classes)
    sel = head.select_negatives(z)
    scores = brute_scores(head, z, sel.candidates)
    exact = set(sel.candidates[scores.topk(n).indices].tolist())
    assert exact == set(in_0[:4].tolist())
    in_shard = head.shard_of[sel.candidates]
    per_shard = set()
    for j in range(m):
        ranked = sel.candidates[in_shard == j][scores[in_shard == j].argsort(descending=True)]
        per_shard |= set(ranked[: n // m].tolist())
    assert set(sel.negatives.tolist()) == per_shard
    assert set(sel.negatives.tolist()) & exact == set(in_0[:2].tolist())  # 3rd and 4th missed


def test_a_shard_short_of_candidates_contributes_all_it_has():
    head = TapasHead(40, 3, num_negatives=4, presample_factor=2, num_shards=2)
    in_0 = (head.shard_of == 0).nonzero().flatten()
    in_1 = (head.shard_of == 1).nonzero().flatten()
    stream = torch.cat([in_0[:7], in_1[:1], in_0[7:8]])  # S' is the first 8 distinct
    head.sampler = Stream(torch.full((40,), 1 / 40), stream)
    sel = head.select_negatives(torch.randn(2, 3))
    assert sel.negatives.numel() == 3 and in_1[0].item() in sel.negatives.tolist()


def test_logq_correction_subtracts_the_log_inclusion_probability_of_the_first_pass():
    probs = torch.softmax(torch.randn(30), 0)
    stream = torch.tensor([4, 9, 4, 17, 2, 9, 21, 8, 8, 11, 8, 8, 8, 8])
    head = randomize(
        TapasHead(30, 4, Stream(probs, stream), 3, presample_factor=2, convention="exact_positive")
    )
    z = torch.randn(5, 4)
    y = torch.tensor([4, 1, 2, 3, 0])
    sel = head.select_negatives(z)
    # k = 6: S' = {2, 4, 8, 9, 17, 21}; the seventh distinct class (11) turns up at draw 10, so
    # each class of S' has 10 draws less its own before it; a class outside S' has the 8 draws
    # up to the sixth distinct class (8)
    exposure = {2: 9, 4: 8, 8: 8, 9: 8, 17: 9, 21: 9, 0: 8, 1: 8, 3: 8}
    assert sel.candidates.tolist() == [2, 4, 8, 9, 17, 21]

    def log_pi(ids):
        m = torch.tensor([[exposure[c] for c in row] for row in ids.tolist()])
        return torch.log(-torch.expm1(m * torch.log1p(-probs.double()[ids]))).float()

    head.sampler.pos = 0
    logits = head.sampled_logits(z, y)
    o = z @ head.weight.T
    want_pos = o.gather(1, y[:, None])  # hits removed: the positive stays uncorrected
    want_neg = o[:, sel.negatives] - log_pi(sel.negatives[None])
    want_neg = want_neg.masked_fill(sel.negatives == y[:, None], -math.inf)
    torch.testing.assert_close(logits, torch.cat([want_pos, want_neg], 1))
    head.convention = "corrected_all"  # hits kept: the positive is corrected too
    head.sampler.pos = 0
    want_neg = o[:, sel.negatives] - log_pi(sel.negatives[None])
    want_pos = want_pos - log_pi(y[:, None])
    torch.testing.assert_close(head.sampled_logits(z, y), torch.cat([want_pos, want_neg], 1))


def test_selection_temperature_is_settable_and_validated():
    head = TapasHead(50, 3, num_negatives=5, presample_factor=4, selection_temperature=2.0)
    head.selection_temperature = 0.25
    assert head.selection_temperature == 0.25 and "selection_temperature=0.25" in repr(head)
    for bad in (0.0, -1.0, math.nan, math.inf, True):
        with pytest.raises(ValueError, match="selection_temperature"):
            head.selection_temperature = bad


def test_runs_under_bf16_autocast_and_skips_ignored_positions():
    head = TapasHead(64, 8, num_negatives=8, presample_factor=4)
    z = torch.randn(2, 5, 8, requires_grad=True)
    y = torch.randint(0, 64, (2, 5))
    y[0, :2] = -100
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = head(z, y)
    loss.backward()
    assert torch.isfinite(loss) and bool(torch.isfinite(z.grad).all())
    assert bool((z.grad[0, :2] == 0).all())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_queries_outside_autocast_train_like_their_fp32_values(dtype):
    counts = torch.arange(1.0, 65.0)
    presampler = UnigramSampler(counts, alpha=0.75)
    head = TapasHead(
        64,
        8,
        presampler,
        8,
        presample_factor=4,
        selection_temperature=0.5,
        convention="exact_positive",
    )
    randomize(head)
    z = torch.randn(10, 8).to(dtype).requires_grad_(True)
    y = torch.randint(0, 64, (10,))
    restart_draws(head, 1)
    want = head(z.detach().float(), y)
    restart_draws(head, 1)
    got = head(z, y)
    got.backward()
    assert got.dtype == torch.float32 and z.grad.dtype == dtype
    torch.testing.assert_close(got, want)
    assert bool(torch.isfinite(z.grad).all())


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="presample_factor"):
        TapasHead(100, 4, num_negatives=8, presample_factor=0.5)
    with pytest.raises(ValueError, match="presample_factor"):
        TapasHead(100, 4, num_negatives=8, presample_factor=math.nan)
    with pytest.raises(ValueError, match="selection_temperature"):
        TapasHead(100, 4, num_negatives=8, selection_temperature=0.0)
    with pytest.raises(ValueError, match="convention must be one of"):
        TapasHead(100, 4, num_negatives=8, convention="tensorflow")
    with pytest.raises(ValueError, match="num_negatives must be <= 99"):
        TapasHead(100, 4, num_negatives=100, padding_idx=3)
    with pytest.raises(ValueError, match="num_negatives"):
        TapasHead(100, 4, num_negatives=0)
    with pytest.raises(ValueError, match="num_shards must divide"):
        TapasHead(100, 4, num_negatives=8, num_shards=3)
    with pytest.raises(ValueError, match="num_shards"):
        TapasHead(100, 4, num_negatives=8, num_shards=0)
    with pytest.raises(ValueError, match="query-independent"):
        TapasHead(100, 4, num_negatives=8, sampler=PerQueryOnly(100))
    with pytest.raises(ValueError, match="num_classes"):
        TapasHead(100, 4, num_negatives=8, sampler=UniformSampler(99))


def test_an_overly_skewed_presampler_fails_clearly():
    probs = torch.tensor([1.0 - 9e-12] + [1e-12] * 9)
    presampler = UnigramSampler(probs, alpha=1.0, floor=1e-12)
    head = TapasHead(10, 2, num_negatives=3, presample_factor=2, sampler=presampler)
    with pytest.raises(RuntimeError, match="distinct classes"):
        head(torch.randn(2, 2), torch.tensor([0, 1]))
