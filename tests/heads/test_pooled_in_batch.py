"""The batch's targets pooled into one column (``SampledSoftmaxHead.pooled``): the log-sum-exp of
their corrected columns computed a chunk of candidates at a time
(``ops.chunked.chunked_logsumexp``, ``ops.in_batch.in_batch_logsumexp``), its gradient by
recomputing each chunk, never the ``[T, U]`` logits. Checked against brute force in fp64, against
the ``[T, U]`` columns it replaces (``in_batch_logits``), and at the head against the same head
scoring the columns, where a proposal that depends on the query keeps the columns."""

import math

import pytest
import torch
from torch import nn

from lightning_sampled.heads import SampledSoftmaxHead
from lightning_sampled.ops import chunked, in_batch
from lightning_sampled.ops.chunked import chunked_logsumexp
from lightning_sampled.ops.in_batch import (
    distinct_candidates,
    in_batch_logits,
    in_batch_logsumexp,
    sorted_candidates,
)
from lightning_sampled.samplers import MIDXSampler, UnigramSampler


def brute_logsumexp(z, weight, bias, column, shift):
    """fp64 ``logsumexp`` of the dense logits with one cell per row shifted."""
    logits = z.double() @ weight.double().T + bias.double()
    rows = torch.arange(z.shape[0])
    listed = column >= 0
    logits[rows[listed], column[listed]] += shift.double()[listed]
    return torch.logsumexp(logits, dim=1)


@pytest.mark.parametrize("kept", [0, 37 * 7, 37 * 23])  # no chunk kept, some, all
def test_chunked_logsumexp_is_the_dense_one_with_its_gradients(kept, monkeypatch):
    monkeypatch.setattr(chunked, "KEPT_LOGITS_ELEMENTS", kept)
    g = torch.Generator().manual_seed(0)
    T, C, D = 37, 23, 5
    z = torch.randn(T, D, generator=g, requires_grad=True)
    weight = torch.randn(C, D, generator=g, requires_grad=True)
    bias = torch.randn(C, generator=g, requires_grad=True)
    column = torch.randint(-1, C, (T,), generator=g)
    shift = torch.randn(T, generator=g)
    shift[::3] = -math.inf  # removed cells
    upstream = torch.randn(T, generator=g, dtype=torch.float64)
    want = brute_logsumexp(z, weight, bias, column, shift)
    want_grads = torch.autograd.grad((want * upstream).sum(), [z, weight, bias])
    for chunk_size in (4, 7, C):  # several chunks, a short last one, one chunk
        got = chunked_logsumexp(z, weight, bias, column, shift, chunk_size)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-5)
        grads = torch.autograd.grad((got * upstream.float()).sum(), [z, weight, bias])
        for a, b in zip(grads, want_grads, strict=True):
            torch.testing.assert_close(a.double(), b.double(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("kept", "recomputed"), [(0, 4), (40 * 26, 2), (40 * 50, 0)])
def test_backward_reads_the_kept_logits_instead_of_recomputing_them(kept, recomputed, monkeypatch):
    """The leading whole chunks that fit ``KEPT_LOGITS_ELEMENTS`` are kept from forward: backward
    computes the logits of the other chunks only."""
    monkeypatch.setattr(chunked, "KEPT_LOGITS_ELEMENTS", kept)
    z = torch.randn(40, 6, requires_grad=True)
    weight = torch.randn(50, 6, requires_grad=True)
    got = chunked_logsumexp(z, weight, torch.zeros(50), chunk_size=13)  # chunks 13 13 13 11
    calls = []
    original = chunked.chunk_logits
    monkeypatch.setattr(
        chunked, "chunk_logits", lambda *a, **k: calls.append(a[3:5]) or original(*a, **k)
    )
    got.sum().backward()
    assert len(calls) == recomputed
    assert all(start >= chunked.kept_columns(40, 50, 13) for start, _ in calls)


def test_a_row_with_no_candidate_left_gives_minus_infinity_and_no_gradient():
    """One candidate, removed from the row that holds it: ``-inf``, and a gradient of zero (not
    NaN) for that row, while the other rows are exact."""
    z = torch.randn(3, 4, requires_grad=True)
    weight = torch.randn(1, 4, requires_grad=True)
    column = torch.tensor([0, -1, -1])
    shift = torch.tensor([-math.inf, 0.0, 0.0])
    got = chunked_logsumexp(z, weight, torch.zeros(1), column, shift)
    assert got[0] == -math.inf and torch.isfinite(got[1:]).all()
    torch.testing.assert_close(got[1:], (z[1:] @ weight.T)[:, 0])
    got[1:].sum().backward()  # the -inf row is not part of the loss: its gradient must stay 0
    assert torch.isfinite(z.grad).all() and (z.grad[0] == 0).all()
    assert torch.isfinite(weight.grad).all()


def test_removing_a_dominant_own_cell_loses_nothing_to_cancellation():
    """A row whose own candidate carries almost all the mass (a well-trained target): the shift
    is applied to the logit before the sum, so the rest is exact, not ``Z - e^{o}`` in fp32."""
    z = torch.tensor([[1.0, 0.0]], requires_grad=True)
    weight = torch.tensor([[40.0, 0.0], [0.0, 1.0], [0.5, 0.5]], requires_grad=True)
    column, shift = torch.tensor([0]), torch.tensor([-math.inf])
    got = chunked_logsumexp(z, weight, torch.zeros(3), column, shift)
    want = torch.logsumexp(torch.tensor([0.0, 0.5]), 0)  # the two other logits
    torch.testing.assert_close(got[0], want)
    got.sum().backward()
    assert weight.grad[0].abs().max() == 0  # the removed candidate gets no gradient


@pytest.mark.parametrize("build", [distinct_candidates, sorted_candidates])
@pytest.mark.parametrize("remove_hits", [True, False])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("block", [2**22, 100], ids=["one_chunk", "3_columns_a_chunk"])
def test_in_batch_logsumexp_is_the_logsumexp_of_the_in_batch_columns(
    build, remove_hits, masked, block, monkeypatch
):
    monkeypatch.setattr(in_batch, "POOLED_BLOCK_ELEMENTS", block)  # 100 // 30 positions = 3
    g = torch.Generator().manual_seed(1)
    T, N, D = 30, 12, 6
    target = torch.randint(N, (T,), generator=g)
    target[:5] = 3  # a target held by many positions, and singletons (n = 1: log 0 in its cell)
    mask = torch.rand(T, generator=g) > 0.2 if masked else None
    candidates = build(target, mask)
    U = candidates.ids.numel()
    z = torch.randn(T, D, generator=g, requires_grad=True)
    rows = torch.randn(U, D, generator=g, requires_grad=True)
    bias = torch.randn(U, generator=g, requires_grad=True)
    log_size = torch.randn(U, generator=g)
    upstream = torch.randn(T, generator=g)

    def loss_and_grads(lse):
        finite = torch.isfinite(lse)
        loss = (lse.where(finite, 0.0) * upstream).sum()
        return lse, torch.autograd.grad(loss, [z, rows, bias])

    columns = in_batch_logits(z @ rows.T + bias, log_size, candidates, remove_hits)
    want, want_grads = loss_and_grads(torch.logsumexp(columns, dim=1))
    got, grads = loss_and_grads(
        in_batch_logsumexp(z, rows, bias, log_size, candidates, remove_hits)
    )
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    for a, b in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def tower():
    torch.manual_seed(5)
    return nn.Sequential(nn.Embedding(60, 8), nn.Linear(8, 8))


N, D, M = 60, 8, 6
POOLED = SampledSoftmaxHead.pooled
HEADS = {
    "default": lambda: SampledSoftmaxHead(N, D, num_negatives=M),
    "bias": lambda: SampledSoftmaxHead(N, D, num_negatives=M, bias=True),
    "exact_positive": lambda: SampledSoftmaxHead(
        N, D, num_negatives=M, convention="exact_positive"
    ),
    "tensorflow": lambda: SampledSoftmaxHead(N, D, num_negatives=M, convention="tensorflow"),
    "unigram": lambda: SampledSoftmaxHead(N, D, UnigramSampler(torch.arange(1.0, N + 1)), M),
    "shared": lambda: SampledSoftmaxHead(N, D, num_negatives=M, shared_negatives=True),
    "in_batch_only": lambda: SampledSoftmaxHead(N, D, num_negatives=0, in_batch_negatives=True),
    "normalized": lambda: SampledSoftmaxHead(N, D, num_negatives=M, normalize=True),
    "sparse": lambda: SampledSoftmaxHead(N, D, num_negatives=M, sparse_grad=True),
    "tower": lambda: SampledSoftmaxHead(N, D, num_negatives=M, candidate_encoder=tower()),
    "sorted": lambda: SampledSoftmaxHead(N, D, num_negatives=M, in_batch_candidates="sorted"),
}


def step(make, pool, monkeypatch, block_elements=2**24):
    """Loss and gradients (queries first) of one step on a batch with ignored positions, the
    batch's targets pooled or (``pool=False``) scored as ``[T, U]`` columns; and whether they
    were pooled."""
    monkeypatch.setattr(chunked, "MAX_BLOCK_ELEMENTS", block_elements)
    pooled = []

    def spy(self, z, negatives):
        out = POOLED(self, z, negatives) if pool else negatives
        pooled.append(any(type(s).__name__ == "PooledNegatives" for s in out.sources))
        return out

    monkeypatch.setattr(SampledSoftmaxHead, "pooled", spy)
    torch.manual_seed(0)
    head = make()
    g = torch.Generator().manual_seed(1)
    z = torch.randn(4, 10, D, generator=g, requires_grad=True)
    target = torch.randint(N, (4, 10), generator=g)
    target[0, :4] = 3
    target[1, 2] = target[3, 0] = -100
    torch.manual_seed(3)  # the draws
    loss = head(z, target)
    loss.backward()
    grads = [z.grad] + [p.grad.to_dense() for p in head.parameters() if p.grad is not None]
    return loss.detach(), grads, any(pooled)


@pytest.mark.parametrize("name", list(HEADS))
@pytest.mark.parametrize("block_elements", [2**24, 600])
def test_the_head_pools_the_batch_targets_into_the_same_loss(name, block_elements, monkeypatch):
    columns, column_grads, was_pooled = step(HEADS[name], False, monkeypatch, block_elements)
    assert not was_pooled
    loss, grads, was_pooled = step(HEADS[name], True, monkeypatch, block_elements)
    assert was_pooled
    torch.testing.assert_close(loss, columns, rtol=1e-6, atol=1e-6)
    assert len(grads) == len(column_grads) >= 2
    for got, want in zip(grads, column_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_a_proposal_that_depends_on_the_query_keeps_the_columns(monkeypatch):
    """MIDX's ``log q(j | z)`` makes the correction ``[T, U]``: no column term to pool."""

    def midx():
        head = SampledSoftmaxHead(N, D, MIDXSampler(N, codebook_size=3, dim=D), M)
        head.refresh_index()
        return head

    assert not step(midx, True, monkeypatch)[2]


def test_the_limited_form_keeps_the_columns(monkeypatch):
    """Under ``max_in_batch_draws`` each row counts its own draws: no shared correction."""

    def limited():
        return SampledSoftmaxHead(N, D, num_negatives=M, max_in_batch_draws=7)

    assert not step(limited, True, monkeypatch)[2]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    "classes, positions, sparse",
    [(3_706, 25_600, False), (1_000_000, 6_400, True)],
    ids=["ml-1m", "1m-items"],
)
def test_the_pooled_column_equals_the_columns_at_a_recommenders_batch_on_cuda(
    classes, positions, sparse, monkeypatch
):
    """The recipes' shapes on CUDA (the batch's targets sorted in fixed shapes there): fp32 loss
    and gradients of the pooled head equal the ``[T, U]`` columns' within 1e-5."""
    g = torch.Generator().manual_seed(0)
    weights = 1.0 / torch.arange(1, classes + 1, dtype=torch.float64)
    target = torch.multinomial(weights, positions, replacement=True, generator=g).cuda()
    z0 = torch.randn(positions, 64, generator=g).cuda()
    results = []
    for pool in (False, True):
        monkeypatch.setattr(
            SampledSoftmaxHead, "pooled", POOLED if pool else lambda self, z, negatives: negatives
        )
        torch.manual_seed(0)
        head = SampledSoftmaxHead(classes, 64, num_negatives=20, sparse_grad=sparse).cuda()
        z = z0.clone().requires_grad_()
        torch.manual_seed(1)
        loss = head(z, target)
        loss.backward()
        results.append((loss.detach(), z.grad, head.weight.grad.to_dense()))
    for got, want in zip(results[1], results[0], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
