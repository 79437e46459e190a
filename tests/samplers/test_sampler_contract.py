"""The sampler contract (DESIGN.md, "Samplers"; ``lightning_sampled/samplers/base.py``), tested
once for every proposal (issue 48, item 3).

A new proposal is added by one line in :data:`SAMPLERS`: a factory ``make(num_classes,
padding_idx)`` and what it offers beyond the base (a restriction to a shard of the classes, an
index that refuses bad class rows). Every check runs with and without a padding class
(:data:`CASES`); samplers with an index are refreshed from the fixed :data:`TABLE`, MIDX-Learn's
codewords are moved by a few steps of its auxiliary loss and the index reassigned with them.

The checks, each for every sampler:

1. ``log_prob`` over all classes is normalised per query and gives the padding class ``-inf``;
2. ``log_q`` of :meth:`~Sampler.sample` and the scores of :meth:`~Sampler.sample_and_score` are
   ``log_prob`` of the same ids, and both methods draw alike from one generator seed;
3. draws follow ``exp(log_prob)``: a fixed-seed chi-square test per query (and for shared
   draws), which the same draws fail against a distribution 10% off, or another query's;
4. the padding class is never drawn, whichever way the draws are made;
5. a fresh sampler that loads the state dict draws the same ids, from its own stream and from a
   generator, and scores the same ``log_prob``;
6. ``restricted(ids)`` (split tables) is a proposal over those rows: the renormalised restriction
   where the proposal is one of the rows alone, an index of its own where it is not, refused by
   name where it has none; its draws stay within the rows;
7. ``add_classes`` grows the support, ``log_prob`` normalised over the new ``N``, and
   ``check_class_rows`` refuses NaN rows where there is an index to build from them;
8. bad input is refused with an error that names it.

Draw counts: :data:`M` draws per query give a chi-square test on 60 classes the power to see a
10% error in every class's probability (it fails at p < 1e-6) while a correct law passes at
p > 1e-3 for the fixed seeds here. A mixture draws ``round(w_c M)`` from each component and
reports those shares: with weights 1 : 3, draw counts divisible by 4 make them the weights, so
that ``log_q`` of its draws equals ``log_prob``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from draw_law import chi_square_pvalue

from lightning_sampled.samplers import (
    LogUniformSampler,
    MIDXSampler,
    MixtureSampler,
    UniformSampler,
    UnigramSampler,
)
from lightning_sampled.samplers.base import Sampler

N, D = 60, 8  # classes, embedding size
PAD = 7  # the padding class of the cases that set one (not 0: an off-by-one shows)
B = 2  # queries
M = 20_000  # draws per query of the tests of the law of the draws
NEW = 6  # classes that add_classes adds
K = 24  # rows of a restriction

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def rows(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, D, generator=torch.Generator().manual_seed(seed))


TABLE = rows(N + NEW, 0)  # the class table is TABLE[:N]; TABLE is the table after add_classes
Z = rows(B, 1)


def counts(n: int) -> torch.Tensor:
    """Skewed class counts with never-seen classes (which get the unigram's floor)."""
    c = torch.randint(0, 500, (n,), generator=torch.Generator().manual_seed(3)).double()
    c[[4, 9]] = 0.0
    return c


def midx(quantizer: str, mode: str, learnable: bool = False) -> Callable[..., Sampler]:
    return lambda n, pad: MIDXSampler(
        n, 4, quantizer, mode, learnable, dim=D, padding_idx=pad, kmeans_iters=5
    )


@dataclass(frozen=True)
class Spec:
    """One sampler of the contract.

    Attributes:
        make: ``make(num_classes, padding_idx) -> Sampler``, not yet refreshed.
        restriction: what ``restricted(ids)`` gives: ``"renormalised"``, the proposal's own
            probabilities of the rows renormalised; ``"rebuilt"``, a proposal of the same kind
            with an index of its own built from the rows (MIDX's fast proposal is not one of the
            rows alone: its cells depend on every row); ``None``: refused (``ValueError``).
        index: the sampler builds an index from the class table, so that it refuses class rows
            it could not index (``check_class_rows``); samplers without one take any rows.
    """

    make: Callable[[int, int | None], Sampler]
    restriction: str | None = "renormalised"
    index: bool = False


# fmt: off
SAMPLERS: dict[str, Spec] = {
    "uniform": Spec(lambda n, pad: UniformSampler(n, padding_idx=pad)),
    "unigram": Spec(lambda n, pad: UnigramSampler(counts(n), alpha=0.75, padding_idx=pad)),
    "log_uniform": Spec(lambda n, pad: LogUniformSampler(n, padding_idx=pad)),
    "midx_pq_fast": Spec(midx("pq", "fast"), "rebuilt", index=True),
    "midx_pq_exact": Spec(midx("pq", "exact"), index=True),
    "midx_rq_fast": Spec(midx("rq", "fast"), "rebuilt", index=True),
    "midx_rq_exact": Spec(midx("rq", "exact"), index=True),
    "midx_learn_rq_fast": Spec(midx("rq", "fast", learnable=True), None, index=True),
    "midx_learn_pq_exact": Spec(midx("pq", "exact", learnable=True), None, index=True),
    "mixture_midx_log_uniform": Spec(lambda n, pad: MixtureSampler([midx("rq", "fast")(n, pad), LogUniformSampler(n, padding_idx=pad)], [1, 3]), None, index=True),  # noqa: E501
    "mixture_uniform_unigram": Spec(lambda n, pad: MixtureSampler([UniformSampler(n, padding_idx=pad), UnigramSampler(counts(n), padding_idx=pad)], [1, 3]), None),  # noqa: E501
}
# fmt: on

CASES = [
    pytest.param(name, pad, id=name if pad is None else f"{name}-pad")
    for name in SAMPLERS
    for pad in (None, PAD)
]
PADDED = [pytest.param(name, id=name) for name in SAMPLERS]


def build(name: str, pad: int | None, table: torch.Tensor | None = None, seed: int = 0) -> Sampler:
    """Sampler ``name`` over ``N`` classes, refreshed from ``table`` (default ``TABLE[:N]``), its
    draw stream seeded with ``seed`` (without touching torch's global generator)."""
    table = TABLE[:N] if table is None else table
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        sampler = SAMPLERS[name].make(N, pad)
    sampler.refresh(table)
    if sampler.learns:  # MIDX-Learn: learned codewords, then the classes reassigned to them
        optimizer = torch.optim.SGD(sampler.parameters(), lr=0.1)
        for _ in range(3):
            optimizer.zero_grad()
            sampler.auxiliary_loss(rows(16, 2), table).backward()
            optimizer.step()
        sampler.refresh(table)
    return sampler


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def all_ids(n: int = N) -> torch.Tensor:
    """Every class id for every query: ``[B, n]``."""
    return torch.arange(n).expand(B, -1)


def given_ids(pad: int | None) -> torch.Tensor:
    """Ids to score ``[B, 3]``: the first and last class, and the padding class where set."""
    return torch.tensor([[0, 1 if pad is None else pad, N - 1], [5, 13, 42]])


def assert_normalised(log_p: torch.Tensor, sampler: Sampler) -> None:
    """``log_p`` ``[B, n]`` over all classes: sums to one per query, ``-inf`` for the padding
    class and for it only."""
    assert not log_p.isnan().any()
    total = torch.logsumexp(log_p.double(), dim=-1)
    torch.testing.assert_close(total, torch.zeros_like(total), atol=1e-5, rtol=0)
    if sampler.padding_idx is not None:
        assert (log_p[:, sampler.padding_idx] == -math.inf).all()
    assert (torch.isfinite(log_p).sum(-1) == sampler.num_drawable).all()


def tilted(log_p: torch.Tensor, tilt: float = 0.1) -> torch.Tensor:
    """``log_p`` ``[n]`` with every other class's probability 10% up, the others' down."""
    sign = 1.0 - 2.0 * (torch.arange(log_p.numel()) % 2)
    return torch.log_softmax(log_p.double() + tilt * sign, dim=-1)


# -- 1. normalised ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "pad"), CASES)
def test_log_prob_is_normalised_and_padding_has_no_mass(name, pad):
    sampler = build(name, pad)
    log_p = sampler.log_prob(Z, all_ids())
    assert log_p.shape == (B, N) and log_p.dtype == torch.float32
    assert_normalised(log_p, sampler)
    shared = sampler.log_prob(Z, torch.arange(N))  # the same ids for every query
    assert shared.shape == ((N,) if sampler.query_independent else (B, N))
    assert torch.equal(shared.expand(B, -1), log_p)


# -- 2. log_q is log_prob --------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "pad"), CASES)
def test_log_q_of_draws_and_scores_of_given_ids_are_log_prob(name, pad):
    sampler = build(name, pad)
    draw = sampler.sample(Z, 24, generator=generator(0))
    assert draw.ids.shape == draw.log_q.shape == (B, 24)
    assert draw.ids.dtype == torch.long and draw.log_q.dtype == torch.float32
    torch.testing.assert_close(draw.log_q, sampler.log_prob(Z, draw.ids))
    given = given_ids(pad)
    both, log_q = sampler.sample_and_score(Z, 24, given, generator=generator(0))
    assert torch.equal(both.ids, draw.ids) and torch.equal(both.log_q, draw.log_q)
    torch.testing.assert_close(log_q, sampler.log_prob(Z, given))
    assert torch.isfinite(log_q).sum() == (5 if pad is not None else 6)
    _, shared_log_q = sampler.sample_and_score(Z, 24, given[0], generator=generator(0))
    torch.testing.assert_close(shared_log_q, sampler.log_prob(Z, given[0]))


# -- 3. the law of the draws -----------------------------------------------------------------------


@pytest.mark.parametrize(("name", "pad"), CASES)
def test_draws_follow_exp_log_prob(name, pad):
    sampler = build(name, pad)
    draw = sampler.sample(Z, M, generator=generator(1))
    log_p = sampler.log_prob(Z, all_ids())
    for b in range(B):
        assert chi_square_pvalue(draw.ids[b], log_p[b].exp()) > 1e-3
        # the test has the power to fail: the same draws against a law 10% off
        assert chi_square_pvalue(draw.ids[b], tilted(log_p[b]).exp()) < 1e-6
    if not sampler.query_independent:  # ... or against another query's law
        assert not torch.equal(log_p[0], log_p[1])
        assert chi_square_pvalue(draw.ids[0], log_p[1].exp()) < 1e-6
        with pytest.raises(ValueError, match="shared negatives need a query-independent"):
            sampler.sample(Z, 4, shared=True)
        return
    shared = sampler.sample(Z, M, shared=True, generator=generator(2))
    assert shared.ids.shape == shared.log_q.shape == (M,)
    torch.testing.assert_close(shared.log_q, sampler.log_prob(Z, shared.ids))
    assert chi_square_pvalue(shared.ids, log_p[0].exp()) > 1e-3
    assert chi_square_pvalue(shared.ids, tilted(log_p[0]).exp()) < 1e-6


# -- 4. padding ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", PADDED)
def test_padding_is_never_drawn(name):
    sampler = build(name, PAD)
    draws = [
        sampler.sample(Z, M, generator=generator(3)).ids,
        sampler.sample_and_score(Z, M, given_ids(PAD), generator=generator(4))[0].ids,
    ]
    if sampler.query_independent:
        draws.append(sampler.sample(Z, M, shared=True, generator=generator(5)).ids)
    for ids in draws:
        assert 0 <= int(ids.min()) and int(ids.max()) < N
        assert not (ids == PAD).any()


# -- 5. state dict ---------------------------------------------------------------------------------


def scrambled(sampler: Sampler) -> Sampler:
    """``sampler`` with other numbers in every float buffer and parameter, saved or not."""
    with torch.no_grad():
        for value in [*sampler.buffers(), *sampler.parameters()]:
            if value.is_floating_point():
                value.add_(torch.rand(value.shape, generator=generator(5)))
    return sampler


@pytest.mark.parametrize(("name", "pad"), CASES)
def test_a_fresh_sampler_loading_the_state_draws_and_scores_alike(name, pad):
    """Into a sampler just made (a run resumed from a checkpoint) and into one refreshed from
    another table, both with another draw stream and other numbers in every float tensor."""
    sampler = build(name, pad)
    sampler.sample(Z, 4)  # the stream has moved on from its start
    state = sampler.state_dict()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        made = SAMPLERS[name].make(N, pad)
    for fresh in (scrambled(made), scrambled(build(name, pad, table=rows(N, 4), seed=2))):
        assert fresh.get_extra_state() != sampler.get_extra_state()
        fresh.load_state_dict(state)
        want, got = sampler.sample(Z, 64), fresh.sample(Z, 64)  # each its own stream
        assert torch.equal(got.ids, want.ids) and torch.equal(got.log_q, want.log_q)
        a = sampler.sample(Z, 64, generator=generator(6))
        b = fresh.sample(Z, 64, generator=generator(6))
        assert torch.equal(a.ids, b.ids) and torch.equal(a.log_q, b.log_q)
        assert torch.equal(fresh.log_prob(Z, all_ids()), sampler.log_prob(Z, all_ids()))
        state = sampler.state_dict()  # the original's stream moved on: the next fresh follows


# -- 6. restriction to a shard ---------------------------------------------------------------------


def shard_ids(pad: int | None) -> torch.Tensor:
    """``K`` distinct class ids in no order, with the padding class at position 3 where set."""
    ids = torch.randperm(N, generator=generator(8))
    if pad is None:
        return ids[:K]
    ids = ids[ids != pad][: K - 1]
    return torch.cat([ids[:3], torch.tensor([pad]), ids[3:]])


@pytest.mark.parametrize(("name", "pad"), CASES)
def test_the_restriction_to_some_rows_draws_within_them(name, pad):
    sampler = build(name, pad)
    spec = SAMPLERS[name]
    ids = shard_ids(pad)
    if spec.restriction is None:
        with pytest.raises(ValueError, match=f"{type(sampler).__name__}.*restrict"):
            sampler.restricted(ids)
        return
    part = sampler.restricted(ids)
    part.refresh(TABLE[ids])  # as a sharded head's refresh_index does with its rows
    assert part.num_classes == K and part.padding_idx == (None if pad is None else 3)
    assert part.query_independent == sampler.query_independent
    log_r = part.log_prob(Z, all_ids(K))
    assert_normalised(log_r, part)
    if spec.restriction == "renormalised":
        want = torch.log_softmax(sampler.log_prob(Z, ids.expand(B, -1)).double(), dim=-1)
        finite = torch.isfinite(want)
        assert torch.equal(torch.isfinite(log_r), finite)
        torch.testing.assert_close(log_r[finite].double(), want[finite], atol=1e-4, rtol=0)
    draw = part.sample(Z, 4000, generator=generator(7))
    assert 0 <= int(draw.ids.min()) and int(draw.ids.max()) < K
    assert part.padding_idx is None or not (draw.ids == part.padding_idx).any()
    torch.testing.assert_close(draw.log_q, part.log_prob(Z, draw.ids))
    for b in range(B):
        assert chi_square_pvalue(draw.ids[b], log_r[b].exp()) > 1e-3


# -- 7. growth -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "pad"), CASES)
def test_added_classes_join_the_support_and_bad_rows_are_refused(name, pad):
    sampler = build(name, pad)
    bad = rows(2, 9)
    bad[1, 3] = math.nan
    if SAMPLERS[name].index:
        with pytest.raises(ValueError, match="new class rows contains NaN values"):
            sampler.check_class_rows(bad)
    else:
        sampler.check_class_rows(bad)  # nothing is built from the rows
    sampler.check_class_rows(TABLE[N:])
    sampler.add_classes(NEW)
    sampler.refresh(TABLE)  # as OutputHead.add_classes does with the grown table
    n = N + NEW
    assert sampler.num_classes == n and sampler.num_drawable == n - (pad is not None)
    log_p = sampler.log_prob(Z, all_ids(n))
    assert_normalised(log_p, sampler)
    draw = sampler.sample(Z, M, generator=generator(9))
    torch.testing.assert_close(draw.log_q, sampler.log_prob(Z, draw.ids))
    assert (draw.ids >= N).any(dim=-1).all(), "no added class was drawn"
    for b in range(B):
        assert chi_square_pvalue(draw.ids[b], log_p[b].exp()) > 1e-3
    with pytest.raises(IndexError, match=rf"ids must be in \[0, {n}\), got {n}"):
        sampler.log_prob(Z, torch.tensor([n]))


# -- 8. bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "pad"), CASES)
def test_bad_input_is_refused_by_name(name, pad):
    sampler = build(name, pad)
    given = given_ids(pad)
    for num in (0, -3, 2.5, True):
        match = f"num_samples must be a positive integer, got {num!r}"
        with pytest.raises(ValueError, match=match):
            sampler.sample(Z, num)
        with pytest.raises(ValueError, match=match):
            sampler.sample_and_score(Z, num, given)
    for bad in (N, -1):
        ids = torch.tensor([[0, bad]] * B)
        with pytest.raises(IndexError, match=rf"ids must be in \[0, {N}\), got {bad}"):
            sampler.log_prob(Z, ids)
        with pytest.raises(IndexError, match=rf"ids must be in \[0, {N}\), got {bad}"):
            sampler.sample_and_score(Z, 4, ids)
    with pytest.raises(ValueError, match="ids must be an integer tensor"):
        sampler.log_prob(Z, given.float())
    many = torch.randint(N, (5, 2))
    match = r"one row per query of z \[B, D\], got ids of shape \(5, 2\)"
    with pytest.raises(ValueError, match=match):
        sampler.log_prob(Z, many)
    with pytest.raises(ValueError, match=match):
        sampler.sample_and_score(Z, 4, many)
    with pytest.raises(ValueError, match=r"ids must be \[B, K\] \(per query\) or \[K\]"):
        sampler.log_prob(Z, given[:, :, None])
    for z, match in ((Z[0], r"z must be \[B, D\], got shape \(8,\)"), (Z.long(), "floating")):
        with pytest.raises(ValueError, match=match):
            sampler.sample(z, 4)
        with pytest.raises(ValueError, match=match):
            sampler.log_prob(z, given[0])
        with pytest.raises(ValueError, match=match):
            sampler.sample_and_score(z, 4, given[0])
    wide = rows(B, 10)[:, :1].expand(B, D + 1).contiguous()
    if sampler.query_independent:  # z is read for its batch size, device and dtype only
        assert torch.equal(sampler.log_prob(wide, given), sampler.log_prob(Z, given))
        assert sampler.sample(wide, 4).ids.shape == (B, 4)
    else:
        match = rf"z must have {D} features to match the index, got {D + 1}"
        with pytest.raises(ValueError, match=match):
            sampler.sample(wide, 4)
        with pytest.raises(ValueError, match=match):
            sampler.log_prob(wide, given)
        with pytest.raises(ValueError, match=match):
            sampler.sample_and_score(wide, 4, given)
    with pytest.raises(ValueError, match="num_new must be a positive integer, got 0"):
        sampler.add_classes(0)
    if SAMPLERS[name].restriction is not None:
        with pytest.raises(IndexError, match=rf"ids must be in \[0, {N}\), got {N}"):
            sampler.restricted(torch.tensor([0, N]))


@pytest.mark.parametrize(("name", "pad"), CASES)
def test_an_empty_batch_gets_empty_draws_and_scores(name, pad):
    sampler = build(name, pad)
    none = Z[:0]
    draw = sampler.sample(none, 4)
    assert draw.ids.shape == draw.log_q.shape == (0, 4)
    assert sampler.log_prob(none, torch.zeros(0, 3, dtype=torch.long)).shape == (0, 3)
    both, log_q = sampler.sample_and_score(none, 4, torch.zeros(0, 1, dtype=torch.long))
    assert both.ids.shape == (0, 4) and log_q.shape == (0, 1)
