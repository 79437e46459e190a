"""A growing catalog: ``head.add_classes(n)`` keeps the old classes' rows, biases and optimizer
state exactly (training on them continues as if nothing had grown), the proposals and their
index cover the new classes, and checkpoints load before and after."""

import copy

import pytest
import torch

from lightning_sampled.heads import CaneHead, FullSoftmaxHead, SampledSoftmaxHead
from lightning_sampled.optim import LazyAdam
from lightning_sampled.samplers import (
    LogUniformSampler,
    MIDXSampler,
    MixtureSampler,
    UniformSampler,
    UnigramSampler,
)

N, D, NEW = 30, 6, 8


def trained(head, optimizer, steps: int = 3, seed: int = 0):
    """A few steps on fixed batches over the old classes, with fixed negatives among them (and
    the targets' ``log q``, which the default convention corrects the positive by)."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        z = torch.randn(5, D, generator=g)
        target = torch.randint(N, (5,), generator=g)
        negatives = torch.randint(N, (7,), generator=g)
        optimizer.zero_grad(set_to_none=True)
        loss = head(
            z,
            target,
            negatives=negatives,
            negative_log_q=torch.full((7,), -3.0),
            target_log_q=torch.full((5,), -3.0),
        )
        loss.backward()
        optimizer.step()
    return head


@pytest.mark.parametrize("table_state", ["adam", "row_wise_adagrad"])
def test_training_on_the_old_classes_continues_unchanged_after_growth(table_state):
    torch.manual_seed(0)
    head = SampledSoftmaxHead(N, D, UniformSampler(N), 4, bias=True, sparse_grad=True)
    optimizer = LazyAdam(head.parameters(), lr=0.05, table_state=table_state)
    trained(head, optimizer)
    grown, grown_optimizer = copy.deepcopy((head, optimizer))
    grown.add_classes(NEW, optimizers=[grown_optimizer])
    assert grown.num_classes == N + NEW and grown.weight.shape == (N + NEW, D)
    assert grown_optimizer.param_groups[0]["params"][0] is grown.weight  # the same Parameter
    new_rows = grown.weight[N:].clone()
    trained(head, optimizer, seed=1)
    trained(grown, grown_optimizer, seed=1)
    torch.testing.assert_close(grown.weight[:N], head.weight, rtol=0, atol=0)
    torch.testing.assert_close(grown.bias[:N], head.bias, rtol=0, atol=0)
    assert torch.equal(grown.weight[N:], new_rows) and torch.equal(grown.bias[N:], torch.zeros(NEW))
    for key, value in optimizer.state[head.weight].items():
        got = grown_optimizer.state[grown.weight][key]
        if value.dim():
            assert torch.equal(got[:N], value) and not got[N:].any(), key


def test_the_new_rows_come_from_init_and_a_pending_gradient_grows_with_them():
    head = FullSoftmaxHead(N, D, bias=True)
    head.full_loss(torch.randn(3, D), torch.tensor([1, 2, 3])).backward()
    before = head.weight.grad.clone()
    rows = torch.randn(NEW, D)
    head.add_classes(NEW, rows)
    assert torch.equal(head.weight[N:], rows)
    assert torch.equal(head.weight.grad[:N], before) and not head.weight.grad[N:].any()
    head.add_classes(2, torch.nn.init.zeros_)
    assert not head.weight[-2:].any()
    logits = head.logits(torch.randn(2, D))
    assert logits.shape == (2, N + NEW + 2)
    sparse = SampledSoftmaxHead(N, D, num_negatives=3, sparse_grad=True)
    sparse(torch.randn(3, D), torch.tensor([1, 2, 3])).backward()
    sparse.add_classes(NEW)
    assert sparse.weight.grad.is_sparse and sparse.weight.grad.shape == (N + NEW, D)


@pytest.mark.parametrize(
    "make",
    [
        lambda: UniformSampler(N, padding_idx=0),
        lambda: LogUniformSampler(N),
        lambda: UnigramSampler(torch.arange(N, dtype=torch.float), alpha=1.0),
        lambda: MIDXSampler(N, 3, kmeans_iters=2),
        lambda: MixtureSampler([MIDXSampler(N, 3, kmeans_iters=2), LogUniformSampler(N)]),
    ],
    ids=["uniform", "log_uniform", "unigram", "midx", "mixture"],
)
def test_the_proposal_and_its_index_cover_the_new_classes(make):
    torch.manual_seed(0)
    head = SampledSoftmaxHead(N, D, make(), 5, padding_idx=getattr(make(), "padding_idx", None))
    head.refresh_index()
    old_log_q = head.sampler.log_prob(torch.randn(1, D), torch.arange(N))
    head.add_classes(NEW)
    z = torch.randn(400, D)
    draws = head.sampler.sample(z, 20).ids
    assert draws.max() >= N  # new classes are drawn
    log_q = head.sampler.log_prob(z[:3], torch.arange(N + NEW).expand(3, -1))
    torch.testing.assert_close(log_q.exp().sum(1), torch.ones(3))
    if isinstance(head.sampler, UnigramSampler):  # old ratios kept, new at the smallest share
        ratio = (log_q[0, :N] - old_log_q).exp()
        torch.testing.assert_close(ratio, ratio[1].expand(N))
        assert torch.allclose(
            log_q[0, N:], old_log_q[old_log_q > -torch.inf].min() + ratio[1].log()
        )
    head(torch.randn(4, D), torch.tensor([1, N, N + 1, N + NEW - 1]))


def test_checkpoints_load_before_and_after_growth_and_frequencies_grow():
    torch.manual_seed(0)
    head = SampledSoftmaxHead(N, D, num_negatives=3, in_batch_negatives=True, bias=True)
    head(torch.randn(6, D), torch.randint(N, (6,)))
    before = copy.deepcopy(head.state_dict())
    rows = torch.randn(NEW, D)
    head.add_classes(NEW, rows)
    assert head.target_frequency.count.shape == (N + NEW,)
    head(torch.randn(6, D), torch.tensor([0, 1, N, N + 1, N + 2, 3]))  # new classes as targets
    after = head.state_dict()
    fresh = SampledSoftmaxHead(N + NEW, D, num_negatives=3, in_batch_negatives=True, bias=True)
    fresh.load_state_dict(after)
    assert torch.equal(fresh.weight, head.weight)
    old = SampledSoftmaxHead(N, D, num_negatives=3, in_batch_negatives=True, bias=True)
    old.load_state_dict(before)
    old.add_classes(NEW, rows)
    assert torch.equal(old.weight[:N], head.weight[:N]) and torch.equal(old.weight[N:], rows)


def test_growth_is_refused_where_it_cannot_work():
    with pytest.raises(ValueError, match="num_new"):
        FullSoftmaxHead(N, D).add_classes(0)
    with pytest.raises(ValueError, match="ignore_index=35 would become a class id"):
        FullSoftmaxHead(N, D, ignore_index=35).add_classes(NEW)
    with pytest.raises(ValueError, match=r"init must have shape \(8, 6\)"):
        FullSoftmaxHead(N, D).add_classes(NEW, torch.zeros(NEW, D + 1))
    cane = CaneHead(N, D, num_candidates=3, num_noise=3)
    with pytest.raises(ValueError, match="CaneHead cannot add classes"):
        cane.add_classes(NEW)


def midx_head_with_in_batch_negatives():
    head = SampledSoftmaxHead(
        N, D, MIDXSampler(N, 4, kmeans_iters=3), num_negatives=5, in_batch_negatives=True
    )
    head.refresh_index()
    return head


def assert_same(got, want):
    """Nested dicts and lists of tensors and plain values, equal entry by entry."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys()
        for key in want:
            assert_same(got[key], want[key])
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            assert_same(a, b)
    elif isinstance(want, torch.Tensor):
        assert torch.equal(got, want)
    else:
        assert got == want


@pytest.mark.parametrize(
    ("make", "init", "match"),
    [
        # MIDX's index refuses rows whose fp32 squared distances overflow: it used to raise in
        # the refresh after the table, num_classes and the sampler had grown, before q_b did
        (midx_head_with_in_batch_negatives, torch.full((3, D), 1e20), "beyond 9.22e"),
        (midx_head_with_in_batch_negatives, torch.full((3, D), float("nan")), "NaN or infinite"),
        # a head without an index used to take NaN rows silently
        (lambda: FullSoftmaxHead(N, D, bias=True), torch.full((3, D), float("nan")), "NaN"),
        (lambda: SampledSoftmaxHead(N, D), torch.full((3, D), float("inf")), "NaN or infinite"),
        (lambda: FullSoftmaxHead(N, D), lambda rows: rows.fill_(float("nan")), "NaN"),
    ],
    ids=["midx_huge", "midx_nan", "full_nan", "sampled_inf", "full_nan_fill"],
)
def test_refused_new_rows_leave_the_head_as_it_was(make, init, match):
    """All or nothing: rows that cannot be added are refused before anything grows, so the head
    keeps its classes, state and shapes and trains on as before."""
    torch.manual_seed(0)
    head = make()
    optimizer = torch.optim.Adam(head.parameters())
    for _ in range(2):
        optimizer.zero_grad()
        head(torch.randn(5, D), torch.randint(N, (5,))).backward()
        optimizer.step()
    before = copy.deepcopy(head.state_dict())
    state = copy.deepcopy(optimizer.state_dict())
    with pytest.raises(ValueError, match=match):
        head.add_classes(3, init, optimizers=[optimizer])
    assert head.num_classes == N and head.weight.shape == (N, D)
    sampler = getattr(head, "sampler", None)
    assert sampler is None or sampler.num_classes == N
    assert_same(head.state_dict(), before)
    assert_same(optimizer.state_dict(), state)
    head(torch.randn(4, D), torch.randint(N, (4,))).backward()  # trains on as before
