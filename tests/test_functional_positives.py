"""Several positives per position (``positives="each" | "soft_labels"``) in
``lightning_sampled.functional``, against brute-force objectives of the same form computed from
the materialised logits, position by position."""

import math

import pytest
import torch
import torch.nn.functional as F

from lightning_sampled.functional import full_softmax_loss, sampled_softmax_loss

N, D, P = 17, 5, 3
IGNORE = -100
CONVENTIONS = ["exact_positive", "corrected_all", "tensorflow"]


@pytest.fixture
def problem():
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(N, D, generator=g).requires_grad_()
    bias = torch.randn(N, generator=g)
    z = torch.randn(2, 4, D, generator=g)
    target = torch.stack([torch.randperm(N, generator=g)[:P] for _ in range(8)]).view(2, 4, P)
    target[0, 1, 2] = IGNORE  # two positives
    target[1, 2, 0] = target[1, 2, 2] = IGNORE  # one positive, not in the first column
    target[0, 3] = IGNORE  # no positive: the position is skipped
    return z, weight, bias, target


def exact_reference(z, weight, bias, target, form):
    logits = z @ weight.T + bias
    out = torch.zeros(target.shape[:-1])
    for pos in zip(*torch.nonzero((target != IGNORE).any(-1), as_tuple=True), strict=True):
        s = [c for c in target[pos].tolist() if c != IGNORE]
        row = logits[pos]
        if form == "soft_labels":  # F.cross_entropy with the probabilities 1 / |S|
            soft = torch.zeros(N)
            soft[s] = 1.0 / len(s)
            out[pos] = F.cross_entropy(row[None], soft[None])
        else:
            losses = []
            for p in s:
                others = [c for c in s if c != p]
                losses.append(
                    -torch.log_softmax(
                        row.index_fill(0, torch.tensor(others, dtype=torch.long), -math.inf)
                        if others
                        else row,
                        0,
                    )[p]
                )
            out[pos] = torch.stack(losses).mean()
    return out


def sampled_reference(z, weight, bias, target, ids, log_q, target_log_q, form, convention):
    logits = z @ weight.T + bias
    out = torch.zeros(target.shape[:-1])
    m = ids.shape[-1]
    for pos in zip(*torch.nonzero((target != IGNORE).any(-1), as_tuple=True), strict=True):
        kept = [(i, c) for i, c in enumerate(target[pos].tolist()) if c != IGNORE]
        s = [c for _, c in kept]
        row_ids = ids if ids.dim() == 1 else ids[pos]
        row_q = log_q if log_q.dim() == 1 else log_q[pos]
        neg = logits[pos][row_ids] - (math.log(m) + row_q)
        positive = {c: logits[pos][c] for c in s}
        if convention != "exact_positive":
            positive = {c: logits[pos][c] - (math.log(m) + target_log_q[pos][i]) for i, c in kept}
        remove = convention != "corrected_all"
        in_s = torch.tensor([int(j) in s for j in row_ids])
        if form == "soft_labels":
            negs = torch.where(in_s, -math.inf, neg) if remove else neg
            lse = torch.logsumexp(torch.cat([torch.stack(list(positive.values())), negs]), 0)
            out[pos] = torch.stack([lse - positive[c] for c in s]).mean()
        else:
            losses = []
            for p in s:
                drop = in_s & ((row_ids != p) | remove)
                row = torch.cat([positive[p][None], torch.where(drop, -math.inf, neg)])
                losses.append(torch.logsumexp(row, 0) - positive[p])
            out[pos] = torch.stack(losses).mean()
    return out


@pytest.mark.parametrize("form", ["each", "soft_labels"])
def test_the_exact_loss_of_several_positives_is_the_brute_force_objective(problem, form):
    z, weight, bias, target = problem
    got = full_softmax_loss(
        z, weight, target, bias=bias, positives=form, reduction="none", chunk_size=4
    )
    want = exact_reference(z, weight, bias, target, form)
    torch.testing.assert_close(got, want)
    grad = torch.autograd.grad(got.sum(), weight)[0]
    torch.testing.assert_close(grad, torch.autograd.grad(want.sum(), weight)[0])


@pytest.mark.parametrize("form", ["each", "soft_labels"])
@pytest.mark.parametrize("convention", CONVENTIONS)
@pytest.mark.parametrize("per_position", [False, True], ids=["shared", "per_position"])
def test_the_sampled_loss_of_several_positives_is_the_brute_force_objective(
    problem, form, convention, per_position
):
    z, weight, bias, target = problem
    g = torch.Generator().manual_seed(3)
    shape = (2, 4, 9) if per_position else (9,)
    ids = torch.randint(N, shape, generator=g)
    ids.view(-1)[:4] = target.clamp(min=0).view(-1)[:4]  # co-positives among the negatives
    log_q = torch.rand(shape, generator=g).log() - 2.0
    target_log_q = torch.rand(target.shape, generator=g).log() - 2.0
    got = sampled_softmax_loss(
        z, weight, target, ids, log_q, bias=bias, target_log_q=target_log_q,
        convention=convention, positives=form, reduction="none",
    )  # fmt: skip
    want = sampled_reference(z, weight, bias, target, ids, log_q, target_log_q, form, convention)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("form", ["each", "soft_labels"])
def test_every_class_once_at_uniform_probability_gives_the_exact_objective(problem, form):
    """``"exact_positive"``: no correction at ``M q = 1`` and the positives' own draws masked."""
    z, weight, bias, target = problem
    every, uniform = torch.arange(N), torch.full((N,), -math.log(N))
    sampled = sampled_softmax_loss(
        z, weight, target, every, uniform, bias=bias, positives=form, convention="exact_positive"
    )
    torch.testing.assert_close(
        sampled, full_softmax_loss(z, weight, target, bias=bias, positives=form)
    )


def test_one_positive_in_p_columns_is_the_single_positive_loss(problem):
    z, weight, bias, target = problem
    single = target[..., 0].clone()
    padded = torch.full_like(target, IGNORE)
    padded[..., 1] = single
    for form in ("each", "soft_labels"):
        torch.testing.assert_close(
            full_softmax_loss(z, weight, padded, bias=bias, positives=form),
            full_softmax_loss(z, weight, single, bias=bias),
        )


def test_bad_positives_are_refused(problem):
    z, weight, bias, target = problem
    twice = target.clone()
    twice[1, 0, 1] = twice[1, 0, 0]
    with pytest.raises(ValueError, match="same positive twice"):
        full_softmax_loss(z, weight, twice, positives="each")
    with pytest.raises(ValueError, match=r"target must have shape \(2, 4\) \+ \(P,\)"):
        full_softmax_loss(z, weight, target[0], positives="each")
    with pytest.raises(ValueError, match="positives must be one of"):
        full_softmax_loss(z, weight, target, positives="all")
    with pytest.raises(ValueError, match="label_smoothing"):
        full_softmax_loss(z, weight, target, positives="each", label_smoothing=0.1)
    with pytest.raises(ValueError, match="target_log_q must have the shape of target"):
        sampled_softmax_loss(
            z, weight, target, torch.tensor([1]), torch.zeros(1), positives="each",
            target_log_q=torch.zeros(2, 4), convention="corrected_all",
        )  # fmt: skip
