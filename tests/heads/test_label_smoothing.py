"""``label_smoothing`` on ``FullSoftmaxHead`` against ``F.cross_entropy(label_smoothing=)``, and
its refusal by the sampled heads."""

import math

import pytest
import torch
import torch.nn.functional as F

from lightning_sampled.heads import (
    FullSoftmaxHead,
    OneVsEachHead,
    SampledSoftmaxHead,
    TapasHead,
)

N, D = 53, 6


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make_head(label_smoothing, padding_idx=None, chunk_size=8, **kwargs):
    torch.manual_seed(0)
    head = FullSoftmaxHead(
        N,
        D,
        bias=True,
        padding_idx=padding_idx,
        chunk_size=chunk_size,
        label_smoothing=label_smoothing,
        **kwargs,
    )
    with torch.no_grad():
        head.bias.normal_()
    return head


def plain_logits(head, z):
    return z @ head.weight.T + head.bias


def assert_same_loss_and_grads(loss, ref, params):
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-5)
    for got, want in zip(
        torch.autograd.grad(loss, params), torch.autograd.grad(ref, params), strict=True
    ):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("eps", [0.1, 0.6])
@pytest.mark.parametrize("chunk_size", [1, 8, 100])
def test_equals_cross_entropy_with_label_smoothing(eps, chunk_size):
    head = make_head(eps, chunk_size=chunk_size)
    z = torch.randn(4, 5, D, requires_grad=True)
    y = torch.randint(N, (4, 5))
    y[1, 2] = -100
    ref = F.cross_entropy(plain_logits(head, z).reshape(-1, N), y.reshape(-1), label_smoothing=eps)
    assert_same_loss_and_grads(head(z, y), ref, [z, head.weight, head.bias])


@pytest.mark.parametrize("padding_idx", [0, 17, N - 1])
def test_padding_class_gets_no_smoothing_mass(padding_idx):
    """The uniform share goes to the N - 1 classes other than padding_idx: the loss equals
    F.cross_entropy on the logits without the padding column (F.cross_entropy over all N columns,
    whose padding logit is -inf, would be infinite)."""
    eps = 0.3
    head = make_head(eps, padding_idx=padding_idx)
    z = torch.randn(12, D, requires_grad=True)
    keep = torch.tensor([c for c in range(N) if c != padding_idx])
    y = keep[torch.randint(N - 1, (12,))]
    logits = plain_logits(head, z)
    ref = F.cross_entropy(logits[:, keep], y - (y > padding_idx).long(), label_smoothing=eps)
    loss = head(z, y)
    assert math.isfinite(loss.item())
    assert_same_loss_and_grads(loss, ref, [z, head.weight, head.bias])
    masked = logits.index_fill(1, torch.tensor([padding_idx]), -math.inf)
    assert F.cross_entropy(masked, y, label_smoothing=eps).item() == math.inf


def test_smoothing_with_cosine_logits_temperature_and_weights():
    eps, tau = 0.2, 0.3
    head = make_head(eps, temperature=tau, normalize=True)
    z = torch.randn(10, D, requires_grad=True)
    y = torch.randint(N, (10,))
    w = torch.rand(10)
    logits = F.normalize(z, dim=-1) @ F.normalize(head.weight, dim=-1).T / tau + head.bias
    per_row = F.cross_entropy(logits, y, label_smoothing=eps, reduction="none")
    ref = (w * per_row).sum() / w.sum()
    assert_same_loss_and_grads(head(z, y, w), ref, [z, head.weight, head.bias])


def test_exact_methods_stay_unsmoothed():
    head = make_head(0.4)
    z = torch.randn(8, D)
    y = torch.randint(N, (8,))
    ref = F.cross_entropy(plain_logits(head, z), y)
    torch.testing.assert_close(head.full_loss(z, y), ref, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(head(z, y), ref)


@pytest.mark.parametrize("bad", [-0.1, 1.0, 1.5, math.nan, "0.1", True])
def test_out_of_range_label_smoothing_is_refused(bad):
    with pytest.raises(ValueError, match="label_smoothing"):
        FullSoftmaxHead(N, D, label_smoothing=bad)


@pytest.mark.parametrize(
    "make",
    [
        lambda: SampledSoftmaxHead(N, D, num_negatives=4, label_smoothing=0.1),
        lambda: OneVsEachHead(N, D, num_negatives=4, label_smoothing=0.1),
        lambda: TapasHead(N, D, num_negatives=4, label_smoothing=0.1),
    ],
)
def test_sampled_heads_refuse_label_smoothing(make):
    with pytest.raises(ValueError, match="label_smoothing is not supported"):
        make()


def test_sampled_heads_accept_zero_label_smoothing():
    assert SampledSoftmaxHead(N, D, num_negatives=4, label_smoothing=0.0).label_smoothing == 0.0
