"""``FullSoftmaxHead(backend=...)``: every backend against plain ``F.cross_entropy`` in loss and
gradients, ``"auto"``'s choice, and the errors for backends that cannot run or lack an option.

The Triton backend runs on the CPU under Triton's interpreter (``make test``) and compiled on
CUDA (``make test-gpu``, the ``gpu`` cases)."""

import importlib.util

import pytest
import torch
import torch.nn.functional as F
from kernel_runs import needs_cuda, skip_unless_the_kernel_runs_on

from lightning_sampled.heads import FullSoftmaxHead, exact_backends
from lightning_sampled.heads.exact_backends import EXACT_BACKENDS, resolve_backend

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N, D = 613, 32
#: the backends that run here; on the CPU Cut Cross-Entropy runs its torch.compile implementation
RUNNABLE = [b for b in EXACT_BACKENDS[1:] if exact_backends.backend_missing(b) is None]
#: the options each backend is checked with (all it supports)
OPTIONS = {
    "torch": dict(bias=True, padding_idx=3, label_smoothing=0.1),
    "triton": dict(bias=True, padding_idx=3, label_smoothing=0.1),
    "linear_cross_entropy": dict(bias=True),
    "cut_cross_entropy": {},
}


def make(backend, device="cpu", seed=0, **options):
    torch.manual_seed(seed)
    head = FullSoftmaxHead(N, D, backend=backend, **options).to(device)
    with torch.no_grad():
        head.weight.normal_(0.0, 0.3)
        if head.bias is not None:
            head.bias.normal_()
    return head


def reference_loss(head, z, y, sample_weight=None):
    """Plain ``F.cross_entropy`` on the whole logits (padding column dropped, so that label
    smoothing spreads over the other classes, as the head defines it)."""
    logits = z.float() @ head.weight.float().T
    if head.bias is not None:
        logits = logits + head.bias.float()
    keep = [c for c in range(N) if c != head.padding_idx]
    y = y.clone()
    if head.padding_idx is not None:
        y = torch.where(y > head.padding_idx, y - 1, y)
        logits = logits[:, keep]
    losses = F.cross_entropy(logits, y, reduction="none", label_smoothing=head.label_smoothing)
    w = torch.ones_like(losses) if sample_weight is None else sample_weight
    return (losses * w).sum() / w.sum()


def batch(device, t=45, seed=1):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(t, D, generator=g).to(device).requires_grad_()
    y = torch.randint(4, N, (t,), generator=g).to(device)
    w = torch.rand(t, generator=g).to(device)
    return z, y, w


def loss_and_grads(loss, head, z):
    return [loss.detach(), *torch.autograd.grad(loss, [z, *head.parameters()])]


def skip_unless_it_runs_on(backend, device):
    if backend == "triton":
        skip_unless_the_kernel_runs_on(device)
    if backend == "cut_cross_entropy" and device.type == "cuda":
        pytest.skip("Cut Cross-Entropy's CUDA backward takes bf16 / fp16 only (test below)")


@pytest.mark.parametrize("backend", RUNNABLE)
def test_each_backend_equals_plain_cross_entropy_in_fp32(backend, device):
    skip_unless_it_runs_on(backend, device)
    head = make(backend, device, **OPTIONS[backend])
    z, y, w = batch(device)
    got = loss_and_grads(head(z, y, w), head, z)
    want = loss_and_grads(reference_loss(head, z, y, w), head, z)
    for g, r in zip(got, want, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("options", [dict(normalize=True, temperature=0.2), dict(chunk_size=130)])
def test_the_triton_backend_equals_the_torch_backend_with_cosine_scores_and_small_chunks(
    options, device
):
    skip_unless_the_kernel_runs_on(device)
    z, y, w = batch(device)
    heads = [make(backend, device, **options) for backend in ("torch", "triton")]
    got, want = (loss_and_grads(h(z, y, w), h, z) for h in heads)
    for g, r in zip(got, want, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_triton_backend_under_autocast_is_as_close_to_fp32_as_plain_half_cross_entropy(dtype):
    """On CUDA: against cross-entropy in fp32 of the rounded operands, the loss within 1e-3
    relative, and every gradient no further off than ``F.cross_entropy`` on half-precision
    logits (the kernel writes the logit gradients in the matmul dtype, as that path does)."""
    device = "cuda"
    skip_unless_the_kernel_runs_on(device)
    head = make("triton", device, **OPTIONS["triton"])
    z, y, w = batch(device, t=300)
    with torch.autocast("cuda", dtype=dtype):
        got = loss_and_grads(head(z, y, w), head, z)
    rounded = make("torch", device, **OPTIONS["torch"])
    with torch.no_grad():
        rounded.weight.copy_(head.weight.to(dtype))
        rounded.bias.copy_(head.bias)
    z_r = z.detach().to(dtype).float().requires_grad_()
    want = loss_and_grads(reference_loss(rounded, z_r, y, w), rounded, z_r)
    with torch.autocast("cuda", dtype=dtype):
        plain = loss_and_grads(reference_loss(rounded, z_r, y, w), rounded, z_r)
    torch.testing.assert_close(got[0], want[0], rtol=1e-3, atol=0)
    for g, r, p in zip(got[1:], want[1:], plain[1:], strict=True):
        assert (g.float() - r).abs().max() <= 1.5 * (p.float() - r).abs().max() + 1e-7


def test_the_triton_backend_takes_a_half_precision_table_and_writes_its_gradient_in_that_dtype(
    device,
):
    skip_unless_the_kernel_runs_on(device)
    head = make("triton", device).to(torch.bfloat16)
    z, y, _ = batch(device)
    head(z.to(torch.bfloat16), y).backward()
    assert head.weight.grad.dtype == torch.bfloat16
    assert torch.isfinite(head.weight.grad.float()).all()


def test_auto_picks_the_torch_path_on_the_cpu_and_says_so():
    head = FullSoftmaxHead(N, D)
    z = torch.randn(3, D)
    assert head.backend == "auto" and resolve_backend("auto", z) == "torch"
    assert "backend='auto' (torch on cpu)" in repr(head)
    assert "backend='triton'" in repr(FullSoftmaxHead(N, D, backend="triton"))


@pytest.mark.gpu
@needs_cuda
def test_auto_picks_the_fused_kernel_on_cuda_but_the_torch_path_for_fp64():
    z = torch.randn(3, D, device="cuda")
    want = "triton" if exact_backends.TRITON_INSTALLED else "torch"
    assert resolve_backend("auto", z) == want
    assert resolve_backend("auto", z.double()) == "torch"


def test_bad_backends_and_options_a_backend_lacks_fail_at_construction(monkeypatch):
    with pytest.raises(ValueError, match=r"backend must be one of .*, got 'cce'"):
        FullSoftmaxHead(N, D, backend="cce")
    with pytest.raises(ValueError, match="'cut_cross_entropy' does not support bias, padding_idx"):
        FullSoftmaxHead(N, D, backend="cut_cross_entropy", bias=True, padding_idx=0)
    monkeypatch.setattr(exact_backends, "backend_missing", lambda backend: None)
    with pytest.raises(ValueError, match="'linear_cross_entropy' does not support label_smoothing"):
        FullSoftmaxHead(N, D, backend="linear_cross_entropy", label_smoothing=0.1)
    monkeypatch.undo()
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "cut_cross_entropy" else real_find_spec(name, *a),
    )
    with pytest.raises(ValueError, match="cannot run here: it needs Cut Cross-Entropy"):
        FullSoftmaxHead(N, D, backend="cut_cross_entropy")
    monkeypatch.delattr(F, "linear_cross_entropy", raising=False)
    with pytest.raises(ValueError, match="has no F.linear_cross_entropy"):
        FullSoftmaxHead(N, D, backend="linear_cross_entropy")
