"""MIDX-Learn: learnable codewords, the auxiliary loss (hard and soft encoders, chunked, subsets of
queries and classes), refresh semantics."""

import pytest
import torch

from lightning_sampled.samplers import MIDXSampler


def setup(quantizer="rq", n=60, d=6, **kwargs):
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(n, d, generator=g)
    sampler = MIDXSampler(n, 4, quantizer, learnable=True, dim=d, kmeans_iters=5, **kwargs)
    sampler.refresh(emb)
    return sampler, emb, torch.randn(5, d, generator=g)


def soft(quantizer="rq", **kwargs):
    """A sampler with the paper's soft encoder, every query in the auxiliary loss."""
    return setup(quantizer, encoder="soft", kl_num_queries=None, **kwargs)


def brute_force_loss(sampler, z, emb, ids, residual=True):
    """MIDX-Learn's soft-encoder loss written out over the classes ``ids``, no chunks: Section
    6.2.3's reconstruction (a mean over classes where the paper sums) and KL terms with the soft
    encoder ``w = softmax(q . c)``. Under RQ the second codebook encodes the residual ``q -
    first soft codeword`` (our design, as RQ's hard codes do); ``residual=False`` is the paper's
    formula to the letter, where both codebooks score ``q``."""
    codewords = sampler.codewords
    q = emb[ids]
    if sampler.quantizer.name == "pq":
        h = q.shape[1] // 2
        w1 = torch.softmax(q[:, :h] @ codewords[0].T, -1)
        w2 = torch.softmax(q[:, h:] @ codewords[1].T, -1)
        q_hat = torch.cat([w1 @ codewords[0], w2 @ codewords[1]], 1)
    else:
        first = torch.softmax(q @ codewords[0].T, -1) @ codewords[0]
        second = q - first if residual else q
        q_hat = first + torch.softmax(second @ codewords[1].T, -1) @ codewords[1]
    reconstruction = ((q_hat - q) ** 2).sum(1).mean()
    p = torch.softmax(z @ q.T, -1)
    p_hat = torch.softmax(z @ q_hat.T, -1)
    kl = torch.log((p * p / p_hat).sum(-1)).mean()
    return sampler.reconstruction_weight * reconstruction + sampler.kl_weight * kl


@pytest.mark.parametrize("quantizer", ["pq", "rq"])
def test_chunked_auxiliary_loss_equals_the_brute_force_soft_encoder_loss_and_gradient(quantizer):
    """The chunked loss (PQ: per half; RQ: residual soft encoder) and its gradient equal the
    brute force. Under RQ the paper's non-residual formula gives a loss 0.05 or more away, so a
    non-residual encoder fails here; both terms weigh, so a wrong term fails too."""
    sampler, emb, z = soft(quantizer, kl_num_classes=None, kl_chunk_size=7, kl_weight=0.5)
    loss = sampler.auxiliary_loss(z, emb)
    (grad,) = torch.autograd.grad(loss, sampler.codewords)
    expected = brute_force_loss(sampler, z, emb, torch.arange(60))
    (expected_grad,) = torch.autograd.grad(expected, sampler.codewords)
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(grad, expected_grad)
    if quantizer == "rq":
        literal = brute_force_loss(sampler, z, emb, torch.arange(60), residual=False)
        assert (literal - expected).abs() > 0.05


def test_subset_auxiliary_loss_uses_the_drawn_classes_and_skips_padding():
    sampler, emb, z = soft(kl_num_classes=25, padding_idx=3)
    loss = sampler.auxiliary_loss(z, emb, generator=torch.Generator().manual_seed(4))
    ranks = torch.randint(59, (25,), generator=torch.Generator().manual_seed(4))
    ids = ranks + (ranks >= 3).long()
    torch.testing.assert_close(loss, brute_force_loss(sampler, z, emb, ids))


@pytest.mark.parametrize(("encoder", "drop"), [("hard", 0.8), ("soft", 0.7)])
def test_only_codewords_get_gradients_and_training_lowers_the_loss(encoder, drop):
    """Adam on the codewords alone lowers the loss (the hard encoder's is piecewise: classes
    change cells as the codewords move, and it levels off near 0.75 of its start here)."""
    sampler, emb, z = setup(kl_num_classes=None, encoder=encoder)
    emb.requires_grad_(True)
    z.requires_grad_(True)
    optimizer = torch.optim.Adam(sampler.parameters(), lr=0.05)
    losses = []
    for _ in range(40):
        optimizer.zero_grad()
        loss = sampler.auxiliary_loss(z, emb)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert emb.grad is None and z.grad is None
    assert losses[-1] < drop * losses[0]


@pytest.mark.parametrize("quantizer", ["pq", "rq"])
def test_hard_encoder_kl_is_the_divergence_of_the_proposal_the_sampler_draws_from(quantizer):
    """With the hard encoder and every class and query, ``L_KL`` is ``log sum_i p_i^2 / Q_i`` for
    the fast-mode proposal ``Q`` the sampler reports after a refresh with the same codewords, and
    ``L_recon`` is the quantisation error of the refresh's codes; the gradient flows to the
    codewords of each class's cell. The soft encoder's loss is at least 0.1 away, so an encoder
    that is not the sampler's codes fails here."""
    sampler, emb, z = setup(quantizer, n=80, kl_num_classes=None, kl_num_queries=None)
    sampler.reconstruction_weight = 0.0
    kl = sampler.auxiliary_loss(z, emb)
    p = torch.softmax(z @ emb.T, -1)
    log_q = sampler.log_prob(z, torch.arange(80))
    expected_kl = torch.logsumexp(2 * p.log() - log_q, -1).mean()
    torch.testing.assert_close(kl, expected_kl)
    codes = sampler.quantizer.encode(emb, sampler.codewords.detach())
    (grad,) = torch.autograd.grad(kl, sampler.codewords)
    decoded = sampler.quantizer.decode(codes, sampler.codewords)
    brute = torch.log((p * p / torch.softmax(z @ decoded.T, -1)).sum(-1)).mean()
    (expected_grad,) = torch.autograd.grad(brute, sampler.codewords)
    torch.testing.assert_close(grad, expected_grad)
    assert expected_grad.abs().sum() > 0
    sampler.reconstruction_weight, sampler.kl_weight = 1.0, 0.0
    reconstruction = sampler.auxiliary_loss(z, emb)
    expected = sampler.quantizer.squared_error(emb, codes, sampler.codewords.detach())
    torch.testing.assert_close(reconstruction.double(), expected)
    sampler.encoder, sampler.kl_weight = "soft", 1.0
    sampler.reconstruction_weight = 0.0
    assert (sampler.auxiliary_loss(z, emb) - kl).abs() > 0.1


def test_query_subset_uses_the_drawn_queries_then_the_drawn_classes():
    """``kl_num_queries`` queries drawn without replacement, then ``kl_num_classes`` classes, from
    one generator: the loss equals the full-subset loss on exactly those."""
    sampler, emb, z = setup(kl_num_classes=25, kl_num_queries=3)
    g = torch.Generator().manual_seed(7)
    loss = sampler.auxiliary_loss(z, emb, generator=torch.Generator().manual_seed(7))
    picked = torch.randperm(5, generator=g)[:3]
    ids = torch.randint(60, (25,), generator=g)
    sampler.kl_num_classes, sampler.kl_num_queries = None, None
    codes = sampler.quantizer.encode(emb[ids], sampler.codewords.detach())
    decoded = sampler.quantizer.decode(codes, sampler.codewords)
    queries = z[picked]
    p = torch.softmax(queries @ emb[ids].T, -1)
    kl = torch.log((p * p / torch.softmax(queries @ decoded.T, -1)).sum(-1)).mean()
    expected = ((decoded - emb[ids]) ** 2).sum(1).mean() + kl
    torch.testing.assert_close(loss, expected)
    assert (sampler.auxiliary_loss(z, emb) - loss).abs() > 1e-3


def test_bad_encoder_and_query_count_are_refused():
    with pytest.raises(ValueError, match="encoder must be one of"):
        MIDXSampler(10, 2, learnable=True, dim=4, encoder="gumbel")
    with pytest.raises(ValueError, match="kl_num_queries"):
        MIDXSampler(10, 2, learnable=True, dim=4, kl_num_queries=0)


def test_later_refreshes_keep_learned_codewords_and_reassign_classes():
    sampler, emb, _ = setup("pq")
    assert isinstance(sampler.codewords, torch.nn.Parameter)
    assert [name for name, _ in sampler.named_parameters()] == ["codewords"]
    with torch.no_grad():
        sampler.codewords.add_(0.3 * torch.randn_like(sampler.codewords))
    learned = sampler.codewords.detach().clone()
    sampler.refresh(emb)
    assert torch.equal(sampler.codewords.detach(), learned)
    codes = sampler.quantizer.encode(emb, learned)
    assert torch.equal(sampler.class_cells, codes[:, 0] * 4 + codes[:, 1])
    # Sampling follows the current codewords (Eq. 6 with the learned reconstruction).
    z = torch.randn(2, 6)
    reconstruction = sampler.quantizer.decode(codes, learned)
    torch.testing.assert_close(
        sampler.log_prob(z, torch.arange(60)), torch.log_softmax(z @ reconstruction.T, -1)
    )


def test_non_learnable_auxiliary_loss_is_zero():
    sampler = MIDXSampler(30, 3, kmeans_iters=3)
    sampler.refresh(torch.randn(30, 4))
    loss = sampler.auxiliary_loss(torch.randn(2, 4), torch.randn(30, 4))
    assert loss.shape == () and float(loss) == 0.0
    assert list(sampler.parameters()) == []


@pytest.mark.parametrize("quantizer", ["pq", "rq"])
def test_refresh_reseeds_dead_learned_codewords_onto_the_worst_reconstructed_classes(quantizer):
    """A learned codeword that no class takes any more is moved onto the class (or, for RQ's
    second codebook, the residual) that its codebook reconstructs worst, so that MIDX-Learn does
    not collapse onto fewer cells; the parameter itself is updated in place."""
    sampler, emb, z = setup(quantizer)
    parameter = sampler.codewords
    with torch.no_grad():
        sampler.codewords[0, 1] = 1e3  # no class is near codeword 1 of the first codebook
    first_halves = sampler.quantizer.query_parts(emb)[0]
    codes = sampler.quantizer.encode(emb, sampler.codewords.detach())
    assert not (codes[:, 0] == 1).any()
    errors = ((first_halves - sampler.codewords.detach()[0][codes[:, 0]]) ** 2).sum(1)
    sampler.refresh(emb)
    assert sampler.codewords is parameter
    torch.testing.assert_close(sampler.codewords.detach()[0, 1], first_halves[errors.argmax()])
    k1 = sampler.class_cells // 4
    assert torch.bincount(k1, minlength=4).min() >= 1
    torch.testing.assert_close(sampler.log_prob(z, torch.arange(60)).exp().sum(-1), torch.ones(5))
