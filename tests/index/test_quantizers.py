"""Product and residual quantisers: codebook shapes, nearest codes, reconstructions."""

import pytest
import torch

from lightning_sampled.index import ProductQuantizer, ResidualQuantizer, make_quantizer


def table(n=600, d=10, seed=0):
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed))


def test_product_quantizer_splits_halves_and_concatenates():
    x = table()
    pq = ProductQuantizer(8)
    codebooks, codes = pq.fit(x, niter=10)
    assert codebooks.shape == (2, 8, 5) and codes.shape == (600, 2)
    assert torch.equal(codes[:, 0], torch.cdist(x[:, :5], codebooks[0]).argmin(1))
    assert torch.equal(codes[:, 1], torch.cdist(x[:, 5:], codebooks[1]).argmin(1))
    assert torch.equal(pq.encode(x, codebooks), codes)
    expected = torch.cat([codebooks[0][codes[:, 0]], codebooks[1][codes[:, 1]]], 1)
    assert torch.equal(pq.decode(codes, codebooks), expected)
    z = torch.randn(3, 10)
    z1, z2 = pq.query_parts(z)
    torch.testing.assert_close(
        z1 @ expected[:4, :5].T + z2 @ expected[:4, 5:].T, z @ expected[:4].T
    )


def test_residual_quantizer_fits_the_second_codebook_on_residuals():
    x = table(d=7)
    rq = ResidualQuantizer(8)
    codebooks, codes = rq.fit(x, niter=10)
    assert codebooks.shape == (2, 8, 7)
    assert torch.equal(codes[:, 0], torch.cdist(x, codebooks[0]).argmin(1))
    residual = x - codebooks[0][codes[:, 0]]
    assert torch.equal(codes[:, 1], torch.cdist(residual, codebooks[1]).argmin(1))
    decoded = rq.decode(codes, codebooks)
    torch.testing.assert_close(decoded, codebooks[0][codes[:, 0]] + codebooks[1][codes[:, 1]])
    one_codebook = ((x - codebooks[0][codes[:, 0]]) ** 2).sum(1).mean()
    both = rq.squared_error(x, codes, codebooks)
    assert both < 0.85 * one_codebook
    torch.testing.assert_close(both.float(), ((x - decoded) ** 2).sum(1).mean())


@pytest.mark.parametrize("name", ["pq", "rq"])
def test_soft_decode_is_differentiable_in_the_codebooks(name):
    quantizer = make_quantizer(name, 4)
    codebooks = torch.randn(2, 4, quantizer.codeword_dim(6), requires_grad=True)
    out = quantizer.soft_decode(torch.randn(9, 6), codebooks)
    assert out.shape == (9, 6)
    out.sum().backward()
    assert codebooks.grad is not None and codebooks.grad.abs().sum() > 0


def test_bad_quantizer_name_and_odd_pq_dimension():
    with pytest.raises(ValueError, match="quantizer must be one of"):
        make_quantizer("opq", 4)
    with pytest.raises(ValueError, match="must be even, got 7"):
        ProductQuantizer(4).check_dim(7)
    ResidualQuantizer(4).check_dim(7)


@pytest.mark.parametrize("name", ["pq", "rq"])
def test_reassign_gives_nearest_codes_and_revives_dead_codewords(name):
    x = table(n=200, d=6, seed=1)
    quantizer = make_quantizer(name, 5)
    fitted, _ = quantizer.fit(x, niter=5)
    dead = fitted.clone()
    dead[:, 3] = 1e3  # codeword 3 of each codebook is far from every class: no class takes it
    codebooks, codes = quantizer.reassign(x, dead)
    assert dead[:, 3].eq(1e3).all()  # the input is left alone
    for j in range(2):
        assert torch.bincount(codes[:, j], minlength=5).min() >= 1, j
        assert codebooks[j, 3].abs().max() < 10  # moved onto a (residual) class embedding
    assert torch.equal(codes, quantizer.encode(x, codebooks))
    untouched = [0, 1, 2, 4]
    torch.testing.assert_close(codebooks[0, untouched], fitted[0, untouched])
    # without dead codewords nothing moves: reassigning is encoding
    same, same_codes = quantizer.reassign(x, fitted)
    assert torch.equal(same, fitted) and torch.equal(same_codes, quantizer.encode(x, fitted))


def test_reassign_of_a_two_point_table_keeps_the_two_codewords_it_can_fill():
    x = torch.cat([torch.zeros(10, 4), torch.ones(10, 4)])
    quantizer = make_quantizer("rq", 4)
    codebooks, codes = quantizer.reassign(x, torch.full((2, 4, 4), 5.0))
    assert torch.bincount(codes[:, 0], minlength=4).sort().values.tolist() == [0, 0, 10, 10]
    torch.testing.assert_close(quantizer.decode(codes, codebooks), x)
