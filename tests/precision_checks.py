"""A check shared by the heads' tests: queries in any float dtype are scored like fp32 ones."""

import torch
from fake_samplers import restart_draws


def assert_scored_like_fp32(head, dtype: torch.dtype, batch: int = 8):
    """Half-precision ``z`` is scored in fp32 (fp64 ``z`` in fp64): the loss of ``head`` equals
    the loss of the same values in fp32 to within 1e-6, where a bf16 / fp16 product (logit
    errors ~1e-3) would not, and the gradient comes back in ``z``'s dtype. Both losses see the
    same draws (torch's global generator and the samplers' draw streams are restarted before
    each, :func:`fake_samplers.restart_draws`).

    Returns:
        ``(z, z32, y)``: the queries ``[batch, D]`` in ``dtype`` and in fp32, and the targets.
    """
    z = (3 * torch.randn(batch, head.dim)).to(dtype).requires_grad_()
    z32 = z.detach().float().requires_grad_()
    y = torch.randint(head.num_classes, (batch,))
    restart_draws(head, 1)
    loss = head(z, y)
    restart_draws(head, 1)
    want = head(z32, y)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, want, rtol=1e-6, atol=1e-6)
    (got_grad,) = torch.autograd.grad(loss, z)
    (want_grad,) = torch.autograd.grad(want, z32)
    assert got_grad.dtype == dtype
    rounding = max(torch.finfo(dtype).eps, 1e-5)  # z's own rounding, fp32's for fp64
    torch.testing.assert_close(got_grad.float(), want_grad, rtol=rounding, atol=1e-6)
    return z, z32, y
