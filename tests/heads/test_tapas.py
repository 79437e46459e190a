"""TapasHead: the two passes of Algorithm 1, Algorithm 2's shards, and the loss on top of them."""

import math

import pytest
import torch
import torch.nn.functional as F
from fake_samplers import PerQueryOnly, Stream

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
    return torch.log(torch.exp(logits / head.temperature).sum(0))


def grads(head, z, y):
    head.zero_grad()
    z = z.clone().requires_grad_(True)
    loss = head(z, y)
    loss.backward()
    return loss.detach(), z.grad, head.weight.grad.clone()


def test_r_equal_1_without_correction_is_sampled_softmax_on_the_same_draws():
    n_classes, d, n = 50, 6, 8
    draws = torch.randperm(n_classes)[:n]
    uniform = torch.full((n_classes,), 1.0 / n_classes)
    tapas = randomize(TapasHead(n_classes, d, n, 1, 0.3, Stream(uniform, draws), bias=True))
    ssm = SampledSoftmaxHead(
        n_classes,
        d,
        Stream(uniform, draws),
        n,
        shared_negatives=True,
        weight=tapas.weight,
        bias=True,
        convention="tensorflow",  # under a uniform proposal: every logit shifted alike
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
    neg = o[:, draws].masked_fill(draws == y[:, None], -math.inf)
    logits = torch.cat([o.gather(1, y[:, None]), neg], 1)
    want = F.cross_entropy(logits, torch.zeros(10, dtype=torch.long))
    torch.testing.assert_close(tapas(z, y), want)


def test_r_equal_1_matches_sampled_softmax_with_seeded_draws():
    n_classes, d, n = 5000, 4, 6
    tapas = TapasHead(n_classes, d, n, 1, 1.0)
    ssm = SampledSoftmaxHead(
        n_classes,
        d,
        num_negatives=n,
        shared_negatives=True,
        weight=tapas.weight,
        convention="tensorflow",  # uniform proposal: every logit shifted alike, as uncorrected
    )
    z = torch.randn(7, d)
    y = torch.randint(0, n_classes, (7,))
    torch.manual_seed(11)
    assert UniformSampler(n_classes).sample(z, n, shared=True).ids.unique().numel() == n
    torch.manual_seed(11)
    got = tapas(z, y)
    torch.manual_seed(11)
    torch.testing.assert_close(got, ssm(z, y))


@pytest.mark.parametrize("tau", [0.7, 1e-3])
def test_second_pass_is_the_top_n_of_the_first_by_batch_score(tau):
    counts = torch.arange(1, 301).float()
    head = TapasHead(
        300,
        6,
        num_negatives=10,
        presample_factor=5,
        temperature=tau,
        presampler=UnigramSampler(counts, alpha=0.5, padding_idx=0),
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


def test_first_pass_keeps_the_first_k_distinct_draws_and_counts_them():
    probs = torch.full((10,), 0.1)
    stream = torch.tensor([3, 3, 1, 3, 4, 1, 0, 0, 0, 0, 0, 0])
    ids, num_draws = draw_distinct(Stream(probs, stream), torch.zeros(2, 1), 3)
    assert sorted(ids.tolist()) == [1, 3, 4]
    assert num_draws == 5.0  # 4 is the third distinct class, at draw 5
    ids, num_draws = draw_distinct(UniformSampler(6, padding_idx=2), torch.zeros(1, 1), 5)
    assert sorted(ids.tolist()) == [0, 1, 3, 4, 5] and math.isinf(num_draws)


def test_presample_size_is_capped_by_the_drawable_classes():
    head = TapasHead(20, 3, num_negatives=4, presample_factor=8, padding_idx=5)
    sel = head.select_negatives(torch.randn(3, 3))
    assert sorted(sel.candidates.tolist()) == [k for k in range(20) if k != 5]
    assert sel.negatives.numel() == 4 and math.isinf(sel.num_draws)
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


def test_a_shard_short_of_candidates_contributes_all_it_has():
    head = TapasHead(40, 3, num_negatives=4, presample_factor=2, num_shards=2)
    in_0 = (head.shard_of == 0).nonzero().flatten()
    in_1 = (head.shard_of == 1).nonzero().flatten()
    stream = torch.cat([in_0[:7], in_1[:1]])
    head.sampler = Stream(torch.full((40,), 1 / 40), stream)
    sel = head.select_negatives(torch.randn(2, 3))
    assert sel.negatives.numel() == 3 and in_1[0].item() in sel.negatives.tolist()


def test_logq_correction_subtracts_the_log_expected_count_of_the_first_pass():
    probs = torch.softmax(torch.randn(30), 0)
    stream = torch.tensor([4, 9, 4, 17, 2, 9, 21, 8, 8, 8, 8, 8])
    head = randomize(TapasHead(30, 4, 3, 2, 1.0, Stream(probs, stream), logq_correction=True))
    z = torch.randn(5, 4)
    y = torch.tensor([4, 1, 2, 3, 0])
    sel = head.select_negatives(z)
    assert sel.num_draws == 8.0  # k = 6: the sixth distinct class (8) turns up at draw 8
    head.sampler.pos = 0
    logits = head.sampled_logits(z, y)
    o = z @ head.weight.T
    count = lambda ids: -torch.expm1(8.0 * torch.log1p(-probs.double()[ids])).float()  # noqa: E731
    want_pos = o.gather(1, y[:, None])  # hits removed: the positive stays uncorrected
    want_neg = o[:, sel.negatives] - count(sel.negatives).log()
    want_neg = want_neg.masked_fill(sel.negatives == y[:, None], -math.inf)
    torch.testing.assert_close(logits, torch.cat([want_pos, want_neg], 1))
    head.remove_accidental_hits = False  # hits kept: the positive is corrected too
    head.sampler.pos = 0
    want_neg = o[:, sel.negatives] - count(sel.negatives).log()
    want_pos = want_pos - count(y)[:, None].log()
    torch.testing.assert_close(head.sampled_logits(z, y), torch.cat([want_pos, want_neg], 1))


def test_temperature_is_settable_and_validated():
    head = TapasHead(50, 3, num_negatives=5, presample_factor=4, temperature=2.0)
    head.temperature = 0.25
    assert head.temperature == 0.25 and "temperature=0.25" in repr(head)
    for bad in (0.0, -1.0, math.nan, math.inf, True):
        with pytest.raises(ValueError, match="temperature"):
            head.temperature = bad


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


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="presample_factor"):
        TapasHead(100, 4, num_negatives=8, presample_factor=0.5)
    with pytest.raises(ValueError, match="presample_factor"):
        TapasHead(100, 4, num_negatives=8, presample_factor=math.nan)
    with pytest.raises(ValueError, match="temperature"):
        TapasHead(100, 4, num_negatives=8, temperature=0.0)
    with pytest.raises(ValueError, match="num_negatives must be <= 99"):
        TapasHead(100, 4, num_negatives=100, padding_idx=3)
    with pytest.raises(ValueError, match="num_negatives"):
        TapasHead(100, 4, num_negatives=0)
    with pytest.raises(ValueError, match="num_shards must divide"):
        TapasHead(100, 4, num_negatives=8, num_shards=3)
    with pytest.raises(ValueError, match="num_shards"):
        TapasHead(100, 4, num_negatives=8, num_shards=0)
    with pytest.raises(ValueError, match="query-independent"):
        TapasHead(100, 4, num_negatives=8, presampler=PerQueryOnly(100))
    with pytest.raises(ValueError, match="num_classes"):
        TapasHead(100, 4, num_negatives=8, presampler=UniformSampler(99))


def test_an_overly_skewed_presampler_fails_clearly():
    probs = torch.tensor([1.0 - 9e-12] + [1e-12] * 9)
    presampler = UnigramSampler(probs, alpha=1.0, floor=1e-12)
    head = TapasHead(10, 2, num_negatives=3, presample_factor=2, presampler=presampler)
    with pytest.raises(RuntimeError, match="distinct classes"):
        head(torch.randn(2, 2), torch.tensor([0, 1]))
