"""Draws from the used rows of per-query conditional tables, against a per-draw brute force."""

import pytest
import torch
from draw_law import chi_square_pvalue

from lightning_sampled.samplers import conditional_draw
from lightning_sampled.samplers.conditional_draw import draw_from_used_rows


def brute_force(counts, weights, rows, u):
    """Each draw's own row ``counts[r] * weights[b]`` searched for ``u * total``."""
    out = torch.empty_like(rows)
    for b in range(rows.shape[0]):
        for m in range(rows.shape[1]):
            cdf = torch.cumsum(counts[rows[b, m]].double() * weights[b], 0)
            out[b, m] = torch.searchsorted(cdf, u[b, m].double() * cdf[-1], right=True)
    return out


def case(batch, draws, k, seed):
    """Sparse row weights (zero columns, one row with a single positive column), query weights
    with zero columns, rows drawn from a peaked distribution, and uniforms of exactly 0."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, 3, (k, k), generator=g).float()
    counts[:, k // 2] += 1.0  # every row has mass
    counts[0] = 0.0
    counts[0, k - 1] = 5.0  # a row with one drawable column
    weights = torch.rand(batch, k, generator=g, dtype=torch.float64).square()
    weights[:, :2] = 0.0  # columns no query can draw, at the start of every row
    weights[:, k // 2] += 0.1
    weights[:, k - 1] += 0.1
    rows = torch.multinomial(torch.rand(batch, k, generator=g) ** 4, draws, True, generator=g)
    u = torch.rand(batch, draws, generator=g)
    u[:, 0] = 0.0  # lands exactly on the empty intervals of the first columns
    return counts, weights, rows, u


@pytest.mark.parametrize("k", [2, 5, 8, 13])
@pytest.mark.parametrize("entries_per_chunk", [None, 1])
@pytest.mark.parametrize("draws", [30, 3])  # M >= K: each query's whole table; M < K: per draw
@pytest.mark.parametrize("distinct", [True, False], ids=["distinct_rows", "fixed_rows"])
def test_equals_a_per_draw_search_of_each_row(k, entries_per_chunk, draws, distinct, monkeypatch):
    """Both ways to build the rows (the fixed rows are CUDA's and torch.compile's)."""
    if entries_per_chunk is not None:  # one query per chunk: the chunk loop is exercised
        monkeypatch.setattr(conditional_draw, "_ENTRIES_PER_CHUNK", entries_per_chunk)
    monkeypatch.setattr(conditional_draw, "host_syncs_are_free", lambda rows: distinct)
    counts, weights, rows, u = case(batch=9, draws=draws, k=k, seed=k)
    drawn = draw_from_used_rows(counts, weights, rows, u)
    assert torch.equal(drawn, brute_force(counts, weights, rows, u))
    mass = counts[rows, drawn].double() * weights.gather(1, drawn)
    assert bool((mass > 0).all())


def test_frequencies_pass_chi_square_against_the_row():
    k, draws = 6, 60_000
    counts, weights, _, _ = case(batch=2, draws=1, k=k, seed=0)
    g = torch.Generator().manual_seed(1)
    rows = torch.tensor([[1] * draws, [3] * draws])
    drawn = draw_from_used_rows(counts, weights, rows, torch.rand(2, draws, generator=g))
    for b in range(2):
        row = counts[rows[b, 0]].double() * weights[b]
        assert int((row > 0).sum()) >= 3
        assert chi_square_pvalue(drawn[b], row) > 1e-3
