"""FullSoftmaxHead and the exact OutputHead methods against plain PyTorch."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lightning_sampled.heads import FullSoftmaxHead, OneVsEachHead, SampledSoftmaxHead
from lightning_sampled.metrics import NDCG

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make_head(num_classes=1037, dim=24, bias=True, padding_idx=None, chunk_size=100, seed=0):
    torch.manual_seed(seed)
    head = FullSoftmaxHead(
        num_classes, dim, bias=bias, padding_idx=padding_idx, chunk_size=chunk_size
    )
    if bias:
        with torch.no_grad():
            head.bias.normal_()
    return head


def reference_logits(head, z):
    logits = z @ head.weight.T
    if head.bias is not None:
        logits = logits + head.bias
    if head.padding_idx is not None:
        logits[..., head.padding_idx] = -math.inf
    return logits


def grads(loss, tensors):
    return torch.autograd.grad(loss, tensors)


@pytest.mark.parametrize("chunk_size", [1, 97, 1037, 5000])
@pytest.mark.parametrize("bias", [False, True])
def test_loss_and_gradients_equal_plain_cross_entropy(chunk_size, bias):
    head = make_head(bias=bias, chunk_size=chunk_size)
    z = torch.randn(6, 7, 24, requires_grad=True)
    y = torch.randint(1037, (6, 7))
    y[0, :3] = -100
    params = [z, head.weight] + ([head.bias] if bias else [])
    loss = head(z, y)
    ref = F.cross_entropy(reference_logits(head, z).reshape(-1, 1037), y.reshape(-1))
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads(loss, params), grads(ref, params), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_padding_class_is_never_predicted_and_matches_masked_reference():
    head = make_head(padding_idx=0, chunk_size=64)
    z = torch.randn(50, 24, requires_grad=True)
    y = torch.randint(1, 1037, (50,))
    loss = head(z, y)
    ref = F.cross_entropy(reference_logits(head, z), y)
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grads(loss, [z])[0], grads(ref, [z])[0], rtol=1e-5, atol=1e-5)
    _, top = head.topk(z, 1036)
    assert not bool((top == 0).any())


def test_bf16_autocast_is_close_to_fp32_reference():
    head = make_head(chunk_size=128)
    z = torch.randn(32, 24, requires_grad=True)
    y = torch.randint(1037, (32,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = head(z, y)
    assert loss.dtype == torch.float32
    ref = F.cross_entropy(reference_logits(head, z), y)
    torch.testing.assert_close(loss, ref, rtol=2e-2, atol=2e-2)
    got, want = grads(loss, [z, head.weight]), grads(ref, [z, head.weight])
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype
        assert (g - w).norm() / w.norm() < 3e-2


def test_bf16_inputs_give_bf16_input_gradients():
    head = make_head(bias=False, chunk_size=256)
    z = torch.randn(16, 24).bfloat16().requires_grad_()
    y = torch.randint(1037, (16,))
    loss = head(z, y)
    (gz,) = grads(loss, [z])
    assert gz.dtype == torch.bfloat16
    ref = F.cross_entropy(reference_logits(head, z.float()), y)
    (want,) = grads(ref, [z])
    assert (gz.float() - want.float()).norm() / want.float().norm() < 2e-2


def test_log_prob_equals_log_softmax_and_is_zero_at_ignored_positions():
    head = make_head(chunk_size=113)
    z = torch.randn(4, 9, 24)
    y = torch.randint(1037, (4, 9))
    y[1, 2] = -100
    got = head.log_prob(z, y)
    want = torch.log_softmax(reference_logits(head, z), -1).gather(-1, y.clamp(min=0)[..., None])
    want = want.squeeze(-1).masked_fill(y == -100, 0.0)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_logits_equal_brute_force():
    head = make_head(padding_idx=5, chunk_size=300)
    z = torch.randn(3, 2, 24)
    torch.testing.assert_close(head.logits(z), reference_logits(head, z), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("k", [1, 10, 333])
def test_topk_equals_brute_force(k):
    head = make_head(chunk_size=97)
    z = torch.randn(5, 3, 24)
    values, indices = head.topk(z, k)
    full = reference_logits(head, z)
    want_v, want_i = full.topk(k, dim=-1)
    assert indices.shape == (5, 3, k)
    torch.testing.assert_close(values, want_v, rtol=1e-5, atol=1e-5)
    # the same classes up to the order of float near-ties: each returned id really has the
    # score reported for it, no id twice, and the set equals brute force where no tie straddles k
    torch.testing.assert_close(full.gather(-1, indices), values, rtol=1e-5, atol=1e-5)
    assert (indices.sort(-1).values.diff(dim=-1) > 0).all()
    agree = (indices == want_i).float().mean()
    assert agree > 0.99, agree


def test_topk_excludes_given_ids():
    head = make_head(chunk_size=97)
    z = torch.randn(8, 24)
    full = reference_logits(head, z)
    exclude = full.topk(5, dim=-1).indices  # exclude each row's own best five
    exclude[0, 3:] = -1  # padding entries are ignored
    masked = full.clone()
    for row in range(8):
        ids = exclude[row][exclude[row] >= 0]
        masked[row, ids] = -math.inf
    _, got = head.topk(z, 20, exclude=exclude)
    torch.testing.assert_close(got, masked.topk(20, dim=-1).indices)


@pytest.mark.parametrize("batch", [(0,), (3, 0), (0, 4)])
@pytest.mark.parametrize("num_excluded", [0, 5])
def test_topk_of_an_empty_batch_with_exclusions_is_empty(batch, num_excluded):
    head = make_head(chunk_size=97)
    z = torch.empty(*batch, 24)
    exclude = torch.empty(*batch, num_excluded, dtype=torch.long)
    values, indices = head.topk(z, 10, exclude=exclude)
    assert values.shape == indices.shape == (*batch, 10)
    assert values.dtype == torch.float32
    assert indices.dtype == torch.long


def test_all_ignored_gives_zero_loss_with_gradient():
    head = make_head()
    z = torch.randn(3, 24, requires_grad=True)
    loss = head(z, torch.full((3,), -100))
    assert loss.item() == 0.0
    loss.backward()
    assert torch.equal(z.grad, torch.zeros_like(z))


def test_tied_weight_is_shared():
    emb = torch.nn.Embedding(50, 8)
    head = FullSoftmaxHead(50, 8, weight=emb.weight)
    assert head.weight is emb.weight
    head(torch.randn(4, 8), torch.randint(50, (4,))).backward()
    assert emb.weight.grad is not None


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_classes=0, dim=4), "num_classes"),
        (dict(num_classes=10, dim=-1), "dim"),
        (dict(num_classes=10, dim=4, padding_idx=10), "padding_idx"),
        (dict(num_classes=10, dim=4, ignore_index=3), "ignore_index"),
        (dict(num_classes=10, dim=4, weight=torch.nn.Parameter(torch.zeros(9, 4))), "weight"),
        (dict(num_classes=10, dim=4, weight=torch.zeros(10, 4)), "weight"),
        (dict(num_classes=10, dim=4, chunk_size=0), "chunk_size"),
        # integers only: no float truncated, no bool, no string parsed
        (dict(num_classes=10, dim=4, ignore_index=-1.5), "ignore_index must be an int, got -1.5"),
        (dict(num_classes=10, dim=4, ignore_index=-1.0), "ignore_index must be an int, got -1.0"),
        (dict(num_classes=10, dim=4, ignore_index=True), "ignore_index must be an int, got True"),
        (dict(num_classes=10, dim=4, ignore_index="-1"), "ignore_index must be an int, got '-1'"),
        (dict(num_classes=10, dim=4, ignore_index=None), "ignore_index must be an int, got None"),
        (dict(num_classes=10.0, dim=4), "num_classes must be a positive integer, got 10.0"),
        (dict(num_classes=True, dim=4), "num_classes must be a positive integer, got True"),
        (dict(num_classes=10, dim=4.5), "dim must be a positive integer, got 4.5"),
        (
            dict(num_classes=10, dim=4, padding_idx=1.0),
            "padding_idx must be an int or None, got 1.0",
        ),
        (
            dict(num_classes=10, dim=4, padding_idx=True),
            "padding_idx must be an int or None, got True",
        ),
        (
            dict(num_classes=10, dim=4, chunk_size=2.5),
            "chunk_size must be a positive integer, got 2.5",
        ),
    ],
)
def test_constructor_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FullSoftmaxHead(**kwargs)


def test_numpy_integers_are_accepted_as_python_ints():
    head = FullSoftmaxHead(
        np.int64(10), np.int32(4), padding_idx=np.int64(2), ignore_index=np.int8(-1)
    )
    assert (head.num_classes, head.dim, head.padding_idx, head.ignore_index) == (10, 4, 2, -1)
    assert all(
        type(v) is int for v in (head.num_classes, head.dim, head.padding_idx, head.ignore_index)
    )
    assert head.topk(torch.randn(3, 4), np.int64(2))[1].shape == (3, 2)


def test_bad_runtime_input_is_rejected():
    head = FullSoftmaxHead(10, 4, padding_idx=0)
    z = torch.randn(3, 4)
    with pytest.raises(IndexError, match="target.*got 10"):
        head(z, torch.tensor([1, 2, 10]))
    with pytest.raises(IndexError, match="target.*got -5"):
        head(z, torch.tensor([1, 2, -5]))
    with pytest.raises(IndexError, match="padding_idx"):
        head(z, torch.tensor([1, 0, 2]))
    with pytest.raises(ValueError, match="NaN"):
        head(torch.tensor([[float("nan")] * 4] * 3), torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="inf"):
        head(torch.full((3, 4), float("inf")), torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match=r"z must have shape \[\.\.\., 4\]"):
        head(torch.randn(3, 5), torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="target must have shape"):
        head(z, torch.tensor([1, 2]))
    with pytest.raises(
        ValueError, match="z must be a floating-point tensor, got dtype torch.int64"
    ):
        head.logits(torch.ones(3, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="k must be <= num_classes=10, got 11"):
        head.topk(z, 11)
    with pytest.raises(ValueError, match="k must be a positive integer, got 2.0"):
        head.topk(z, 2.0)
    with pytest.raises(ValueError, match="k must be a positive integer, got True"):
        head.topk(z, True)
    with pytest.raises(IndexError, match="exclude"):
        head.topk(z, 2, exclude=torch.tensor([[12], [1], [1]]))
    # a bool mask or float ids would be cast to ids silently
    with pytest.raises(ValueError, match="exclude must be an integer tensor, got dtype torch.bool"):
        head.topk(z, 2, exclude=torch.ones(3, 10, dtype=torch.bool))
    with pytest.raises(
        ValueError, match="exclude must be an integer tensor, got dtype torch.float"
    ):
        head.topk(z, 2, exclude=torch.full((3, 1), 1.7))
    with pytest.raises(ValueError, match=r"exclude must have shape \(\) \+ \(E,\), got \(\)"):
        head.topk(z[0], 2, exclude=torch.tensor(3))


@pytest.mark.parametrize("head_class", [FullSoftmaxHead, SampledSoftmaxHead, OneVsEachHead])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_exact_methods_take_queries_of_any_float_dtype_outside_autocast(head_class, dtype):
    """Half-precision ``z`` is scored in fp32 (fp64 ``z`` in fp64) by every head's exact methods:
    they equal the fp32 results for the same values to within 1e-5, where a bf16 / fp16 product
    (logit errors ~1e-2 here) would not; gradients come back in ``z``'s dtype."""
    base = make_head(padding_idx=3, chunk_size=100)
    head = head_class(1037, 24, weight=base.weight, bias=True, padding_idx=3, chunk_size=100)
    head.bias = base.bias
    z = (3 * torch.randn(2, 5, 24)).to(dtype).requires_grad_()
    z32 = z.detach().float().requires_grad_()
    y = torch.randint(4, 1037, (2, 5))
    exclude = torch.randint(-1, 1037, (2, 5, 7))
    exclude[exclude == 3] = -1
    tight = dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(head.logits(z), head.logits(z32), **tight)
    torch.testing.assert_close(head.log_prob(z, y), head.log_prob(z32, y), **tight)
    loss, want = head.full_loss(z, y), head.full_loss(z32, y)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, want, **tight)
    (got_grad,) = grads(loss, [z])
    (want_grad,) = grads(want, [z32])
    assert got_grad.dtype == dtype
    rounding = max(torch.finfo(dtype).eps, 1e-5)  # z's own rounding, fp32's for fp64
    torch.testing.assert_close(got_grad.float(), want_grad, rtol=rounding, atol=1e-6)
    values, indices = head.topk(z, 10, exclude=exclude)
    want_values, want_indices = head.topk(z32, 10, exclude=exclude)
    assert values.dtype == torch.float32
    torch.testing.assert_close(values, want_values, **tight)
    torch.testing.assert_close(indices, want_indices)


@pytest.mark.parametrize("where", ["table", "bias"])
def test_topk_refuses_a_class_table_with_nan_or_inf_instead_of_ranking_it_first(where):
    head = make_head(num_classes=50)
    with torch.no_grad():
        if where == "table":
            head.weight[7, 2] = math.nan
            head.weight[30] = math.inf
        else:
            head.bias[7] = math.nan
            head.bias[30] = -math.inf
    with pytest.raises(ValueError, match=rf"the {'class table' if where == 'table' else 'bias'} "
                       r"holds NaN or inf values at classes \[7, 30\] \(2 in all\)"):  # fmt: skip
        head.topk(torch.randn(3, 24), 5)


def test_topk_beyond_the_classes_left_gives_minus_one_which_no_metric_counts_as_a_hit():
    """k greater than the classes left after exclude / padding_idx: those ranks hold -1 (with
    -inf), not an excluded or padding id that a user's NDCG would count as a hit."""
    head = make_head(num_classes=6, padding_idx=0)
    z = torch.randn(2, 24)
    exclude = torch.tensor([[1, 2], [3, -1]])
    values, indices = head.topk(z, 6, exclude=exclude)
    assert (indices[0, 3:] == -1).all() and (indices[1, 4:] == -1).all()
    assert torch.isinf(values[indices == -1]).all() and (indices[indices >= 0] > 0).all()
    for row, excluded in enumerate(([0, 1, 2], [0, 3])):
        assert not set(indices[row].tolist()) & set(excluded)
    ndcg = NDCG(k=6)
    ndcg.update(indices, torch.tensor([1, 0]))  # excluded, and the padding class
    assert float(ndcg.compute()) == 0.0
