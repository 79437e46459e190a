"""Uniform, unigram and log-uniform proposals: their closed forms, padding at either end, the
alias table. What every proposal must do is in ``test_sampler_contract.py``."""

import math

import pytest
import torch
from draw_law import chi_square_pvalue

from lightning_sampled.samplers import LogUniformSampler, UniformSampler, UnigramSampler
from lightning_sampled.samplers.static import alias_draw, alias_table

N = 37


def counts():
    g = torch.Generator().manual_seed(3)
    c = torch.randint(0, 500, (N,), generator=g).double()
    c[[4, 9]] = 0.0  # never-seen classes get the floor
    return c


SAMPLERS = {
    "uniform": lambda pad: UniformSampler(N, padding_idx=pad),
    "log_uniform": lambda pad: LogUniformSampler(N, padding_idx=pad),
    "unigram": lambda pad: UnigramSampler(counts(), alpha=0.6, padding_idx=pad),
}


@pytest.mark.parametrize("name", SAMPLERS)
@pytest.mark.parametrize("padding_idx", [0, N - 1])
def test_padding_at_either_end_is_never_drawn_and_the_draws_follow_log_q(name, padding_idx):
    """The contract's padding class is in the middle; here the first and the last class."""
    sampler = SAMPLERS[name](padding_idx)
    z = torch.zeros(50, 3)
    g = torch.Generator().manual_seed(1234)
    draws = torch.cat([sampler.sample(z, 400, generator=g).ids.reshape(-1) for _ in range(10)])
    probs = sampler.log_prob(z, torch.arange(N)).exp().double()
    assert math.isclose(float(probs.sum()), 1.0, rel_tol=1e-6)
    assert probs[padding_idx] == 0 and not (draws == padding_idx).any()
    assert chi_square_pvalue(draws, probs) > 1e-3


def test_unigram_is_the_squashed_floored_frequency():
    c = counts()
    alpha, floor = 0.6, 0.01
    sampler = UnigramSampler(c, alpha=alpha, floor=floor)
    weights = torch.clamp((c / c.sum()) ** alpha, min=floor)
    want = (weights / weights.sum()).float()
    torch.testing.assert_close(sampler.log_prob(torch.zeros(1, 2), torch.arange(N)).exp(), want)


def test_unigram_default_floor_is_a_class_seen_once():
    c = counts()
    sampler = UnigramSampler(c, alpha=0.75)
    q = sampler.log_prob(torch.zeros(1, 2), torch.arange(N)).exp()
    seen_once = (1.0 / c.sum()) ** 0.75
    ratio = q[4] / q[c.argmax()]
    assert math.isclose(float(ratio), float(seen_once / (c.max() / c.sum()) ** 0.75), rel_tol=1e-5)


def test_log_uniform_closed_form():
    sampler = LogUniformSampler(N)
    r = torch.arange(N).double()
    want = ((torch.log(r + 2) - torch.log(r + 1)) / math.log(N + 1)).float()
    torch.testing.assert_close(sampler.log_prob(torch.zeros(1, 2), torch.arange(N)).exp(), want)


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: UniformSampler(0), "num_classes"),
        (lambda: UniformSampler(5, padding_idx=5), "padding_idx"),
        (lambda: UnigramSampler(torch.tensor([1.0, -2.0, 3.0])), "non-negative.*-2"),
        (lambda: UnigramSampler(torch.tensor([1.0, float("nan")])), "finite"),
        (lambda: UnigramSampler(torch.zeros(4)), "positive sum"),
        (lambda: UnigramSampler(torch.ones(2, 2)), "1-D"),
        (lambda: UnigramSampler(torch.ones(4), alpha=1.5), "alpha"),
        (lambda: UnigramSampler(torch.ones(4), floor=0.0), "floor"),
    ],
)
def test_constructors_reject_bad_arguments(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def hard_distributions() -> dict[str, torch.Tensor]:
    """Distributions where an alias table can go wrong: all classes equal (every cell exactly
    full), zero-probability classes, one class holding nearly all the mass beside hundreds of
    tiny ones, a likely class (.6) among few, a heavy class used up exactly where a light one
    starts, a single class, and a heavy-tailed table where heavy classes turn light after
    serving many cells."""
    g = torch.Generator().manual_seed(0)
    gaps = torch.rand(500, dtype=torch.float64, generator=g)
    gaps[::3] = 0.0
    zipf = 1.0 / torch.arange(1, 20_001, dtype=torch.float64) ** 1.1
    return {
        "uniform": torch.full((1000,), 1e-3, dtype=torch.float64),
        "zeros": gaps / gaps.sum(),
        "crowded": torch.tensor([1.0 - 999e-12] + [1e-12] * 999, dtype=torch.float64),
        "likely": torch.tensor([0.6, 0.25, 0.1, 0.05], dtype=torch.float64),
        # the first heavy class is used up exactly where the second light class starts
        "tie": torch.tensor([0.375, 0.375, 0.125, 0.125], dtype=torch.float64),
        "single": torch.ones(1, dtype=torch.float64),
        "zipf": zipf[torch.randperm(zipf.numel(), generator=g)] / zipf.sum(),
    }


@pytest.mark.parametrize("name", list(hard_distributions()))
def test_alias_table_gives_every_class_its_probability(name):
    probs = hard_distributions()[name]
    n = probs.numel()
    threshold, alias = alias_table(probs)
    assert bool(((threshold >= 0) & (threshold <= 1)).all())
    mass = (threshold / n).index_add(0, alias, (1.0 - threshold) / n)
    torch.testing.assert_close(mass, probs, rtol=0, atol=1e-12)
    reachable = (threshold > 0) | torch.isin(torch.arange(n), alias[threshold < 1])
    assert not bool(reachable[probs == 0].any())


@pytest.mark.parametrize("name", ["zeros", "likely", "zipf"])
def test_alias_draws_on_a_fine_grid_match_the_probabilities(name):
    """Uniforms on a grid of 64 points per cell, through the sampler's own packed rows: every
    class's share of the grid is its probability within the grid's resolution (one point per
    cell the class has a part of)."""
    probs = hard_distributions()[name]
    sampler = UnigramSampler(probs, alpha=1.0, floor=1e-300)
    n = probs.numel()
    u = (torch.arange(64 * n, dtype=torch.float64) + 0.5) / (64 * n)
    ids, log_q = alias_draw(sampler.alias_rows, u)
    share = torch.bincount(ids, minlength=n).double() / u.numel()
    aliases = sampler.alias_rows[:, 1].long()[sampler.alias_rows[:, 0] < 1]
    cells = 1 + torch.bincount(aliases, minlength=n)
    error = (share - sampler.log_probs.double().exp()).abs()
    assert bool((error <= (cells + 1) / u.numel()).all()), float(error.max())
    torch.testing.assert_close(log_q.float(), sampler.log_probs[ids])


def test_loading_a_state_dict_rebuilds_the_alias_table():
    source = UnigramSampler(torch.arange(1.0, 38.0), alpha=1.0)
    target = UnigramSampler(torch.arange(37.0, 0.0, -1.0), alpha=1.0)
    state = source.state_dict()
    assert list(state) == ["log_probs", "_extra_state"]  # the table and the draw stream
    target.load_state_dict(state)
    assert torch.equal(target.alias_rows, source.alias_rows)
    legacy = {**state, "cdf": torch.linspace(0.0, 1.0, 37, dtype=torch.float64)}
    target.load_state_dict(
        legacy
    )  # written before the alias table: its cumulative table is ignored
    with pytest.raises(RuntimeError, match="Unexpected key.*other"):
        target.load_state_dict({**state, "other": torch.zeros(1)})
