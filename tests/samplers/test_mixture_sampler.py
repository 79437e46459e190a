"""MixtureSampler: stratified draws, the mixture's log-probability, and a consistent head. What
every proposal must do (normalised, draws that follow log_q, padding, state dict, growth, bad
input) is in ``test_sampler_contract.py``, for a mixture of MIDX and log-uniform and one of
uniform and unigram."""

import math

import pytest
import torch

from lightning_sampled.heads import SampledSoftmaxHead
from lightning_sampled.samplers import MixtureSampler, UniformSampler, UnigramSampler

N = 50


def skewed_mixture(weights=(1.0, 3.0), padding_idx=None):
    counts = torch.arange(N, 0, -1).double() ** 2
    return MixtureSampler(
        [
            UniformSampler(N, padding_idx=padding_idx),
            UnigramSampler(counts, padding_idx=padding_idx),
        ],
        weights,
    )


def test_log_prob_is_the_weighted_mixture_and_sums_to_one():
    sampler = skewed_mixture(padding_idx=7)
    z = torch.zeros(2, 3)
    ids = torch.arange(N)
    uniform, unigram = sampler.components
    want = torch.log(0.25 * uniform.log_prob(z, ids).exp() + 0.75 * unigram.log_prob(z, ids).exp())
    got = sampler.log_prob(z, ids)
    torch.testing.assert_close(got, want)
    assert got[7] == -math.inf
    torch.testing.assert_close(got.exp().sum(), torch.tensor(1.0))


@pytest.mark.parametrize("shared", [False, True])
def test_draws_are_stratified(shared):
    sampler = skewed_mixture()
    z = torch.zeros(3, 4)
    m = 8000  # 2,000 uniform and 6,000 unigram draws
    assert sampler.draws_per_component(m) == [2000, 6000]
    draw = sampler.sample(z, m, shared=shared, generator=torch.Generator().manual_seed(0))
    rows = draw.ids[None] if shared else draw.ids
    # the first 2,000 draws of each row are the uniform component's: no unigram skew there
    head = torch.bincount(rows[0, :2000], minlength=N).double()
    assert head[:10].sum() < 600  # unigram would put ~2/3 of them on the first 10 classes


def test_draws_per_component_sum_to_m_and_follow_the_weights():
    sampler = MixtureSampler([UniformSampler(N), UniformSampler(N), UniformSampler(N)], [1, 1, 2])
    for m in (1, 2, 3, 7, 20, 101):
        counts = sampler.draws_per_component(m)
        assert sum(counts) == m
        assert all(abs(c - w * m) < 1 for c, w in zip(counts, sampler.weights, strict=True))
    draw = sampler.sample(torch.zeros(2, 1), 7)
    assert draw.ids.shape == (2, 7)
    # shares 2/7, 2/7, 3/7 differ from the weights: the draws report the shares they used
    shares = [2 / 7, 2 / 7, 3 / 7]
    want = torch.logsumexp(
        torch.stack(
            [
                c.log_prob(torch.zeros(2, 1), draw.ids) + math.log(s)
                for c, s in zip(sampler.components, shares, strict=True)
            ]
        ),
        0,
    )
    torch.testing.assert_close(draw.log_q, want)


def test_sampled_head_with_a_mixture_is_consistent_for_likely_targets():
    counts = torch.tensor([600, 250, 100, 50])
    y = torch.repeat_interleave(torch.arange(4), counts)
    z = torch.ones(y.numel(), 1)
    errors = []
    for m in (10, 1000):
        sampler = MixtureSampler(
            [UniformSampler(4), UnigramSampler(torch.tensor([1.0, 2.0, 3.0, 4.0]))]
        )
        head = SampledSoftmaxHead(  # the 1,000 in-batch draws alone would be nearly exact
            4, 1, sampler, m, bias=True, weight=torch.nn.Parameter(torch.zeros(4, 1)),
            in_batch_negatives=False,
        )  # fmt: skip
        (full,) = torch.autograd.grad(head.full_loss(z, y), head.bias)
        torch.manual_seed(3)
        total = sum(torch.autograd.grad(head(z, y), head.bias)[0] for _ in range(4)) / 4
        errors.append(float((total - full).norm() / full.norm()))
    assert errors[1] < errors[0] and errors[1] <= 0.05, errors


@pytest.mark.parametrize(
    ("components", "weights", "match"),
    [
        ([UniformSampler(N)], None, "two or more"),
        ([UniformSampler(N), "uniform"], None, "two or more"),
        ([UniformSampler(N), UniformSampler(N + 1)], None, "share num_classes"),
        ([UniformSampler(N), UniformSampler(N, padding_idx=0)], None, "share num_classes"),
        ([UniformSampler(N), UniformSampler(N)], [1.0], "weights must be 2"),
        ([UniformSampler(N), UniformSampler(N)], [1.0, 0.0], "positive"),
        ([UniformSampler(N), UniformSampler(N)], [1.0, math.nan], "positive"),
    ],
)
def test_bad_arguments(components, weights, match):
    with pytest.raises(ValueError, match=match):
        MixtureSampler(components, weights)
