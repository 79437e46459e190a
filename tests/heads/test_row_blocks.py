"""The sampled head scores its rows a block at a time (``SampledSoftmaxHead.sampled_losses``,
``positions_per_block``), and the other heads gather per-query candidates a block of positions at
a time (``OutputHead.candidate_logits``): the negatives are drawn once for the batch, each block
is scored under activation checkpointing, and every gather from the table adds into one dense
gradient (``ops/row_gradients.py``). Loss and gradients equal the single block's, no tensor kept
for backward holds a block's logits or gathered vectors (the checkpointed blocks keep their inputs
only), and the table's dense gradient is made once.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightning_sampled.heads import OneVsEachHead, SampledSoftmaxHead
from lightning_sampled.ops import chunked, row_gradients
from lightning_sampled.ops.row_gradients import RowGradientSink
from lightning_sampled.samplers import MIDXSampler, UniformSampler, UnigramSampler

N, D, M = 60, 8, 6
B, L = 4, 10  # T = 40 positions
IGNORE = -100


def tower():
    torch.manual_seed(5)
    return nn.Sequential(nn.Embedding(N, D), nn.Linear(D, D))


HEADS = {
    "default": lambda: SampledSoftmaxHead(N, D, num_negatives=M, bias=True),
    "exact_positive": lambda: SampledSoftmaxHead(
        N, D, num_negatives=M, convention="exact_positive"
    ),
    "tensorflow_plain": lambda: SampledSoftmaxHead(
        N, D, num_negatives=M, convention="tensorflow", in_batch_negatives=False
    ),
    "plain_unigram": lambda: SampledSoftmaxHead(
        N, D, UnigramSampler(torch.arange(1.0, N + 1)), M, in_batch_negatives=False
    ),
    "shared": lambda: SampledSoftmaxHead(N, D, num_negatives=M, shared_negatives=True),
    "in_batch_only": lambda: SampledSoftmaxHead(N, D, num_negatives=0, in_batch_negatives=True),
    "limited": lambda: SampledSoftmaxHead(N, D, num_negatives=M, max_in_batch_draws=7),
    # groups of 5 rows share 7 draws: a block keeps its groups whole, and their log q (one per
    # group, or per row for a proposal scored per query)
    "grouped": lambda: SampledSoftmaxHead(
        N, D, num_negatives=M, max_in_batch_draws=7, in_batch_group_size=5
    ),
    "grouped_per_query": lambda: SampledSoftmaxHead(
        N, D, PerQueryUniform(N), M, max_in_batch_draws=7, in_batch_group_size=5
    ),
    # the default with MIDX: its in-batch columns' log q is [T, U], one row per query, so a
    # block takes its own rows of it
    "default_midx": lambda: indexed(SampledSoftmaxHead(N, D, MIDXSampler(N, 3, kmeans_iters=2), M)),
    "normalized": lambda: SampledSoftmaxHead(N, D, num_negatives=M, normalize=True),
    "sparse": lambda: SampledSoftmaxHead(N, D, num_negatives=M, sparse_grad=True),
    "tower": lambda: SampledSoftmaxHead(N, D, num_negatives=M, candidate_encoder=tower()),
    "one_vs_each": lambda: OneVsEachHead(N, D, num_negatives=M),
}


def indexed(head: SampledSoftmaxHead) -> SampledSoftmaxHead:
    """``head`` with its proposal's index built from its table."""
    head.refresh_index()
    return head


class PerQueryUniform(UniformSampler):
    """The uniform proposal, which the head must score per query (as MIDX's)."""

    query_independent = False


def batch():
    """Queries ``[B, L, D]`` and targets ``[B, L]`` with three ignored positions and a target
    held by many positions (its in-batch column counts several draws)."""
    g = torch.Generator().manual_seed(1)
    z = torch.randn(B, L, D, generator=g)
    target = torch.randint(N, (B, L), generator=g)
    target[0, :4] = 3
    target[1, 2] = target[2, 7] = target[3, 0] = IGNORE
    return z, target


def step(name, block_elements, monkeypatch, weights=False):
    """Loss, gradients (queries first) and the largest tensor kept for backward, with blocks of
    rows of at most ``block_elements`` entries."""
    monkeypatch.setattr(chunked, "MAX_BLOCK_ELEMENTS", block_elements)
    # the pooled column's logits kept for backward have their own bound (KEPT_LOGITS_ELEMENTS,
    # tests/heads/test_pooled_in_batch.py): none kept here, so what is measured is the blocks'
    monkeypatch.setattr(chunked, "KEPT_LOGITS_ELEMENTS", 0)
    torch.manual_seed(0)
    head = HEADS[name]()
    z, target = batch()
    z.requires_grad_(True)
    weight = torch.rand(B, L, generator=torch.Generator().manual_seed(2)) if weights else None
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    torch.manual_seed(3)  # the draws
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = head(z, target, weight)
    loss.backward()
    grads = [z.grad] + [p.grad.to_dense() for p in head.parameters() if p.grad is not None]
    return loss.detach(), grads, max(saved)


@pytest.mark.parametrize("name", list(HEADS))
def test_blocks_of_rows_give_the_single_blocks_loss_and_gradients(name, monkeypatch):
    whole, whole_grads, whole_saved = step(name, 2**24, monkeypatch)
    blocked, blocked_grads, blocked_saved = step(name, 1200, monkeypatch)
    torch.testing.assert_close(blocked, whole, rtol=1e-6, atol=1e-6)
    assert len(blocked_grads) == len(whole_grads) >= 2
    for got, want in zip(blocked_grads, whole_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # one block keeps [T, C] logits or [T, M, D] vectors; checkpointed blocks keep their inputs
    # only, the last (not checkpointed) what one block of at most 1,200 entries saves; where the
    # whole step keeps nothing larger than the queries (shared draws beside the pooled in-batch
    # column), neither do the blocks
    assert blocked_saved <= max(B * L * D, 1200)
    assert blocked_saved < whole_saved or whole_saved == blocked_saved == B * L * D


def test_blocks_with_sample_weights(monkeypatch):
    whole, whole_grads, _ = step("default", 2**24, monkeypatch, weights=True)
    blocked, blocked_grads, _ = step("default", 1200, monkeypatch, weights=True)
    torch.testing.assert_close(blocked, whole, rtol=1e-6, atol=1e-6)
    for got, want in zip(blocked_grads, whole_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_the_block_size_follows_the_candidates_and_the_gathers():
    # 100 draws per query (and the positive) and ~3,930 batch targets at D = 256
    per_row = 2 * 101 * 256 + 8 * 4_031
    rows = chunked.positions_per_block(4_031, 101, 256)
    assert rows == chunked.MAX_BLOCK_ELEMENTS // per_row
    assert rows <= chunked.positions_per_gather(101, 256)  # the block's gather is one gather
    assert chunked.positions_per_block(10**9, 1, 1) == 1  # at least one row
    shared = chunked.positions_per_block(201, 1, 256)  # shared draws: one gathered row per row
    assert shared == chunked.MAX_BLOCK_ELEMENTS // (2 * 256 + 8 * 201)


def test_row_blocks_put_the_short_block_first():
    assert chunked.row_blocks(10, 4) == [slice(0, 2), slice(2, 6), slice(6, 10)]
    assert chunked.row_blocks(8, 4) == [slice(0, 4), slice(4, 8)]
    assert chunked.row_blocks(3, 4) == [slice(0, 3)]


def test_aligned_row_blocks_keep_each_group_of_rows_whole():
    # groups of 3 over 10 rows (the last one row), at most 7 rows a block: 2 groups a block
    assert chunked.row_blocks(10, 7, align=3) == [slice(0, 6), slice(6, 10)]
    assert chunked.row_blocks(13, 7, align=3) == [slice(0, 3), slice(3, 9), slice(9, 13)]
    # a step below the group still keeps the group whole
    assert chunked.row_blocks(10, 2, align=4) == [slice(0, 4), slice(4, 8), slice(8, 10)]


@pytest.mark.parametrize("num_rows", [12, 10])
@pytest.mark.parametrize("with_bias", [False, True])
def test_grouped_logits_score_each_row_against_its_groups_candidates(num_rows, with_bias):
    """Against a plain reference: row ``t`` against the candidates of group ``t // g``; 10 rows
    in groups of 4 leave the last group two rows."""
    g = torch.Generator().manual_seed(0)
    z = torch.randn(num_rows, D, generator=g, dtype=torch.float64)
    rows = torch.randn(3, 5, D, generator=g, dtype=torch.float64)
    bias = torch.randn(3, 5, generator=g, dtype=torch.float64) if with_bias else None
    got = chunked.grouped_logits(z, rows, bias, 4)
    want = torch.stack([rows[t // 4] @ z[t] for t in range(num_rows)])
    if with_bias:
        want = want + torch.stack([bias[t // 4] for t in range(num_rows)])
    assert got.shape == (num_rows, 5)
    torch.testing.assert_close(got, want.float())


def test_every_row_is_scored_once_in_blocks(monkeypatch):
    monkeypatch.setattr(chunked, "MAX_BLOCK_ELEMENTS", 1200)
    torch.manual_seed(0)
    head = HEADS["default"]()
    rows = []
    original = head._block_losses
    head._block_losses = lambda z, *rest: rows.append(z.shape[0]) or original(z, *rest)
    z, target = batch()
    with torch.no_grad():
        head(z, target)
    scored = int((target != IGNORE).sum())
    assert len(rows) > 3 and sum(rows) == scored and max(rows) == rows[-1]  # short one first


def test_the_tables_gradient_is_made_once_in_the_sink(monkeypatch):
    """Every gather of the blocks adds into one buffer (no per-block dense gradient), or, with
    ``sparse_grad``, into one sparse gradient; a tower's blocks gather as before."""
    monkeypatch.setattr(chunked, "MAX_BLOCK_ELEMENTS", 1200)
    buffers, adds = [], []
    original_add = row_gradients.RowGradients.add

    def add(self, ids, grad):
        adds.append(ids.numel())
        buffers.append(self.grad is None)  # a new buffer
        original_add(self, ids, grad)

    monkeypatch.setattr(row_gradients.RowGradients, "add", add)
    torch.manual_seed(0)
    head = HEADS["default"]()
    z, target = batch()
    head(z, target).backward()
    assert sum(buffers) == 1 and len(adds) > 6  # two gathers a block, one buffer
    assert head.weight.grad.layout == torch.strided
    adds.clear()
    sparse = HEADS["sparse"]()
    sparse(z, target).backward()
    assert len(adds) > 6 and sparse.weight.grad.layout == torch.sparse_coo
    assert sparse.weight.grad._nnz() == sum(adds)  # every gathered row, kept as it came
    adds.clear()
    HEADS["tower"]()(z, target).backward()
    assert adds == []  # a tower's parameters take their gradients through autograd


def test_a_gradient_already_there_is_added_to():
    torch.manual_seed(0)
    head = HEADS["default"]()
    z, target = batch()
    head(z, target).backward()
    once = head.weight.grad.clone()
    torch.manual_seed(0)
    head2 = HEADS["default"]()
    head2.weight.grad = once.clone()
    head2(z, target).backward()
    torch.testing.assert_close(head2.weight.grad, 2 * once)


@pytest.mark.parametrize("sparse", [False, True])
def test_the_sink_against_embeddings_backward(sparse):
    """Gathers of several blocks (repeated rows, a 2-D id block) through one sink, and the same
    through ``F.embedding``: equal gradients (row-sparse ones too); rows that are read elsewhere
    too add up."""
    g = torch.Generator().manual_seed(4)
    weight = torch.randn(N, D, generator=g, requires_grad=True)
    ids = [torch.randint(N, (5, 3), generator=g), torch.tensor([[7, 7, 7]]), torch.arange(N)]
    scales = [torch.randn(*i.shape, D, generator=g) for i in ids]
    sink = RowGradientSink.of(weight, sparse)
    loss = sum((sink.gather(i) * s).sum() for i, s in zip(ids, scales, strict=True))
    loss.backward()
    want_weight = weight.detach().clone().requires_grad_(True)
    want = sum(
        (F.embedding(i, want_weight, sparse=sparse) * s).sum()
        for i, s in zip(ids, scales, strict=True)
    )
    want.backward()
    assert weight.grad.layout == want_weight.grad.layout
    torch.testing.assert_close(weight.grad.to_dense(), want_weight.grad.to_dense())
    assert sink.gradients.take() is None  # handed over
    weight[2].sum().backward()  # a read of the table itself adds to it
    torch.testing.assert_close(weight.grad.to_dense()[2], want_weight.grad.to_dense()[2] + 1)


def test_no_sink_without_gradients_or_for_a_frozen_table():
    head = HEADS["default"]()
    with torch.no_grad():
        assert head.row_sink() is None
    head.weight.requires_grad_(False)
    assert head.row_sink() is None
    assert HEADS["tower"]().row_sink() is None
    assert isinstance(HEADS["default"]().row_sink(), RowGradientSink)
    assert HEADS["sparse"]().row_sink().gradients.sparse


def test_without_gradients_the_gathers_are_not_checkpointed(monkeypatch):
    monkeypatch.setattr(chunked, "MAX_BLOCK_ELEMENTS", 5 * M * D)
    head = SampledSoftmaxHead(N, D, num_negatives=M)
    z, ids = torch.randn(40, D), torch.randint(N, (40, M))
    calls = []
    original = head.class_rows
    head.class_rows = lambda i: calls.append(i.shape) or original(i)
    with torch.no_grad():
        blocked = head.candidate_logits(z, ids)
    assert len(calls) == 8 and all(shape == (5, M) for shape in calls)
    monkeypatch.setattr(chunked, "MAX_BLOCK_ELEMENTS", 2**24)
    torch.testing.assert_close(blocked, head.candidate_logits(z, ids), rtol=0, atol=0)
