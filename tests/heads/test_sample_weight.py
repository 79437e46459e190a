"""``sample_weight``: every head's loss is ``sum(w * loss) / sum(w)`` of its per-position losses
over the scored positions."""

import math

import pytest
import torch
import torch.nn.functional as F
from fake_samplers import restart_draws

from lightning_sampled.heads import (
    FullSoftmaxHead,
    OneVsEachHead,
    SampledSoftmaxHead,
    TapasHead,
)

N, D = 41, 6


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def batch(seed=0):
    """``z`` ``[3, 4, D]``, targets with two ignored positions, and weights that are non-zero
    at the ignored positions (they must not count) and zero at one scored position."""
    torch.manual_seed(seed)
    z = torch.randn(3, 4, D, requires_grad=True)
    y = torch.randint(N, (3, 4))
    y[0, 1] = y[2, 3] = -100
    w = torch.rand(3, 4) * 3
    w[1, 1] = 0.0
    return z, y, w


def weighted(per_position, y, w):
    mask = y != -100
    return (per_position[mask] * w[mask]).sum() / w[mask].sum()


def assert_same_loss_and_grads(loss, ref, params):
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    for got, want in zip(
        torch.autograd.grad(loss, params), torch.autograd.grad(ref, params), strict=True
    ):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_full_head_matches_weighted_cross_entropy():
    z, y, w = batch()
    head = FullSoftmaxHead(N, D, bias=True, chunk_size=7)

    def reference():
        logits = (z @ head.weight.T + head.bias).reshape(-1, N)
        per_position = F.cross_entropy(logits, y.reshape(-1), reduction="none")
        return weighted(per_position.reshape(3, 4), y, w)

    params = [z, head.weight, head.bias]
    assert_same_loss_and_grads(head(z, y, w), reference(), params)
    assert_same_loss_and_grads(head.full_loss(z, y, sample_weight=w), reference(), params)


@pytest.mark.parametrize("shared", [False, True])
def test_sampled_head_matches_its_per_position_losses(shared):
    z, y, w = batch(1)
    head = SampledSoftmaxHead(N, D, num_negatives=5, shared_negatives=shared)
    mask = y != -100
    restart_draws(head, 11)
    logits = head.sampled_logits(head.score_queries(z[mask]), y[mask])
    per_position = torch.zeros(3, 4).masked_scatter(mask, torch.logsumexp(logits, 1) - logits[:, 0])
    ref = weighted(per_position, y, w)
    restart_draws(head, 11)
    assert_same_loss_and_grads(head(z, y, w), ref, [z, head.weight])


def test_sampled_head_full_loss_takes_weights():
    z, y, w = batch(2)
    head = SampledSoftmaxHead(N, D, num_negatives=5)
    per_position = -head.log_prob(z, y)
    ref = weighted(per_position, y, w)
    assert_same_loss_and_grads(head.full_loss(z, y, w), ref, [z, head.weight])


def test_one_vs_each_matches_its_exact_bound_per_position():
    """Without replacement and M = N - 1 the estimate is the exact bound at every position."""
    z, y, w = batch(3)
    head = OneVsEachHead(N, D, num_negatives=N - 1, replacement=False)
    ref = weighted(head.bound_nll(z, y), y, w)
    assert_same_loss_and_grads(head(z, y, w), ref, [z, head.weight])


def test_tapas_matches_its_per_position_losses():
    """r n covering every class makes both passes deterministic."""
    z, y, w = batch(4)
    head = TapasHead(N, D, num_negatives=8, presample_factor=N)
    mask = y != -100
    logits = head.sampled_logits(head.score_queries(z[mask]), y[mask])
    per_position = torch.zeros(3, 4).masked_scatter(mask, torch.logsumexp(logits, 1) - logits[:, 0])
    assert_same_loss_and_grads(head(z, y, w), weighted(per_position, y, w), [z, head.weight])


def test_unit_weights_change_nothing():
    z, y, _ = batch(5)
    head = FullSoftmaxHead(N, D)
    torch.testing.assert_close(head(z, y, torch.ones(3, 4)), head(z, y))


@pytest.mark.parametrize("scale", [1e38, 1e-45], ids=["huge", "denormal"])
def test_the_loss_and_gradients_do_not_depend_on_the_weights_scale(scale):
    """All weights 1e38 used to overflow the sums (NaN); all 1e-45 (fp32 denormals) gave 2.5
    where the loss is 2.23."""
    head = FullSoftmaxHead(N, D)
    z, y, _ = batch()

    def loss_and_grad(weights):
        loss = head(z, y, weights)
        return loss, torch.autograd.grad(loss, z)[0]

    ones = torch.ones(y.shape)
    for got, want in zip(loss_and_grad(ones * scale), loss_and_grad(ones), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


def test_every_position_ignored_gives_zero():
    z, y, w = batch(6)
    y[:] = -100
    assert FullSoftmaxHead(N, D)(z, y, w).item() == 0.0


@pytest.mark.parametrize(
    "head",
    [
        FullSoftmaxHead(N, D),
        SampledSoftmaxHead(N, D, num_negatives=3),
        OneVsEachHead(N, D, num_negatives=3),
        TapasHead(N, D, num_negatives=3),
    ],
    ids=lambda head: type(head).__name__,
)
def test_bad_weights_are_refused(head):
    z, y, w = batch(7)
    negative = w.clone()
    negative[0, 0] = -0.5
    with pytest.raises(ValueError, match="sample_weight must be non-negative"):
        head(z, y, negative)
    zero_where_scored = torch.zeros(3, 4)
    zero_where_scored[0, 1] = 1.0  # an ignored position: does not count
    with pytest.raises(ValueError, match="sample_weight is 0 at all 10 scored positions"):
        head(z, y, zero_where_scored)
    with pytest.raises(ValueError, match=r"sample_weight must be a tensor of shape \(3, 4\)"):
        head(z, y, w.reshape(-1))
    with pytest.raises(ValueError, match="sample_weight contains NaN"):
        head(z, y, w.masked_fill(w > 1, math.nan))
    with pytest.raises(ValueError, match="sample_weight must be real numbers"):
        head(z, y, w > 1)
