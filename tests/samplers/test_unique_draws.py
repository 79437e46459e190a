"""``unique=True`` on the static proposals: ``M`` distinct classes drawn as TensorFlow's unique
samplers draw them (with replacement until ``M`` distinct came up), against a brute-force loop
over the same stream, the exact inclusion probabilities of a four-class proposal, and the
expected-count correction ``1 - (1 - q)^tries``."""

import math

import pytest
import torch

from lightning_sampled.samplers import (
    LogUniformSampler,
    MixtureSampler,
    UniformSampler,
    UnigramSampler,
)
from lightning_sampled.samplers.distinct import distinct_draws, expected_count_log_q

Q = torch.tensor([0.6, 0.25, 0.1, 0.05], dtype=torch.float64)  # a likely class: the weak regime


def scripted(streams: torch.Tensor):
    """A ``draw(shape)`` that hands out each row's next values of ``streams`` ``[B, L]``."""
    used = [0]

    def draw(shape):
        start, count = used[0], shape[-1]
        used[0] += count
        return streams[:, start : start + count].reshape(shape)

    return draw


def brute_force(stream: list[int], m: int) -> tuple[list[int], int]:
    seen: list[int] = []
    for tries, value in enumerate(stream, start=1):
        if value not in seen:
            seen.append(value)
            if len(seen) == m:
                return seen, tries
    raise AssertionError("the stream is too short")


@pytest.mark.parametrize("m", [1, 3, 6])
def test_distinct_draws_are_the_first_m_distinct_of_the_stream_and_count_its_tries(m):
    g = torch.Generator().manual_seed(m)
    streams = torch.randint(8, (5, 400), generator=g)
    ids, tries = distinct_draws(scripted(streams), (5, m))
    for row in range(5):
        want_ids, want_tries = brute_force(streams[row].tolist(), m)
        assert ids[row].tolist() == want_ids
        assert tries[row].item() == want_tries
    one, one_tries = distinct_draws(scripted(streams[:1]), (m,))
    assert one.tolist() == brute_force(streams[0].tolist(), m)[0] and one_tries.dim() == 0


def test_inclusion_probabilities_are_those_of_drawing_until_two_distinct():
    sampler = UnigramSampler(Q, alpha=1.0, floor=1e-12, unique=True)
    draws = sampler.sample(torch.zeros(40_000, 1), 2, generator=torch.Generator().manual_seed(0))
    assert (draws.ids[:, 0] != draws.ids[:, 1]).all()
    included = torch.stack([(draws.ids == j).any(dim=1) for j in range(4)], 1).double().mean(0)
    # P(j among the first two distinct) = q_j + sum_{i != j} q_i q_j / (1 - q_i)
    exact = torch.stack(
        [Q[j] + sum(Q[i] * Q[j] / (1 - Q[i]) for i in range(4) if i != j) for j in range(4)]
    )
    sigma = (exact * (1 - exact) / 40_000).sqrt()
    assert ((included - exact).abs() < 4 * sigma).all(), (included, exact)


def test_mean_tries_is_one_plus_the_expected_wait_for_a_second_class():
    sampler = UnigramSampler(Q, alpha=1.0, floor=1e-12)
    g = torch.Generator().manual_seed(1)
    _, tries = distinct_draws(
        lambda s: sampler.sample(torch.zeros(s[0], 1), s[1], generator=g).ids, (40_000, 2)
    )
    want = 1 + float(sum(Q[i] / (1 - Q[i]) for i in range(4)))  # first i, then Geometric(1 - q_i)
    assert abs(tries.mean().item() - want) < 4 * tries.std().item() / math.sqrt(40_000)


@pytest.mark.parametrize(
    "make",
    [
        lambda: UniformSampler(30, padding_idx=2, unique=True),
        lambda: LogUniformSampler(30, unique=True),
        lambda: UnigramSampler(torch.arange(1.0, 31.0), unique=True),
    ],
    ids=["uniform", "log_uniform", "unigram"],
)
@pytest.mark.parametrize("shared", [True, False])
def test_each_class_is_scored_by_its_expected_count_in_the_draws_tries(make, shared):
    sampler = make()
    m = 12
    z = torch.zeros(3, 1)
    targets = torch.tensor([0, 5, 29]) if shared else torch.tensor([[0], [5], [29]])
    sample, target_log_q = sampler.sample_and_score(
        z, m, targets, shared=shared, generator=torch.Generator().manual_seed(2)
    )
    rows = sample.ids.reshape(-1, m)
    assert all(len(set(r.tolist())) == m for r in rows)
    assert sampler.padding_idx is None or not (sample.ids == sampler.padding_idx).any()
    for row, row_log_q in zip(rows, sample.log_q.reshape(-1, m), strict=True):
        per_draw = sampler.log_prob(z, row).double()
        # recover tries from the first class, then every class and the targets must agree
        expected = row_log_q.double().exp() * m
        tries = torch.log1p(-expected[0]) / torch.log1p(-per_draw[0].exp())
        assert abs(tries - tries.round()) < 1e-3 and tries.round() >= m
        torch.testing.assert_close(row_log_q, expected_count_log_q(per_draw, tries.round(), m))
    if shared:
        torch.testing.assert_close(
            target_log_q,
            expected_count_log_q(sampler.log_prob(z, targets), tries.round(), m),
        )


def test_unique_draws_are_refused_where_they_cannot_be_made():
    with pytest.raises(ValueError, match="distinct classes out of 9"):
        UniformSampler(10, padding_idx=0, unique=True).sample(torch.zeros(2, 1), 10)
    tiny = UnigramSampler(torch.tensor([1.0, 1e-9, 1e-9]), alpha=1.0, floor=1e-12, unique=True)
    with pytest.raises(ValueError, match="did not come up"):
        tiny.sample(torch.zeros(1, 1), 3, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="unique must be a bool"):
        UniformSampler(10, unique=1)
    with pytest.raises(ValueError, match="with replacement"):
        MixtureSampler([UniformSampler(10, unique=True), LogUniformSampler(10)])
    assert UnigramSampler(torch.ones(10), unique=True).restricted(torch.arange(5)).unique
    assert UniformSampler(10, unique=True).restricted(torch.arange(5)).unique
