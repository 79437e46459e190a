"""``temperature`` and ``normalize`` (cosine logits): every head path against a plain-PyTorch
reference ``normalize(z) . normalize(w) / temperature + b``."""

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
from lightning_sampled.samplers import MIDXSampler, UniformSampler

N, D = 61, 8
SETTINGS = [(0.5, False), (1.0, True), (0.2, True)]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def with_random_bias(head):
    with torch.no_grad():
        head.bias.normal_()
    return head


def reference_logits(head, z, temperature, normalize):
    """``normalize(z) . normalize(w) / temperature + b`` with ``-inf`` at the padding class."""
    q = F.normalize(z, dim=-1) if normalize else z
    w = F.normalize(head.weight, dim=-1) if normalize else head.weight
    logits = q @ w.T / temperature
    if head.bias is not None:
        logits = logits + head.bias
    if head.padding_idx is not None:
        logits = logits.index_fill(-1, torch.tensor([head.padding_idx]), -math.inf)
    return logits


def params_of(head, z):
    return [z, head.weight] + ([head.bias] if head.bias is not None else [])


def assert_same_loss_and_gradients(loss, ref, params):
    """``loss`` equals the reference ``ref`` and so do their gradients to ``params``."""
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-5)
    for got, want in zip(
        torch.autograd.grad(loss, params), torch.autograd.grad(ref, params), strict=True
    ):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("temperature, normalize", SETTINGS)
@pytest.mark.parametrize("padding_idx", [None, 3])
def test_full_head_loss_and_gradients_match_the_reference(temperature, normalize, padding_idx):
    torch.manual_seed(0)
    head = FullSoftmaxHead(
        N,
        D,
        bias=True,
        padding_idx=padding_idx,
        chunk_size=7,
        temperature=temperature,
        normalize=normalize,
    )
    with_random_bias(head)
    z = (3.0 * torch.randn(5, 4, D)).requires_grad_()
    y = torch.randint(4, N, (5, 4))
    y[0, 0] = -100
    loss = head(z, y)
    ref = F.cross_entropy(
        reference_logits(head, z, temperature, normalize).reshape(-1, N), y.reshape(-1)
    )
    assert_same_loss_and_gradients(loss, ref, params_of(head, z))


@pytest.mark.parametrize("temperature, normalize", SETTINGS)
def test_exact_methods_agree_with_the_reference(temperature, normalize):
    torch.manual_seed(1)
    head = FullSoftmaxHead(
        N, D, bias=True, padding_idx=0, chunk_size=9, temperature=temperature, normalize=normalize
    )
    with_random_bias(head)
    z = 2.0 * torch.randn(3, 5, D)
    y = torch.randint(1, N, (3, 5))
    ref = reference_logits(head, z, temperature, normalize)
    torch.testing.assert_close(head.logits(z), ref, rtol=1e-5, atol=1e-5)
    ref_log_prob = torch.log_softmax(ref, -1).gather(-1, y[..., None])[..., 0]
    torch.testing.assert_close(head.log_prob(z, y), ref_log_prob, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(head.full_loss(z, y), -ref_log_prob.mean(), rtol=1e-5, atol=1e-5)
    values, indices = head.topk(z, 6)
    ref_values, ref_indices = ref.topk(6, dim=-1)
    torch.testing.assert_close(values, ref_values, rtol=1e-5, atol=1e-5)
    assert torch.equal(indices, ref_indices)


@pytest.mark.parametrize("temperature, normalize", SETTINGS)
def test_sampled_heads_score_candidates_like_the_reference(temperature, normalize):
    torch.manual_seed(2)
    head = SampledSoftmaxHead(
        N, D, num_negatives=5, bias=True, temperature=temperature, normalize=normalize
    )
    with_random_bias(head)
    z = 2.0 * torch.randn(6, D)
    y = torch.randint(N, (6,))
    ids = torch.randint(N, (6, 5))
    ref = reference_logits(head, z, temperature, normalize)
    queries = head.score_queries(z)
    pos, neg = head.target_and_candidate_logits(queries, y, ids)
    torch.testing.assert_close(pos, ref.gather(1, y[:, None])[:, 0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(neg, ref.gather(1, ids), rtol=1e-5, atol=1e-5)
    shared = torch.randint(N, (7,))
    pos, neg = head.target_and_candidate_logits(queries, y, shared)
    torch.testing.assert_close(neg, ref[:, shared], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("temperature, normalize", SETTINGS)
def test_sampled_loss_with_every_class_drawn_is_the_full_loss(temperature, normalize):
    """Shared negatives that are every class once (``M = N``, uniform ``q``: no correction), the
    target's own draw masked (``"exact_positive"``): the sampled loss is then exactly the full
    cross-entropy of the head's logits."""

    class EveryClass(UniformSampler):
        def _sample(self, z, num_samples, shared, generator):
            ids = torch.arange(num_samples) % self.num_classes
            return super()._sample(z, num_samples, shared, generator)._replace(ids=ids)

    torch.manual_seed(3)
    head = SampledSoftmaxHead(
        N,
        D,
        EveryClass(N),
        num_negatives=N,
        shared_negatives=True,
        convention="exact_positive",
        in_batch_negatives=False,  # every class drawn: the plain sampled loss is the full one
        bias=True,
        temperature=temperature,
        normalize=normalize,
    )
    with_random_bias(head)
    z = (2.0 * torch.randn(9, D)).requires_grad_()
    y = torch.randint(N, (9,))
    ref = F.cross_entropy(reference_logits(head, z, temperature, normalize), y)
    loss = head(z, y)
    assert_same_loss_and_gradients(loss, ref, params_of(head, z))


@pytest.mark.parametrize("temperature, normalize", SETTINGS)
def test_one_vs_each_bound_uses_the_head_logits(temperature, normalize):
    torch.manual_seed(4)
    head = OneVsEachHead(
        N,
        D,
        num_negatives=N - 1,
        replacement=False,
        bias=True,
        temperature=temperature,
        normalize=normalize,
    )
    with_random_bias(head)
    z = 2.0 * torch.randn(7, D)
    y = torch.randint(N, (7,))
    ref_logits = reference_logits(head, z, temperature, normalize)
    target_logit = ref_logits.gather(1, y[:, None])
    terms = F.softplus(ref_logits - target_logit).scatter(1, y[:, None], 0.0)
    ref = terms.sum(1)
    torch.testing.assert_close(head.bound_nll(z, y), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(head(z, y), ref.mean(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("temperature, normalize", SETTINGS)
def test_tapas_batch_scores_use_the_head_logits(temperature, normalize):
    torch.manual_seed(5)
    tau = 0.7
    head = TapasHead(
        N,
        D,
        num_negatives=10,
        presample_factor=2,
        selection_temperature=tau,
        bias=True,
        temperature=temperature,
        normalize=normalize,
    )
    with_random_bias(head)
    z = 2.0 * torch.randn(7, D)
    candidates = torch.arange(0, N, 3)
    ref = torch.logsumexp(reference_logits(head, z, temperature, normalize)[:, candidates] / tau, 0)
    got = head.batch_scores(head.score_queries(z), candidates)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    assert head.selection_temperature == tau and head.temperature == temperature


@pytest.mark.parametrize("temperature, normalize", [(0.5, True), (0.25, False)])
def test_midx_indexes_and_scores_what_the_head_scores(temperature, normalize):
    """MIDX in exact mode is the full softmax of what it indexes and is queried with: after the
    head's refresh it must equal the head's own softmax (no bias), for the scored queries."""
    torch.manual_seed(6)
    sampler = MIDXSampler(N, 4, "rq", "exact", kmeans_iters=5)
    head = SampledSoftmaxHead(
        N, D, sampler, num_negatives=4, temperature=temperature, normalize=normalize
    )
    with torch.no_grad():
        head.weight.mul_(torch.rand(N, 1) * 5)  # unequal norms: normalisation matters
    head.refresh_index()
    z = 2.0 * torch.randn(5, D)
    every = torch.arange(N)
    proposal = sampler.log_prob(head.score_queries(z), every)
    torch.testing.assert_close(
        proposal, torch.log_softmax(head.logits(z), -1), rtol=1e-4, atol=1e-4
    )


def test_sampled_heads_give_their_sampler_the_scored_queries():
    """Whether the head draws alone or also scores its positives (``sample_and_score``, the
    conventions that correct the positive)."""
    seen = []

    class Recording(UniformSampler):
        def _sample(self, z, num_samples, shared, generator):
            seen.append(z.clone())
            return super()._sample(z, num_samples, shared, generator)

        def _sample_and_score(self, z, num_samples, ids, shared, generator):
            seen.append(z.clone())
            return super()._sample_and_score(z, num_samples, ids, shared, generator)

    torch.manual_seed(7)
    z = 3.0 * torch.randn(4, D)
    y = torch.randint(N, (4,))
    for cls, kwargs in [
        (SampledSoftmaxHead, dict(num_negatives=3)),
        (SampledSoftmaxHead, dict(num_negatives=3, convention="exact_positive")),
        (OneVsEachHead, dict(num_negatives=3)),
    ]:
        seen.clear()
        head = cls(N, D, Recording(N), temperature=0.25, normalize=True, **kwargs)
        head(z, y)
        torch.testing.assert_close(seen[-1], F.normalize(z, dim=-1) / 0.25)


def test_temperature_is_settable():
    torch.manual_seed(8)
    head = FullSoftmaxHead(N, D)
    z = torch.randn(3, D)
    before = head.logits(z)
    head.temperature = 0.5
    torch.testing.assert_close(head.logits(z), 2.0 * before)
    head.temperature = 0.25
    assert "temperature=0.25" in repr(head) and "normalize=False" in repr(head)


def test_bf16_autocast_with_cosine_logits_is_close_to_fp32():
    torch.manual_seed(9)
    head = FullSoftmaxHead(N, D, chunk_size=16, temperature=0.1, normalize=True)
    z = torch.randn(16, D, requires_grad=True)
    y = torch.randint(N, (16,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = head(z, y)
    ref = head(z, y)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, ref, rtol=3e-2, atol=3e-2)


def test_adaptive_topk_follows_the_head_temperature():
    torch.manual_seed(10)
    head = FullSoftmaxHead(200, 64, bias=True, temperature=0.5)
    with torch.no_grad():
        head.weight.normal_()
        head.bias.normal_()
    z = torch.randn(4, 64)
    result = head.adaptive_topk(z, 1, seed=0)
    probs = torch.softmax(head.logits(z), -1)
    top = probs.argmax(-1)
    assert torch.equal(result.indices[:, 0], top)
    torch.testing.assert_close(
        result.probs[:, 0], probs.gather(1, top[:, None])[:, 0], rtol=0.3, atol=0.0
    )


def test_adaptive_topk_refuses_cosine_logits():
    head = FullSoftmaxHead(N, D, normalize=True)
    with pytest.raises(ValueError, match="normalize"):
        head.adaptive_topk(torch.randn(2, D), 1)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf, True, "1"])
def test_bad_temperature_is_refused(bad):
    with pytest.raises(ValueError, match="temperature"):
        FullSoftmaxHead(N, D, temperature=bad)
    with pytest.raises(ValueError, match="temperature"):
        TapasHead(N, D, num_negatives=4, temperature=bad, selection_temperature=1.0)
    head = SampledSoftmaxHead(N, D, num_negatives=4)
    with pytest.raises(ValueError, match="temperature"):
        head.temperature = bad


def test_bad_normalize_and_learnable_sampler_are_refused():
    with pytest.raises(ValueError, match="normalize"):
        FullSoftmaxHead(N, D, normalize=1)
    learnable = MIDXSampler(N, 4, learnable=True, dim=D)
    with pytest.raises(ValueError, match="normalize"):
        SampledSoftmaxHead(N, D, learnable, num_negatives=4, normalize=True)


def test_logits_are_differentiable_with_cosine_logits():
    torch.manual_seed(11)
    head = FullSoftmaxHead(N, D, bias=True, chunk_size=9, temperature=0.5, normalize=True)
    with_random_bias(head)
    z = torch.randn(4, D, requires_grad=True)
    weights = torch.randn(4, N)
    params = params_of(head, z)
    got = torch.autograd.grad((head.logits(z) * weights).sum(), params)
    want = torch.autograd.grad((reference_logits(head, z, 0.5, True) * weights).sum(), params)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_sparse_gradient_with_cosine_logits_equals_the_dense_one():
    torch.manual_seed(12)
    z = torch.randn(6, D)
    y = torch.randint(N, (6,))
    grads = []
    for sparse in (False, True):
        torch.manual_seed(0)
        head = SampledSoftmaxHead(
            N, D, num_negatives=5, sparse_grad=sparse, temperature=0.3, normalize=True
        )
        torch.manual_seed(1)
        head(z, y).backward()
        grads.append(head.weight.grad)
    assert grads[1].is_sparse
    torch.testing.assert_close(grads[1].to_dense(), grads[0])
