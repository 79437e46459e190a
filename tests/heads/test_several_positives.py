"""Several positives per position on the heads: ``SampledSoftmaxHead(..)(z, target [..., P],
positives=...)`` over drawn or given negatives equals the functional form (itself tested against
brute force in ``tests/test_functional_positives.py``), every head's ``full_loss`` gives the exact
objective, the sampled loss tends to it as ``M`` grows, and the heads that cannot take them
say so."""

import math

import pytest
import torch
from fake_samplers import Stream

from lightning_sampled.functional import full_softmax_loss, sampled_softmax_loss
from lightning_sampled.heads import (
    CaneHead,
    FullSoftmaxHead,
    SampledSoftmaxHead,
    TapasHead,
)
from lightning_sampled.samplers import UniformSampler

N, D, P = 19, 6, 3
IGNORE = -100
FORMS = ["each", "soft_labels"]


def positives_batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(2, 3, D, generator=g)
    target = torch.stack([torch.randperm(N, generator=g)[:P] for _ in range(6)]).view(2, 3, P)
    target[0, 0, 1:] = IGNORE
    target[1, 1] = IGNORE
    return z, target


def with_table(head, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        head.weight.copy_(torch.randn(N, D, generator=g) * 0.7)
        if head.bias is not None:
            head.bias.copy_(torch.randn(N, generator=g))
    return head


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("convention", ["exact_positive", "corrected_all", "tensorflow"])
@pytest.mark.parametrize("shared", [True, False])
def test_drawn_negatives_give_the_functional_loss_of_the_same_draws(form, convention, shared):
    z, target = positives_batch()
    probs = torch.rand(N, generator=torch.Generator().manual_seed(5)) + 0.1
    probs = probs / probs.sum()
    stream = torch.tensor([3, 7, 7, target[0, 1, 0].item(), 11, 0, 5, 2])
    head = SampledSoftmaxHead(
        N, D, Stream(probs, stream), 8, convention=convention, bias=True, shared_negatives=shared
    )
    with_table(head)
    got = head(z, target, positives=form, reduction="none")
    want = sampled_softmax_loss(
        z, head.weight, target, stream, probs.log()[stream], bias=head.bias,
        target_log_q=probs.log()[target.clamp(min=0)], convention=convention, positives=form,
        reduction="none",
    )  # fmt: skip
    torch.testing.assert_close(got, want)
    assert torch.equal(got[1, 1], torch.tensor(0.0))


@pytest.mark.parametrize("form", FORMS)
def test_given_negatives_and_the_exact_loss_match_the_functional_form(form):
    z, target = positives_batch()
    head = with_table(SampledSoftmaxHead(N, D, num_negatives=4, bias=True))
    ids = torch.randint(N, (2, 3, 5), generator=torch.Generator().manual_seed(2))
    log_q = torch.full(ids.shape, -math.log(N))
    target_log_q = torch.full(target.shape, -math.log(N))  # the default corrects the positives
    w = torch.rand(2, 3) + 0.5
    got = head(
        z, target, w, negatives=ids, negative_log_q=log_q, target_log_q=target_log_q,
        positives=form,
    )  # fmt: skip
    want = sampled_softmax_loss(
        z, head.weight, target, ids, log_q, bias=head.bias, target_log_q=target_log_q,
        positives=form, sample_weight=w,
    )  # fmt: skip
    torch.testing.assert_close(got, want)
    exact = full_softmax_loss(z, head.weight, target, bias=head.bias, positives=form)
    torch.testing.assert_close(head.full_loss(z, target, positives=form), exact)
    full = with_table(FullSoftmaxHead(N, D, bias=True, chunk_size=4))
    torch.testing.assert_close(full(z, target, positives=form), exact)
    torch.testing.assert_close(full.full_loss(z, target, positives=form), exact)


@pytest.mark.parametrize("form", FORMS)
def test_the_sampled_loss_tends_to_the_exact_one_as_m_grows(form):
    """Under ``"exact_positive"`` the loss itself estimates the exact loss (the other
    conventions' positive, corrected by ``log(M q_y)``, shifts its value, not its gradient)."""
    z, target = positives_batch(3)
    head = with_table(
        SampledSoftmaxHead(N, D, UniformSampler(N), 20_000, convention="exact_positive")
    )
    torch.manual_seed(0)
    sampled = head(z, target, positives=form)
    exact = head.full_loss(z, target, positives=form)
    assert abs(sampled.item() - exact.item()) < 0.01 * exact.item(), (sampled, exact)
    small = SampledSoftmaxHead(N, D, UniformSampler(N), 3, convention="exact_positive")
    small.load_state_dict(head.state_dict())
    assert abs(small(z, target, positives=form).item() - exact.item()) > 0.01 * exact.item()


def test_heads_without_several_positives_refuse_them_but_their_full_loss_takes_them():
    z, target = positives_batch()
    tapas = TapasHead(N, D, num_negatives=4)
    cane = CaneHead(N, D, num_candidates=3, num_noise=3)
    cane.refresh_index()
    for head in (tapas, cane):
        with pytest.raises(ValueError, match="one positive per position"):
            head(z, target, positives="each")
        assert torch.isfinite(head.full_loss(z, target, positives="each"))
    in_batch = SampledSoftmaxHead(N, D, num_negatives=2, in_batch_negatives=True)
    with pytest.raises(ValueError, match="in_batch_negatives"):
        in_batch(z, target, positives="each")
    with pytest.raises(ValueError, match="label_smoothing"):
        FullSoftmaxHead(N, D, label_smoothing=0.1)(z, target, positives="each")


@pytest.mark.parametrize("form", FORMS)
def test_a_head_that_draws_nothing_refuses_several_positives_saying_why(form):
    """``num_negatives=0`` (the batch's targets as the only negatives) draws nothing, and the
    batch is not used with several positives: it used to fail in the sampler with "num_samples
    must be a positive integer, got 0". Given negatives still work."""
    z, target = positives_batch()
    head = with_table(SampledSoftmaxHead(N, D, num_negatives=0))
    with pytest.raises(ValueError, match=r"this head draws none \(num_negatives=0"):
        head(z, target, positives=form)
    ids = torch.tensor([1, 4, 7])
    loss = head(z, target, positives=form, negatives=ids, negative_log_q=torch.full((3,), -2.0),
                target_log_q=torch.full(target.shape, -2.0))  # fmt: skip
    assert torch.isfinite(loss)
