"""The fused cross-entropy kernels (``kernels/linear_cross_entropy.py``) against their torch
references and against ``F.cross_entropy``, on the CPU (Triton's interpreter, ``make test``) and
on CUDA (compiled, ``make test-gpu``); see ``test_codeword_logits.py`` for why a process runs one
of the two."""

import importlib
import math

import pytest
import torch
import torch.nn.functional as F
from kernel_runs import skip_unless_the_kernel_runs_on

from lightning_sampled.kernels.linear_cross_entropy import (
    lse_partials_reference,
    lse_partials_triton,
    softmax_grad_reference,
    softmax_grad_triton,
)

module = importlib.import_module("lightning_sampled.kernels.linear_cross_entropy")

#: (max abs error allowed on the log-normalisers, on the logit gradients) per matmul dtype; the
#: interpreter rounds to bf16 by truncation, the GPU to nearest
TOLERANCE = {
    torch.float32: (1e-4, 1e-6),
    torch.float16: (1e-2, 2e-3),
    torch.bfloat16: (1.0, 3e-2),
}


def problem(device, t=37, n=301, d=40, seed=0, scale=1.0):
    """Queries ``[t, d]``, table ``[n, d]``, bias ``[n]``, per-class scales ``[n]``, targets."""
    g = torch.Generator().manual_seed(seed)
    z = scale * torch.randn(t, d, generator=g)
    w = torch.randn(n, d, generator=g) / math.sqrt(d)
    b = torch.randn(n, generator=g)
    s = torch.rand(n, generator=g) + 0.5
    y = torch.randint(0, n, (t,), generator=g)
    return [x.to(device) for x in (z, w, b, s, y)]


@pytest.mark.parametrize("dtype", list(TOLERANCE), ids=str)
@pytest.mark.parametrize(
    "with_bias, with_scale, padding_idx", [(False, False, None), (True, True, 7)]
)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_lse_partials_equal_the_reference(
    device, dtype, with_bias, with_scale, padding_idx, num_splits
):  # noqa: E501
    skip_unless_the_kernel_runs_on(device)
    z, w, b, s, y = problem(device)
    y[1] = 0
    args = (z, w, b if with_bias else None, s if with_scale else None, y, padding_idx, dtype)
    want = lse_partials_reference(*args)
    got = lse_partials_triton(*args, num_splits=num_splits)
    atol = TOLERANCE[dtype][0]
    assert lse_partials_triton(*args, with_logit_sum=False)[2] is None
    for name, g, r in zip(("lse", "target logit", "logit sum"), got, want, strict=True):
        assert g.dtype == torch.float32 and g.shape == (37,)
        torch.testing.assert_close(g, r, atol=atol * (40 if name == "logit sum" else 1), rtol=0)


def test_lse_of_the_plain_case_is_torch_logsumexp_and_the_loss_is_cross_entropy(device):
    skip_unless_the_kernel_runs_on(device)
    z, w, _, _, y = problem(device, t=50, n=1000, d=24)
    lse, target_logit, _ = lse_partials_triton(z, w, None, None, y, None, torch.float32)
    logits = z @ w.T
    torch.testing.assert_close(lse, torch.logsumexp(logits, dim=1), atol=1e-5, rtol=0)
    torch.testing.assert_close(
        lse - target_logit, F.cross_entropy(logits, y, reduction="none"), atol=1e-5, rtol=0
    )


def test_huge_logits_keep_a_finite_log_normaliser_and_a_padding_target_an_infinite_loss(device):
    skip_unless_the_kernel_runs_on(device)
    z, w, _, _, y = problem(device, scale=3e3)
    y[0] = 5
    lse, target_logit, _ = lse_partials_triton(z, w, None, None, y, 5, torch.float32)
    assert torch.isfinite(lse).all() and lse.abs().max() > 1e3
    torch.testing.assert_close(
        lse, lse_partials_reference(z, w, None, None, y, 5, torch.float32)[0], rtol=1e-6, atol=0
    )
    assert target_logit[0] == -math.inf  # the padding class has probability 0


@pytest.mark.parametrize("dtype", list(TOLERANCE), ids=str)
@pytest.mark.parametrize("start, end", [(0, 301), (33, 250), (290, 301)])
def test_softmax_grad_equals_the_reference(device, dtype, start, end):
    skip_unless_the_kernel_runs_on(device)
    z, w, b, s, y = problem(device)
    y[0], y[1] = 40, 7  # a target inside the block, one on the padding class
    row_grad = torch.rand(37, generator=torch.Generator().manual_seed(3)).to(device)
    lse = lse_partials_reference(z, w, b, s, y, 7, dtype)[0]
    args = (z, w, b, s, y, lse, row_grad, start, end, 7, 0.9, 1e-3, dtype, dtype)
    got = softmax_grad_triton(*args)
    assert got.dtype == dtype and got.shape == (37, end - start)
    want = softmax_grad_reference(*args)
    torch.testing.assert_close(got.float(), want.float(), atol=TOLERANCE[dtype][1], rtol=0)
    if start <= 7 < end:  # the padding column gets no gradient (but from a padding target)
        assert (got[y != 7, 7 - start] == 0).all() and (got[1, 7 - start] < 0).all()


def test_softmax_grad_rows_sum_to_the_smoothed_target_terms(device):
    """Each full row of ``G / g`` sums to ``1 - h - e N'``: softmax sums to one."""
    skip_unless_the_kernel_runs_on(device)
    z, w, b, _, y = problem(device)
    lse = lse_partials_triton(z, w, b, None, y, None, torch.float32)[0]
    ones = torch.ones(37, device=device)
    grad = softmax_grad_triton(
        z, w, b, None, y, lse, ones, 0, 301, None, 0.8, 0.2 / 301, torch.float32, torch.float32
    )
    torch.testing.assert_close(grad.sum(dim=1), torch.zeros_like(ones), atol=1e-5, rtol=0)


def test_no_queries_give_empty_outputs(device):
    skip_unless_the_kernel_runs_on(device)
    z, w, _, _, y = problem(device, t=0)
    lse, target_logit, logit_sum = lse_partials_triton(z, w, None, None, y, None, torch.float32)
    assert lse.shape == target_logit.shape == logit_sum.shape == (0,)
    grad = softmax_grad_triton(
        z, w, None, None, y, lse, lse, 0, 10, None, 1.0, 0.0, torch.float32, torch.float32
    )
    assert grad.shape == (0, 10)


def test_the_kernels_fail_clearly_where_they_cannot_run(monkeypatch):
    z, w, _, _, y = problem("cpu")
    for dtype in (torch.int32, torch.float64):  # Triton's dot does not compile fp64 for Hopper
        with pytest.raises(ValueError, match="runs its matmuls in one of"):
            lse_partials_triton(z, w, None, None, y, None, dtype)
    monkeypatch.setattr(module, "triton_interpreted", lambda: False)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        lse_partials_triton(z, w, None, None, y, None, torch.float32)
    monkeypatch.setattr(module, "triton", None)
    with pytest.raises(RuntimeError, match="needs Triton, which is not installed"):
        lse_partials_triton(z, w, None, None, y, None, torch.float32)
