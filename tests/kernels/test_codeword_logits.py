"""The codeword-logits Triton kernel against its torch reference, on every device, and the
``backend`` that picks one of them (for ``codeword_logits`` and ``MIDXSampler``).

Each test runs on ``"cpu"`` (the kernel under Triton's interpreter) and ``"cuda"`` (compiled;
marked ``gpu``, skipped without a GPU). A process runs the kernel in one mode only
(:func:`triton_interpreted`): ``make test`` (``TRITON_INTERPRET=1``, set by ``conftest.py``) runs
the CPU cases, ``make test-gpu`` (``TRITON_INTERPRET=0``) the CUDA ones; the other device's
kernel cases skip, the torch reference runs on both.
"""

import importlib
import math
import os
import warnings

import pytest
import torch
from kernel_runs import needs_cuda, skip_unless_the_kernel_runs_on

from lightning_sampled.kernels.codeword_logits import (
    BACKENDS,
    codeword_logits,
    codeword_logits_reference,
    codeword_logits_triton,
    triton_interpreted,
)
from lightning_sampled.samplers import MIDXSampler

# the module, not the function of the same name that lightning_sampled.kernels exports
module = importlib.import_module("lightning_sampled.kernels.codeword_logits")


def inputs(b, k, d1, d2, dtype=torch.float32, seed=0, scale=1.0, empty_rows=(1,), device="cpu"):
    g = torch.Generator().manual_seed(seed)
    z1 = (scale * torch.randn(b, d1, generator=g)).to(dtype)
    z2 = (scale * torch.randn(b, d2, generator=g)).to(dtype)
    c1 = torch.randn(k, d1, generator=g).to(dtype)
    c2 = torch.randn(k, d2, generator=g).to(dtype)
    counts = torch.randint(0, 4, (k, k), generator=g).float()
    counts[list(empty_rows)] = 0.0  # whole rows of empty cells: log_psi = -inf there
    return tuple(t.to(device) for t in (z1, z2, c1, c2, counts.log()))


def run_kernel(*args, **kwargs):
    """The Triton kernel on the device of ``args`` (see :func:`skip_unless_the_kernel_runs_on`)."""
    skip_unless_the_kernel_runs_on(args[0].device)
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
def test_fp32_matches_reference_on_odd_sizes(b, k, d1, d2, device):
    args = inputs(b, k, d1, d2, device=device)
    assert_matches(run_kernel(*args), codeword_logits_reference(*args), atol=1e-5, rtol=1e-5)


def test_several_query_blocks_and_strided_query_halves(device):
    z = torch.randn(40, 70, generator=torch.Generator().manual_seed(1)).to(device)
    _, _, c1, c2, log_counts = inputs(1, 6, 35, 35, seed=2, device=device)
    z1, z2 = z[:, :35], z[:, 35:]  # product-quantisation halves: views with row stride 70
    out = run_kernel(z1, z2, c1, c2, log_counts)
    assert_matches(out, codeword_logits_reference(z1, z2, c1, c2, log_counts), 1e-5, 1e-5)


def test_large_logits_stay_finite_and_exact(device):
    args = inputs(9, 7, 11, 11, scale=30.0, seed=3, device=device)
    ref = codeword_logits_reference(*args)
    assert ref.s2.abs().max() > 100  # exp would overflow without the max shift
    assert_matches(run_kernel(*args), ref, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs_accumulate_in_fp32(dtype, device):
    args = inputs(21, 6, 10, 10, dtype=dtype, seed=4, device=device)
    args = (*args[:4], args[4].float())
    out = run_kernel(*args)
    ref = codeword_logits_reference(*args)  # the same half inputs, upcast: fp32 math
    assert_matches(out, ref, atol=1e-4, rtol=1e-5)
    assert ref.s1.dtype == torch.float32


def assert_normalised(out, log_counts):
    """P1 sums to one over k1, P2(. | k1) to one over k2 in every row drawn (P1 > 0), and rows
    with ``log_psi = -inf`` (no class, or below the cut) are never drawn."""
    p1 = out.log_p1.exp().double()
    torch.testing.assert_close(p1.sum(-1), p1.new_ones(p1.shape[0]))
    log_psi = out.log_psi.nan_to_num(neginf=0.0)[:, :, None]
    p2 = (log_counts + out.s2[:, None, :] - log_psi).double().exp().sum(-1)
    drawn = p1 > 0
    torch.testing.assert_close(p2[drawn], p2.new_ones(int(drawn.sum())))
    assert not drawn[out.log_psi == -math.inf].any()


def test_log_normalisers_define_the_proposal(device):
    z1, z2, c1, c2, log_counts = inputs(4, 5, 6, 6, seed=5, device=device)
    out = run_kernel(z1, z2, c1, c2, log_counts)
    assert_normalised(out, log_counts)
    assert math.isinf(out.log_psi[0, 1]) and out.log_psi[0, 1] < 0
    # P1 is the joint of Eq. (6) summed over k2, from the unshifted logits
    joint = (z1 @ c1.T)[:, :, None] + (z2 @ c2.T)[:, None, :] + log_counts
    torch.testing.assert_close(
        out.log_p1.exp(), torch.softmax(joint.flatten(1), -1).view(joint.shape).sum(-1)
    )


@pytest.mark.parametrize("implementation", [run_kernel, codeword_logits_reference])
def test_logits_are_shifted_to_the_best_live_codeword_and_dead_ones_are_minus_inf(
    implementation, device
):
    z1, z2, c1, c2, log_counts = inputs(6, 5, 4, 4, seed=6, empty_rows=(2,), device=device)
    log_counts[:, 3] = -math.inf  # second codeword 3 holds no class
    z1, z2 = z1.abs(), z2.abs()
    c1[2], c2[3] = 50.0, 50.0  # the dead codewords score best
    s1, s2 = z1 @ c1.T, z2 @ c2.T
    out = implementation(z1, z2, c1, c2, log_counts)
    live1 = torch.tensor([True, True, False, True, True], device=device)
    live2 = torch.tensor([True, True, True, False, True], device=device)
    for got, raw, live in ((out.s1, s1, live1), (out.s2, s2, live2)):
        assert got[:, ~live].eq(-math.inf).all()
        want = raw[:, live] - raw[:, live].amax(1, keepdim=True)
        torch.testing.assert_close(got[:, live], want, atol=1e-4, rtol=1e-5)
    assert_normalised(out, log_counts)


@pytest.mark.parametrize("implementation", [run_kernel, codeword_logits_reference])
@pytest.mark.parametrize("scale", [1e3, 1e30])
def test_huge_queries_still_give_a_normalised_proposal(implementation, scale, device):
    """Logits of 1e30: unshifted, log Z would round away the cell sizes (fp32 ulp ~ 1e23)."""
    z1, z2, c1, c2, log_counts = inputs(8, 6, 5, 5, seed=7, empty_rows=(1, 4), device=device)
    z1, z2 = scale * z1, scale * z2
    out = implementation(z1, z2, c1, c2, log_counts)
    assert_normalised(out, log_counts)
    assert (out.log_p1.exp() > 0).sum(-1).min() >= 1


def test_logits_beyond_fp32_are_clamped_not_infinite(device):
    z1, z2, c1, c2, log_counts = inputs(3, 4, 6, 6, seed=8, device=device)
    sign = torch.tensor([[1.0], [-1.0], [1.0]], device=device)  # one sign per query
    z1, z2 = 1e38 * sign.expand(3, 6), 1e38 * sign.expand(3, 6)
    c1, c2 = c1.abs() + 1, c2.abs() + 1  # every z . c overflows: +-inf without the clamp
    assert (z1 @ c1.T).isinf().all()
    for out in (
        run_kernel(z1, z2, c1, c2, log_counts),
        codeword_logits_reference(z1, z2, c1, c2, log_counts),
    ):
        assert not out.s1.isnan().any() and not out.log_p1.isnan().any()
        assert_normalised(out, log_counts)


@pytest.mark.parametrize("implementation", [run_kernel, codeword_logits_reference])
def test_rows_below_e_minus_700_of_the_best_get_no_mass(implementation, device):
    z1, z2, c1, c2, log_counts = inputs(2, 3, 2, 2, seed=9, empty_rows=(), device=device)
    log_counts = torch.tensor(
        [[0.0, -math.inf, -math.inf], [-math.inf, 0.0, -math.inf], [-math.inf, -math.inf, 0.0]],
        device=device,
    )
    # s2 = (0, -650, -720) relative to the best: row 2's only cell is below e^-700 (though
    # still above fp64's smallest number, e^-744)
    z2 = torch.tensor([[1.0, 0.0], [1.0, 0.0]], device=device)
    c2 = torch.tensor([[0.0, 0.0], [-650.0, 0.0], [-720.0, 0.0]], device=device)
    out = implementation(z1, z2, c1, c2, log_counts)
    assert torch.isfinite(out.log_psi[:, :2]).all() and out.log_psi[:, 2].eq(-math.inf).all()
    assert out.log_p1[:, 2].eq(-math.inf).all()
    assert_normalised(out, log_counts)


def test_dispatch_uses_the_kernel_on_cuda_and_the_reference_on_cpu(device):
    args = inputs(5, 4, 3, 3, device=device)
    want = run_kernel(*args) if device.type == "cuda" else codeword_logits_reference(*args)
    for a, b in zip(codeword_logits(*args), want, strict=True):
        assert torch.equal(a, b)


def test_the_kernel_mode_is_the_one_triton_was_imported_in():
    assert triton_interpreted() == (os.environ.get("TRITON_INTERPRET") == "1")


def test_cpu_tensors_without_the_interpreter_get_a_clear_error(monkeypatch):
    monkeypatch.setattr(module, "triton_interpreted", lambda: False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        codeword_logits_triton(*inputs(5, 4, 3, 3))


@pytest.mark.gpu
@needs_cuda
def test_midx_proposal_on_cuda_through_the_kernel_equals_the_cpu_reference():
    """MIDX on a CUDA table scores its proposal with the compiled kernel (``codeword_logits``):
    the same index gives the same ``log q`` as on the CPU, where the reference scores it."""
    g = torch.Generator().manual_seed(10)
    table, z = torch.randn(300, 16, generator=g), torch.randn(37, 16, generator=g)
    ids = torch.randint(0, 300, (37, 20), generator=g)
    sampler = MIDXSampler(300, 8, kmeans_iters=5)
    sampler.refresh(table)
    want = sampler.log_prob(z, ids)
    got = sampler.to("cuda").log_prob(z.cuda(), ids.cuda()).cpu()
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("scale", [1.0, 30.0])
def test_reference_cell_normalisers_equal_the_brute_force_log_sum_exp(scale, device):
    """The reference's ``[B, K] x [K, K]`` product equals the ``[B, K, K]`` log-sum-exp, empty
    rows included, also where the logits spread far beyond fp32's exponent range."""
    z1, z2, c1, c2, log_counts = inputs(
        37, 12, 5, 6, seed=3, scale=scale, empty_rows=(1, 7), device=device
    )
    got = codeword_logits_reference(z1, z2, c1, c2, log_counts)
    s2 = (z2 @ c2.T).double()
    s2 = s2 - s2[:, torch.isfinite(log_counts).any(0)].amax(1, keepdim=True)  # shifted (live max 0)
    want = torch.logsumexp(s2[:, None, :] + log_counts.double(), dim=-1).float()
    assert got.log_psi[:, [1, 7]].eq(-math.inf).all()
    torch.testing.assert_close(got.log_psi, want, rtol=1e-5, atol=1e-4)
    # per-query weights [B, K, K] (MIDX's exact mode) take the brute-force path
    per_query = log_counts.expand(37, -1, -1)
    torch.testing.assert_close(
        codeword_logits_reference(z1, z2, c1, c2, per_query).log_psi, got.log_psi
    )


def recorded_implementations(monkeypatch):
    """Replaces the kernel and the reference with fakes that log their name (the kernel's fake
    returns the reference's result, so that a sampler can draw with it on any device)."""
    calls = []

    def fake_kernel(*args, **kwargs):
        calls.append("triton")
        return reference(*args)

    def fake_reference(*args):
        calls.append("torch")
        return reference(*args)

    reference = module.codeword_logits_reference
    monkeypatch.setattr(module, "codeword_logits_triton", fake_kernel)
    monkeypatch.setattr(module, "codeword_logits_reference", fake_reference)
    return calls


def expected_implementation(backend, device):
    """The implementation ``backend`` names on ``device`` for one table of cell sizes."""
    return {"torch": "torch", "triton": "triton"}.get(
        backend, "triton" if device.type == "cuda" else "torch"
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_picks_the_implementation(backend, device, monkeypatch):
    """``"torch"`` never runs the kernel, ``"triton"`` always does, ``"auto"`` on CUDA only and
    only for one table of cell sizes (per-query weights ``[B, K, K]`` take the reference)."""
    calls = recorded_implementations(monkeypatch)
    args = inputs(5, 4, 3, 3, device=device)
    codeword_logits(*args, backend=backend)
    assert calls == [expected_implementation(backend, device)]
    if backend != "triton":
        calls.clear()
        codeword_logits(*args[:4], args[4].expand(5, -1, -1), backend=backend)
        assert calls == ["torch"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_sampler_computes_its_proposal_with_its_backend(backend, device, monkeypatch):
    g = torch.Generator().manual_seed(11)
    sampler = MIDXSampler(60, 4, kmeans_iters=3, backend=backend)
    sampler.refresh(torch.randn(60, 6, generator=g))
    sampler.to(device)
    z = torch.randn(7, 6, generator=g).to(device)
    calls = recorded_implementations(monkeypatch)
    sampler.sample(z, 5)
    sampler.log_prob(z, torch.arange(60, device=device))
    sampler.sample_and_score(z, 5, torch.arange(3, device=device))
    assert calls == 3 * [expected_implementation(backend, device)]


@pytest.mark.parametrize("quantizer", ["rq", "pq"])
def test_torch_and_triton_backends_draw_the_same_negatives(quantizer, device):
    """The kernel and the reference round differently in the last bits of fp32 only (``log q``
    within 1e-5, not bitwise), so a draw could change bins only where its uniform falls that
    close to a boundary of the inverse CDF: at these seeds none does, and the same generator
    seed draws the same ids."""
    skip_unless_the_kernel_runs_on(device)
    g = torch.Generator().manual_seed(12)
    table, z = torch.randn(300, 16, generator=g), torch.randn(37, 16, generator=g).to(device)
    ids = torch.arange(300, device=device)

    def draw_and_score(backend):
        sampler = MIDXSampler(300, 8, quantizer, padding_idx=3, kmeans_iters=5, backend=backend)
        sampler.refresh(table)
        sampler.to(device)
        with warnings.catch_warnings():  # the interpreter's numpy warns on log(0) = -inf
            warnings.simplefilter("ignore", RuntimeWarning)
            generator = torch.Generator(device=device).manual_seed(13)
            return sampler.sample(z, 200, generator=generator), sampler.log_prob(z, ids)

    want, want_scores = draw_and_score("torch")
    got, got_scores = draw_and_score("triton")
    assert torch.equal(got.ids, want.ids)
    torch.testing.assert_close(got.log_q, want.log_q, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_scores, want_scores, atol=1e-5, rtol=1e-5)
    assert got_scores[:, 3].eq(-math.inf).all()


def test_a_bad_backend_is_a_value_error_naming_it():
    with pytest.raises(ValueError, match=r"backend must be one of .*, got 'cuda'"):
        MIDXSampler(10, 2, backend="cuda")
    with pytest.raises(ValueError, match=r"backend must be one of .*, got 'Triton'"):
        codeword_logits(*inputs(5, 4, 3, 3), backend="Triton")
    with pytest.raises(ValueError, match="backend='triton' needs mode='fast'"):
        MIDXSampler(10, 2, mode="exact", backend="triton")
    z1, z2, c1, c2, log_counts = inputs(5, 4, 3, 3)
    with pytest.raises(ValueError, match=r"log_counts of shape \[K, K\]"):
        codeword_logits_triton(z1, z2, c1, c2, log_counts.expand(5, -1, -1))


def test_the_triton_backend_fails_clearly_where_the_kernel_cannot_run(monkeypatch):
    sampler = MIDXSampler(30, 3, kmeans_iters=2, backend="triton")
    sampler.refresh(torch.randn(30, 4, generator=torch.Generator().manual_seed(14)))
    z = torch.randn(2, 4)
    monkeypatch.setattr(module, "triton_interpreted", lambda: False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        sampler.sample(z, 3)
    monkeypatch.setattr(module, "triton", None)
    with pytest.raises(RuntimeError, match="needs Triton, which is not installed"):
        sampler.sample(z, 3)


def test_the_sampler_reports_its_backend():
    assert MIDXSampler(30, 3).extra_repr().endswith("backend='auto'")
    assert "backend='torch'" in repr(MIDXSampler(30, 3, backend="torch"))
