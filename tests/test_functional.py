"""``lightning_sampled.functional`` and the caller's own negatives on ``SampledSoftmaxHead``,
against plain PyTorch references built here from materialised logits."""

import math

import pytest
import torch
import torch.nn.functional as F

from lightning_sampled.functional import full_softmax_loss, sampled_softmax_loss
from lightning_sampled.heads import SampledSoftmaxHead

N, D = 23, 6
IGNORE = -100


@pytest.fixture
def problem():
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(N, D, generator=g).requires_grad_()
    bias = torch.randn(N, generator=g).requires_grad_()
    z = torch.randn(3, 4, D, generator=g).requires_grad_()
    target = torch.randint(N, (3, 4), generator=g)
    target[0, 2] = target[2, 0] = IGNORE
    sample_weight = torch.rand(3, 4, generator=g) + 0.1
    return z, weight, bias, target, sample_weight


def reduced(losses, target, sample_weight, reduction):
    """The reference reduction of per-position ``losses`` ``[...]``."""
    mask = target != IGNORE
    weighted = torch.where(mask, losses * sample_weight, 0.0)
    if reduction == "none":
        return weighted
    if reduction == "sum":
        return weighted.sum()
    return weighted.sum() / sample_weight[mask].sum()


def reference_sampled(
    z, weight, bias, target, ids, log_q, convention, target_log_q=None, hard=None
):
    """Per-position sampled softmax losses ``[...]`` from the full logit matrix, position by
    position (0 where ignored)."""
    logits = z @ weight.T + bias
    m = ids.shape[-1]
    out = torch.zeros(target.shape)
    for pos in zip(*torch.nonzero(target != IGNORE, as_tuple=True), strict=True):
        y = target[pos]
        row_ids = ids if ids.dim() == 1 else ids[pos]
        row_log_q = log_q if log_q.dim() == 1 else log_q[pos]
        negatives = logits[pos][row_ids] - (math.log(m) + row_log_q)
        if convention != "corrected_all":
            negatives = torch.where(row_ids == y, -math.inf, negatives)
        if hard is not None:
            negatives = negatives.sort(descending=True).values[:hard]
        positive = logits[pos][y]
        if convention != "exact_positive":
            positive = positive - (math.log(m) + target_log_q[pos])
        out[pos] = -torch.log_softmax(torch.cat([positive[None], negatives]), 0)[0]
    return out


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
def test_full_softmax_loss_is_cross_entropy_of_the_logits(problem, reduction, label_smoothing):
    z, weight, bias, target, w = problem
    got = full_softmax_loss(
        z, weight, target, bias=bias, label_smoothing=label_smoothing, sample_weight=w,
        reduction=reduction, chunk_size=5,
    )  # fmt: skip
    logits = z @ weight.T + bias
    per = F.cross_entropy(
        logits.reshape(-1, N), target.reshape(-1), reduction="none", label_smoothing=label_smoothing
    ).reshape(target.shape)
    want = reduced(per, target, w, reduction)
    torch.testing.assert_close(got, want)
    grads = torch.autograd.grad(got.sum(), (z, weight, bias))
    for a, b in zip(grads, torch.autograd.grad(want.sum(), (z, weight, bias)), strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("convention", ["exact_positive", "corrected_all", "tensorflow"])
@pytest.mark.parametrize("per_position", [False, True], ids=["shared", "per_position"])
@pytest.mark.parametrize("hard", [None, 3])
def test_sampled_softmax_loss_matches_the_reference_and_the_head(
    problem, convention, per_position, hard
):
    z, weight, bias, target, w = problem
    g = torch.Generator().manual_seed(1)
    shape = (*target.shape, 7) if per_position else (7,)
    ids = torch.randint(N, shape, generator=g)
    ids.view(-1)[:3] = target.clamp(min=0).view(-1)[:3]  # accidental hits
    log_q = torch.rand(shape, generator=g).log() - 2.0
    target_log_q = torch.rand(target.shape, generator=g).log() - 2.0
    options = dict(target_log_q=target_log_q, convention=convention, num_hard_negatives=hard)
    got = sampled_softmax_loss(
        z, weight, target, ids, log_q, bias=bias, sample_weight=w, reduction="none", **options
    )
    per = reference_sampled(z, weight, bias, target, ids, log_q, convention, target_log_q, hard)
    torch.testing.assert_close(got, reduced(per, target, w, "none"))
    mean = sampled_softmax_loss(
        z, weight, target, ids, log_q, bias=bias, sample_weight=w, **options
    )
    torch.testing.assert_close(mean, reduced(per, target, w, "mean"))
    # the head scores the caller's negatives through the same functions
    head = SampledSoftmaxHead(N, D, num_negatives=2, convention=convention, bias=True)
    with torch.no_grad():
        head.weight.copy_(weight)
        head.bias.copy_(bias)
    on_head = head(
        z, target, w, negatives=ids, negative_log_q=log_q, target_log_q=target_log_q,
        num_hard_negatives=hard,
    )  # fmt: skip
    torch.testing.assert_close(on_head, mean)


def test_every_class_once_under_its_uniform_probability_is_the_full_softmax(problem):
    """``"exact_positive"``: no correction at ``M q = 1`` and the target's own draw masked."""
    z, weight, bias, target, w = problem
    every = torch.arange(N)
    uniform = torch.full((N,), -math.log(N))
    sampled = sampled_softmax_loss(
        z, weight, target, every, uniform, bias=bias, sample_weight=w, convention="exact_positive"
    )
    torch.testing.assert_close(
        sampled, full_softmax_loss(z, weight, target, bias=bias, sample_weight=w)
    )


def test_only_the_scored_rows_get_a_gradient(problem):
    z, weight, bias, target, _ = problem
    ids = torch.tensor([1, 4])
    target_log_q = torch.zeros(target.shape)  # the default corrects the positive
    sampled_softmax_loss(
        z, weight, target, ids, torch.zeros(2), bias=bias, target_log_q=target_log_q
    ).backward()
    touched = set(target[target != IGNORE].tolist()) | {1, 4}
    rows = set(torch.nonzero(weight.grad.abs().sum(1)).view(-1).tolist())
    assert rows == touched


def test_bad_negatives_are_refused_by_name(problem):
    z, weight, bias, target, _ = problem
    ids, log_q = torch.tensor([1, 2]), torch.zeros(2)
    with pytest.raises(ValueError, match="negative_log_q"):
        sampled_softmax_loss(z, weight, target, ids, None)
    with pytest.raises(ValueError, match="negative_log_q must have the shape"):
        sampled_softmax_loss(z, weight, target, ids, torch.zeros(3))
    with pytest.raises(ValueError, match="per-position negatives must have shape"):
        sampled_softmax_loss(z, weight, target, torch.zeros(3, 5, 2).long(), torch.zeros(3, 5, 2))
    with pytest.raises(IndexError, match="negatives"):
        sampled_softmax_loss(z, weight, target, torch.tensor([1, N]), log_q)
    with pytest.raises(ValueError, match="negative_log_q contains inf"):
        sampled_softmax_loss(z, weight, target, ids, torch.tensor([0.0, -math.inf]))
    with pytest.raises(ValueError, match="target_log_q"):
        sampled_softmax_loss(z, weight, target, ids, log_q, convention="corrected_all")
    with pytest.raises(ValueError, match="num_hard_negatives"):
        sampled_softmax_loss(z, weight, target, ids, log_q, num_hard_negatives=0)
    head = SampledSoftmaxHead(N, D, num_negatives=2, padding_idx=3)
    with pytest.raises(IndexError, match="padding_idx"):
        head(z, target, negatives=torch.tensor([3]), negative_log_q=torch.zeros(1))
    with pytest.raises(ValueError, match="go with negatives="):
        head(z, target, num_hard_negatives=2)
    in_batch = SampledSoftmaxHead(N, D, num_negatives=2, in_batch_negatives=True)
    with pytest.raises(ValueError, match="in_batch_negatives"):
        in_batch(z, target, negatives=ids, negative_log_q=log_q)


@pytest.mark.parametrize("smoothing", [1.0, 1.5, -0.2, math.nan, True, "0.1"])
def test_full_softmax_loss_refuses_the_label_smoothing_the_heads_refuse(problem, smoothing):
    """As the heads and ``F.cross_entropy``: label smoothing in ``[0, 1)``; a number outside it
    used to give a loss."""
    z, weight, _, target, _ = problem
    with pytest.raises(ValueError, match="label_smoothing must be a number in"):
        full_softmax_loss(z, weight, target, label_smoothing=smoothing)


@pytest.mark.parametrize("chunk_size", [0, -4, 2.5, "8"])
def test_full_softmax_loss_refuses_a_chunk_size_below_one_by_name(problem, chunk_size):
    """``chunk_size=0`` used to fail inside ``range`` ("arg 3 must not be zero"), -4 with
    "negative dimension"."""
    z, weight, _, target, _ = problem
    with pytest.raises(ValueError, match="chunk_size must be a positive integer"):
        full_softmax_loss(z, weight, target, chunk_size=chunk_size)


def test_a_head_with_given_negatives_trains_the_rows_it_scores():
    torch.manual_seed(0)
    head = SampledSoftmaxHead(N, D, num_negatives=5, sparse_grad=True)
    z = torch.randn(4, D)
    target = torch.tensor([0, 1, 2, 3])
    hard = torch.tensor([[5, 6], [7, 8], [9, 10], [11, 12]])
    head(
        z, target, negatives=hard, negative_log_q=torch.zeros(4, 2), target_log_q=torch.zeros(4)
    ).backward()
    grad = head.weight.grad.coalesce()
    # the targets and the given negatives, nothing drawn
    assert sorted(set(grad.indices()[0].tolist())) == [0, 1, 2, 3, *range(5, 13)]
