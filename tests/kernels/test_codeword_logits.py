"""The codeword-logits Triton kernel against its torch reference (Triton interpreter on CPU)."""

import math
import warnings

import pytest
import torch

from lightning_sampled.kernels.codeword_logits import (
    codeword_logits,
    codeword_logits_reference,
    codeword_logits_triton,
)


def inputs(b, k, d1, d2, dtype=torch.float32, seed=0, scale=1.0, empty_rows=(1,)):
    g = torch.Generator().manual_seed(seed)
    z1 = (scale * torch.randn(b, d1, generator=g)).to(dtype)
    z2 = (scale * torch.randn(b, d2, generator=g)).to(dtype)
    c1 = torch.randn(k, d1, generator=g).to(dtype)
    c2 = torch.randn(k, d2, generator=g).to(dtype)
    counts = torch.randint(0, 4, (k, k), generator=g).float()
    counts[list(empty_rows)] = 0.0  # whole rows of empty cells: log_psi = -inf there
    return z1, z2, c1, c2, counts.log()


def run_kernel(*args, **kwargs):
    with warnings.catch_warnings():  # the interpreter's numpy warns on log(0) = -inf
        warnings.simplefilter("ignore", RuntimeWarning)
        return codeword_logits_triton(*args, **kwargs)


def assert_matches(out, ref, atol, rtol):
    for name, a, b in zip(out._fields, out, ref, strict=True):
        assert a.dtype == torch.float32, name
        assert torch.equal(torch.isfinite(a), torch.isfinite(b)), name
        finite = torch.isfinite(b)
        torch.testing.assert_close(a[finite], b[finite], atol=atol, rtol=rtol, msg=name)


@pytest.mark.parametrize(("b", "k", "d1", "d2"), [(37, 5, 13, 13), (16, 16, 8, 8), (3, 19, 7, 9)])
def test_fp32_matches_reference_on_odd_sizes(b, k, d1, d2):
    args = inputs(b, k, d1, d2)
    assert_matches(run_kernel(*args), codeword_logits_reference(*args), atol=1e-5, rtol=1e-5)


def test_several_query_blocks_and_strided_query_halves():
    z = torch.randn(40, 70, generator=torch.Generator().manual_seed(1))
    _, _, c1, c2, log_counts = inputs(1, 6, 35, 35, seed=2)
    z1, z2 = z[:, :35], z[:, 35:]  # product-quantisation halves: views with row stride 70
    out = run_kernel(z1, z2, c1, c2, log_counts)
    assert_matches(out, codeword_logits_reference(z1, z2, c1, c2, log_counts), 1e-5, 1e-5)


def test_large_logits_stay_finite_and_exact():
    args = inputs(9, 7, 11, 11, scale=30.0, seed=3)
    ref = codeword_logits_reference(*args)
    assert ref.s2.abs().max() > 100  # exp would overflow without the max shift
    assert_matches(run_kernel(*args), ref, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs_accumulate_in_fp32(dtype):
    args = inputs(21, 6, 10, 10, dtype=dtype, seed=4)
    args = (*args[:4], args[4].float())
    out = run_kernel(*args)
    ref = codeword_logits_reference(*args)  # the same half inputs, upcast: fp32 math
    assert_matches(out, ref, atol=1e-4, rtol=1e-5)
    assert ref.s1.dtype == torch.float32


def test_log_normalisers_define_the_proposal():
    z1, z2, c1, c2, log_counts = inputs(4, 5, 6, 6, seed=5)
    out = run_kernel(z1, z2, c1, c2, log_counts)
    joint = out.s1[:, :, None] + out.s2[:, None, :] + log_counts - out.log_z[:, None, None]
    torch.testing.assert_close(joint.exp().sum((1, 2)), torch.ones(4))
    p2 = (log_counts + out.s2[:, None, :] - out.log_psi[:, :, None]).exp().sum(-1)
    nonempty = torch.isfinite(out.log_psi)
    torch.testing.assert_close(p2[nonempty], torch.ones(int(nonempty.sum())))
    assert math.isinf(out.log_psi[0, 1]) and out.log_psi[0, 1] < 0


def test_dispatch_uses_the_reference_on_cpu():
    args = inputs(5, 4, 3, 3)
    for a, b in zip(codeword_logits(*args), codeword_logits_reference(*args), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_reference_cell_normalisers_equal_the_brute_force_log_sum_exp(scale):
    """The reference's ``[B, K] x [K, K]`` product equals the ``[B, K, K]`` log-sum-exp, empty
    rows included, also where the logits spread far beyond fp32's exponent range."""
    z1, z2, c1, c2, log_counts = inputs(37, 12, 5, 6, seed=3, scale=scale, empty_rows=(1, 7))
    got = codeword_logits_reference(z1, z2, c1, c2, log_counts)
    s2 = z2 @ c2.T
    want = torch.logsumexp(s2.double()[:, None, :] + log_counts.double(), dim=-1).float()
    assert got.log_psi[:, [1, 7]].eq(-math.inf).all()
    torch.testing.assert_close(got.log_psi, want, rtol=1e-5, atol=1e-4)
    # per-query weights [B, K, K] (MIDX's exact mode) take the brute-force path
    per_query = log_counts.expand(37, -1, -1)
    torch.testing.assert_close(
        codeword_logits_reference(z1, z2, c1, c2, per_query).log_psi, got.log_psi
    )
