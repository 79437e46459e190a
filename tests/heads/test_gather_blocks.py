"""Per-query candidates are gathered a block of positions at a time (``candidate_logits``), under
activation checkpointing: the loss and every gradient equal the single gather's, and no tensor
kept for backward holds the whole ``[T, M, D]`` gathered vectors (or any gathered block at all:
the checkpointed blocks keep their inputs only)."""

import pytest
import torch
from torch import nn

from lightning_sampled.heads import OneVsEachHead, SampledSoftmaxHead
from lightning_sampled.ops import chunked
from lightning_sampled.samplers import UnigramSampler

N, D, T, M = 60, 8, 40, 6


def tower():
    torch.manual_seed(5)
    return nn.Sequential(nn.Embedding(N, D), nn.Linear(D, D))


HEADS = {
    "default": lambda: SampledSoftmaxHead(N, D, num_negatives=M, bias=True),
    "plain_unigram": lambda: SampledSoftmaxHead(
        N, D, UnigramSampler(torch.arange(1.0, N + 1)), M, in_batch_negatives=False
    ),
    "sparse": lambda: SampledSoftmaxHead(N, D, num_negatives=M, sparse_grad=True),
    "tower": lambda: SampledSoftmaxHead(N, D, num_negatives=M, candidate_encoder=tower()),
    "one_vs_each": lambda: OneVsEachHead(N, D, num_negatives=M),
}


def step(name, block_elements, monkeypatch):
    """Loss, gradients and the largest 3-D tensor saved for backward, with blocks of at most
    ``block_elements`` gathered entries."""
    monkeypatch.setattr(chunked, "MAX_BLOCK_ELEMENTS", block_elements)
    torch.manual_seed(0)
    head = HEADS[name]()
    g = torch.Generator().manual_seed(1)
    z = torch.randn(T, D, generator=g, requires_grad=True)
    target = torch.randint(N, (T,), generator=g)
    largest = []

    def pack(t):  # the gathered candidate vectors are the [t, M', D] tensors
        largest.append(t.numel() if t.dim() == 3 else 0)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = head(z, target)
    loss.backward()
    grads = [z.grad] + [p.grad.to_dense() for p in head.parameters() if p.grad is not None]
    return loss.detach(), grads, max(largest)


@pytest.mark.parametrize("name", list(HEADS))
def test_blocks_of_positions_give_the_single_gathers_loss_and_gradients(name, monkeypatch):
    whole, whole_grads, whole_saved = step(name, 2**24, monkeypatch)
    blocked, blocked_grads, blocked_saved = step(name, 5 * (M + 1) * D, monkeypatch)  # 8 blocks
    torch.testing.assert_close(blocked, whole, rtol=1e-6, atol=1e-6)
    assert len(blocked_grads) == len(whole_grads) >= 2
    for got, want in zip(blocked_grads, whole_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert whole_saved >= T * M * D  # the single gather keeps [T, M (+1), D] for backward
    assert blocked_saved == 0


def test_without_gradients_the_blocks_are_not_checkpointed(monkeypatch):
    monkeypatch.setattr(chunked, "MAX_BLOCK_ELEMENTS", 5 * M * D)
    head = SampledSoftmaxHead(N, D, num_negatives=M)
    z, ids = torch.randn(T, D), torch.randint(N, (T, M))
    calls = []
    original = head.class_rows
    head.class_rows = lambda i: calls.append(i.shape) or original(i)
    with torch.no_grad():
        blocked = head.candidate_logits(z, ids)
    assert len(calls) == 8 and all(shape == (5, M) for shape in calls)
    monkeypatch.setattr(chunked, "MAX_BLOCK_ELEMENTS", 2**24)
    torch.testing.assert_close(blocked, head.candidate_logits(z, ids), rtol=0, atol=0)
