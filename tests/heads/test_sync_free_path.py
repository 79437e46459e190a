"""The sync-free path that CUDA tensors take (``_validation.sync_free``), run on the CPU: all
positions kept and weighted (no boolean indexing), checks by ``torch._assert_async``."""

import pytest
import torch
from fake_samplers import restart_draws

from lightning_sampled import _validation
from lightning_sampled.heads import SampledSoftmaxHead
from lightning_sampled.ops import inputs
from lightning_sampled.samplers import MIDXSampler


@pytest.fixture
def sync_free(monkeypatch):
    for module in (_validation, inputs):
        monkeypatch.setattr(module, "sync_free", lambda x: True)


def head_and_batch(sampler: str):
    torch.manual_seed(0)
    n, d = 300, 8
    proposal = MIDXSampler(n, 4, "rq") if sampler == "midx" else None
    head = SampledSoftmaxHead(n, d, proposal, 20, ignore_index=-1)
    head.refresh_index()
    z = torch.randn(6, 5, d, requires_grad=True)
    target = torch.randint(n, (6, 5))
    target[-1] = -1  # ignored positions last: the kept ones draw the same negatives
    return head, z, target, torch.rand(6, 5)


def loss_and_grads(head, z, target, weight):
    restart_draws(head, 1)
    loss = head(z, target, weight)
    grads = torch.autograd.grad(loss, [z, head.weight])
    return loss, grads


@pytest.mark.parametrize("weighted", [False, True])
def test_keeping_every_position_gives_the_masked_loss(weighted, monkeypatch):
    head, z, target, weight = head_and_batch("uniform")
    weight = weight if weighted else None
    expected = loss_and_grads(head, z, target, weight)
    for module in (_validation, inputs):
        monkeypatch.setattr(module, "sync_free", lambda x: True)
    loss, grads = loss_and_grads(head, z, target, weight)
    torch.testing.assert_close(loss, expected[0])
    for got, want in zip(grads, expected[1], strict=True):
        torch.testing.assert_close(got, want)


def test_midx_ignored_positions_get_no_gradient(sync_free):
    head, z, target, weight = head_and_batch("midx")
    loss, (grad_z, _) = loss_and_grads(head, z, target, weight)
    assert torch.isfinite(loss)
    assert torch.equal(grad_z[-1], torch.zeros_like(grad_z[-1]))
    assert bool((grad_z[:-1].abs().sum(-1) > 0).all())


def test_bad_input_is_an_asynchronous_runtime_error(sync_free):
    head, z, target, _ = head_and_batch("uniform")
    target[0, 0] = 300
    with pytest.raises(RuntimeError, match="target must be in"):
        head(z, target)
    with pytest.raises(RuntimeError, match="z contains NaN"):
        head(torch.full_like(z, float("nan")), target.clamp(max=299))
