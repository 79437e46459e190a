"""OneVsEachHead: the exact bound, and the stochastic estimate's unbiasedness for it."""

import math

import pytest
import torch
import torch.nn.functional as F
from fake_samplers import PerQueryOnly, restart_draws
from precision_checks import assert_scored_like_fp32
from scipy import stats

from lightning_sampled.heads import OneVsEachHead
from lightning_sampled.samplers import MIDXSampler, Sample, Sampler, UniformSampler, UnigramSampler

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make_head(n, d, *, scale=2.0, seed=0, **kwargs):
    torch.manual_seed(seed)
    head = OneVsEachHead(n, d, **kwargs)
    with torch.no_grad():
        head.weight.normal_(0.0, scale / math.sqrt(d))
        if head.bias is not None:
            head.bias.normal_()
    return head


def brute_bound(head, z, y):
    """sum_{k != y} softplus(f_k - f_y) from the full [T, N] logits (padding excluded)."""
    logits = z @ head.weight.T + (0.0 if head.bias is None else head.bias)
    terms = F.softplus(logits - logits.gather(1, y[:, None]))
    keep = torch.ones_like(terms, dtype=torch.bool)
    keep[torch.arange(len(y)), y] = False
    if head.padding_idx is not None:
        keep[:, head.padding_idx] = False
    return (terms * keep).sum(1)


@pytest.mark.parametrize("bias,padding_idx,chunk_size", [(False, None, 8192), (True, 4, 7)])
def test_exact_bound_is_the_brute_force_sum_and_lies_below_log_softmax(
    bias, padding_idx, chunk_size
):
    head = make_head(37, 6, scale=4.0, bias=bias, padding_idx=padding_idx, chunk_size=chunk_size)
    torch.manual_seed(1)
    z = torch.randn(64, 6) * 2
    y = torch.randint(0, 37, (64,))
    if padding_idx is not None:
        y[y == padding_idx] = 0
    bound = head.bound_nll(z, y)
    torch.testing.assert_close(bound, brute_bound(head, z, y), rtol=1e-5, atol=1e-5)
    log_p = head.log_prob(z, y)
    # the bound is on the probability: -B <= log p, strictly unless two classes remain
    assert bool((-bound <= log_p + 1e-5).all())
    assert bool((-bound < log_p - 1e-3).any())


def test_exact_bound_is_tight_with_two_classes_and_gradients_match_brute_force():
    head = make_head(3, 4, scale=3.0, padding_idx=1, bias=True)  # two drawable classes
    z = torch.randn(10, 4, requires_grad=True)
    y = torch.tensor([0, 2] * 5)
    torch.testing.assert_close(-head.bound_nll(z, y), head.log_prob(z, y), rtol=1e-5, atol=1e-5)

    head = make_head(23, 4, scale=3.0, chunk_size=5)
    head.bound_nll(z, y).sum().backward()
    got = head.weight.grad.clone(), z.grad.clone()
    head.weight.grad, z.grad = None, None
    brute_bound(head, z, y).sum().backward()
    torch.testing.assert_close(got[0], head.weight.grad)
    torch.testing.assert_close(got[1], z.grad)


def test_ignored_positions_are_skipped():
    head = make_head(12, 3)
    z = torch.randn(2, 3, 3)
    y = torch.tensor([[1, -100, 4], [-100, -100, 11]])
    bound = head.bound_nll(z, y)
    assert bound[0, 1] == 0 and bound[1, 0] == 0
    torch.testing.assert_close(bound[y != -100], brute_bound(head, z[y != -100], y[y != -100]))
    loss = head(torch.randn(2, 3, requires_grad=True), torch.tensor([-100, -100]))
    assert loss.item() == 0.0 and loss.requires_grad


def test_default_draws_are_uniform_over_the_classes_other_than_the_target():
    head = make_head(10, 3, num_negatives=50, padding_idx=6)
    y = torch.full((2000,), 3)
    torch.manual_seed(2)
    ids, log_w = head.draw(torch.zeros(2000, 3), y)
    assert not bool(((ids == 3) | (ids == 6)).any())
    counts = torch.bincount(ids.flatten(), minlength=10)
    others = [k for k in range(10) if k not in (3, 6)]
    assert stats.chisquare(counts[others].numpy()).pvalue > 1e-3
    # (N' - 1) / M with N' = 9 drawable classes
    torch.testing.assert_close(log_w, torch.full_like(log_w, math.log(8 / 50)))


def test_without_replacement_all_other_classes_give_the_exact_bound():
    head = make_head(9, 4, num_negatives=7, padding_idx=2, replacement=False, bias=True)
    torch.manual_seed(3)
    z = torch.randn(16, 4)
    y = torch.randint(3, 9, (16,))
    ids, _ = head.draw(z, y)
    assert bool((ids.sort(1).values.diff(dim=1) > 0).all())  # distinct in each row
    torch.testing.assert_close(head(z, y), head.bound_nll(z, y).mean())


def _repeated_estimates(head, z, y, repeats, copies):
    """Batch means of the stochastic loss over ``copies`` of every query."""
    zz, yy = z.repeat(copies, 1), y.repeat(copies)
    with torch.no_grad():
        return torch.stack([head(zz, yy) for _ in range(repeats)]).double()


@pytest.mark.parametrize(
    "sampler,shared,m,copies,repeats",
    [
        (None, False, 4, 200, 60),  # the paper's uniform draws from the other classes
        ("uniform", False, 4, 200, 60),  # uniform over all classes: hits dropped, weight N'/M
        ("unigram", False, 4, 200, 60),  # importance weights 1 / (M q)
        ("unigram", True, 32, 1, 3000),  # shared draws: one estimate per call
        (None, True, 32, 1, 3000),  # shared uniform draws over all classes, hits dropped
    ],
)
def test_stochastic_loss_is_unbiased_for_the_exact_bound(sampler, shared, m, copies, repeats):
    n, d = 30, 5
    torch.manual_seed(4)
    counts = torch.randint(1, 200, (n,)).float() ** 2
    proposal = {
        None: None,
        "uniform": UniformSampler(n, padding_idx=7),
        "unigram": UnigramSampler(counts, alpha=0.75, padding_idx=7),
    }[sampler]
    head = make_head(
        n,
        d,
        num_negatives=m,
        sampler=proposal,
        shared_negatives=shared,
        padding_idx=7,
        bias=True,
        seed=5,
    )
    torch.manual_seed(6)
    z = torch.randn(8, d)
    y = torch.tensor([0, 1, 3, 7 + 1, 12, 19, 25, 29])
    exact = head.bound_nll(z, y).mean().double()
    est = _repeated_estimates(head, z, y, repeats, copies)
    se = est.std() / math.sqrt(repeats)
    assert abs(est.mean() - exact) < 4 * se
    # the interval is tight enough to catch the usual mistakes: weighing draws that may hit the
    # target by (N' - 1) / M (bias B / N'), or keeping the hits (bias ~ log 2)
    assert 4 * se < exact / (n - 1)


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="num_negatives must be <= 9"):
        OneVsEachHead(10, 4, num_negatives=10, replacement=False)
    with pytest.raises(ValueError, match="num_negatives must be <= 8"):
        OneVsEachHead(10, 4, num_negatives=9, replacement=False, padding_idx=0)
    OneVsEachHead(10, 4, num_negatives=9, replacement=False)
    with pytest.raises(ValueError, match="replacement=False"):
        OneVsEachHead(10, 4, UniformSampler(10), num_negatives=3, replacement=False)
    with pytest.raises(ValueError, match="replacement=False"):
        OneVsEachHead(10, 4, num_negatives=3, shared_negatives=True, replacement=False)
    with pytest.raises(ValueError, match="at least 2 drawable classes"):
        OneVsEachHead(2, 4, num_negatives=1, padding_idx=0)
    with pytest.raises(ValueError, match="num_negatives"):
        OneVsEachHead(10, 4, num_negatives=0)
    with pytest.raises(ValueError, match="query-independent"):
        OneVsEachHead(10, 4, PerQueryOnly(10), num_negatives=3, shared_negatives=True)
    with pytest.raises(ValueError, match="num_classes"):
        OneVsEachHead(10, 4, UniformSampler(11), num_negatives=3)


def test_importance_weights_use_the_proposal_and_drop_hits():
    class Fixed(Sampler):
        query_independent = True

        def __init__(self, probs, ids):
            super().__init__(probs.numel())
            self.log_probs, self.ids = probs.log(), ids

        def _sample(self, z, num_samples, shared, generator):
            ids = self.ids if shared else self.ids.expand(z.shape[0], -1)
            return Sample(ids, self.log_probs[ids])

        def _log_prob(self, z, ids):
            return self.log_probs[ids]

    probs = torch.softmax(torch.randn(6), 0)
    draws = torch.tensor([1, 4, 1])
    head = make_head(6, 3, sampler=Fixed(probs, draws), num_negatives=3, bias=True)
    z = torch.randn(2, 3)
    y = torch.tensor([1, 5])
    f = z @ head.weight.T + head.bias
    terms = F.softplus(f[:, draws] - f.gather(1, y[:, None])) / (3 * probs[draws])
    terms[0, [0, 2]] = 0.0  # the draws equal to target 1
    torch.testing.assert_close(head(z, y), terms.sum(1).mean())


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_queries_of_any_float_dtype_outside_autocast_give_the_fp32_loss(dtype, shared):
    """The sampled loss and the exact bound of half-precision ``z`` equal those of the same values
    in fp32 (:func:`precision_checks.assert_scored_like_fp32`)."""
    head = make_head(300, 16, num_negatives=20, bias=True, shared_negatives=shared)
    z, z32, y = assert_scored_like_fp32(head, dtype)
    torch.testing.assert_close(head.bound_nll(z, y), head.bound_nll(z32, y), rtol=1e-6, atol=1e-6)


def test_a_learning_sampler_trains_its_codewords_through_the_head():
    """MIDX-Learn's codewords get the gradient of the sampler's auxiliary loss, which the head
    adds to the bound (as every ProposalHead does)."""
    torch.manual_seed(0)
    sampler = MIDXSampler(60, 4, learnable=True, dim=8, kmeans_iters=3)
    head = OneVsEachHead(60, 8, sampler, 5)
    head.refresh_index()
    z, y = torch.randn(6, 8), torch.randint(60, (6,))
    restart_draws(head, 1)
    loss = head(z, y)
    restart_draws(head, 1)
    ids, log_w = head.draw(head.score_queries(z), y)
    pos, neg = head.target_and_candidate_logits(z, y, ids)
    bound = (torch.nn.functional.softplus(neg - pos[:, None]) * log_w.exp()).sum(1).mean()
    torch.testing.assert_close(loss, bound + sampler.auxiliary_loss(z, head.weight))
    loss.backward()
    assert sampler.codewords.grad is not None and bool(sampler.codewords.grad.abs().sum() > 0)
