"""A head's training forward and backward on CUDA make no host sync; the optimizer step's
remaining syncs are named.

Each case builds a head on the GPU, runs one warm-up step outside the check (cuBLAS handles,
Triton's compilation, the index built by ``refresh_index``: those sync once) and then one
forward and backward under ``torch.cuda.set_sync_debug_mode("error")``, which raises on any
``.item()``, ``nonzero``, ``bool(tensor)`` or blocking copy between host and device.

Known syncs, each asserted so that a change shows up here:

- ``TapasHead``: the first pass draws until ``k + 1`` distinct classes are seen
  (:func:`~lightning_sampled.heads.tapas.draw_distinct`): ``torch.unique`` of a stream whose
  length depends on the draws, one sync per round.
- ``LazyAdam`` on a sparse gradient: ``torch.unique`` of the touched rows
  (:func:`~lightning_sampled.optim.lazy_adam._summed_rows`), whose count ``R`` sizes every later
  tensor of the update; the row update itself (:func:`_update_block`) and the dense Adam of the
  other parameters make none.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import torch

from lightning_sampled.heads import CaneHead, SampledSoftmaxHead, TapasHead
from lightning_sampled.optim import LazyAdam
from lightning_sampled.optim.lazy_adam import _summed_rows, _update_block
from lightning_sampled.samplers import MIDXSampler

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

N, D, M, K = 50_000, 64, 100, 32
SHAPE = (16, 256)  # 4,096 positions, as a sequence model's [batch, length]
IGNORE = -100


@contextmanager
def sync_debug(mode: str) -> Iterator[None]:
    """Runs the block under ``torch.cuda.set_sync_debug_mode(mode)``, then restores it."""
    before = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode(mode)
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(before)


def midx(quantizer: str = "rq", backend: str = "auto") -> Callable[[], MIDXSampler]:
    return lambda: MIDXSampler(N, K, quantizer, backend=backend)


needs_compiled_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or os.environ.get("TRITON_INTERPRET") == "1",
    reason="needs Triton compiled (TRITON_INTERPRET=0)",
)

HEADS = {
    "uniform": lambda **kw: SampledSoftmaxHead(N, D, num_negatives=M, **kw),
    "uniform_shared": lambda **kw: SampledSoftmaxHead(
        N, D, num_negatives=M, shared_negatives=True, **kw
    ),
    "midx_rq_torch": lambda **kw: SampledSoftmaxHead(N, D, midx("rq", "torch")(), M, **kw),
    "midx_pq_torch": lambda **kw: SampledSoftmaxHead(N, D, midx("pq", "torch")(), M, **kw),
    # the default convention scores the positive by the same proposal (sample_and_score);
    # this one leaves it uncorrected: MIDXSampler.sample alone
    "midx_rq_exact_positive": lambda **kw: SampledSoftmaxHead(
        N, D, midx("rq", "torch")(), M, convention="exact_positive", **kw
    ),
    # the batch's targets in fixed shapes (SHAPE holds FIXED_SHAPE_POSITIONS positions), the
    # ignored ones kept and left out by their mask; q_b streamed by TargetFrequency.update
    "in_batch": lambda **kw: SampledSoftmaxHead(
        N, D, num_negatives=0, in_batch_negatives=True, **kw
    ),
    "mixed": lambda **kw: SampledSoftmaxHead(N, D, num_negatives=M, in_batch_negatives=True, **kw),
    # at most 512 in-batch draws: positions drawn by random keys in fixed shapes
    "mixed_limited": lambda **kw: SampledSoftmaxHead(
        N, D, num_negatives=M, max_in_batch_draws=512, **kw
    ),
    # groups of 64 rows share their 512 draws: one product per group
    "mixed_grouped": lambda **kw: SampledSoftmaxHead(
        N, D, num_negatives=M, max_in_batch_draws=512, in_batch_group_size=64, **kw
    ),
    "cane": lambda **kw: CaneHead(N, D, 20, 80, **kw),  # beam search from the root, 10-ary
    "cane_frequency": lambda **kw: CaneHead(
        N, D, 19, 1, tree="frequency", class_counts=1.0 / torch.arange(1, N + 1), **kw
    ),
    "midx_rq_triton": pytest.param(
        lambda **kw: SampledSoftmaxHead(N, D, midx("rq", "triton")(), M, **kw),
        marks=needs_compiled_triton,
    ),
}


def batch(
    weighted: bool, shape: tuple[int, int] = SHAPE, classes: int = N
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Queries ``[*shape, D]`` (``[16, 256, D]``), targets among ``classes`` with ignored
    positions, optional sample weights."""
    g = torch.Generator(device="cuda").manual_seed(0)
    z = torch.randn(*shape, D, device="cuda", generator=g, requires_grad=True)
    target = torch.randint(classes, shape, device="cuda", generator=g)
    target[:, -17:] = IGNORE  # padded ends of sequences
    weight = torch.rand(shape, device="cuda", generator=g) if weighted else None
    return z, target, weight


def step(
    head: torch.nn.Module, weighted: bool, shape: tuple[int, int] = SHAPE, classes: int = N
) -> None:
    z, target, weight = batch(weighted, shape, classes)
    head(z, target, weight).backward()


@pytest.mark.parametrize("sparse_grad", [True, False], ids=["sparse_grad", "dense_grad"])
@pytest.mark.parametrize("weighted", [False, True], ids=["", "sample_weight"])
@pytest.mark.parametrize("make", HEADS.values(), ids=HEADS.keys())
def test_sampled_softmax_forward_and_backward_make_no_host_sync(make, weighted, sparse_grad):
    head = make(ignore_index=IGNORE, sparse_grad=sparse_grad).cuda()
    head.refresh_index()  # on the table's device: k-means in torch
    step(head, weighted)  # warm-up: lazy initialisations and compilation sync once
    head.zero_grad(set_to_none=True)
    with sync_debug("error"):
        step(head, weighted)
    assert head.weight.grad is not None and head.weight.grad.is_sparse == sparse_grad


#: the in-batch configurations at a recommender's batch: the options beside ``in_batch_negatives``
RECOMMENDER_CASES = {
    "in_batch": {"num_negatives": 0},
    "mixed": {"num_negatives": M},
    "mixed_limited": {"num_negatives": M, "max_in_batch_draws": 256},
    "mixed_grouped": {"num_negatives": M, "max_in_batch_draws": 256, "in_batch_group_size": 32},
}


@pytest.mark.parametrize("shape", [(25, 256), (100, 256)], ids=["6400", "25600"])
@pytest.mark.parametrize("classes", [N, 3_706], ids=["50k_classes", "3706_classes"])
@pytest.mark.parametrize("name", list(RECOMMENDER_CASES))
def test_in_batch_negatives_make_no_host_sync_at_a_recommenders_batch(name, classes, shape):
    """Above 4,096 positions the batch's targets are still sorted in fixed shapes (no
    ``torch.unique``), in ``min(T, N)`` columns: MovieLens-1M's 3,706 items at 25,600
    positions take 3,706; the bounded forms draw positions by random keys in fixed shapes."""
    options = RECOMMENDER_CASES[name]
    head = SampledSoftmaxHead(
        classes, D, in_batch_negatives=True, ignore_index=IGNORE, **options
    ).cuda()
    step(head, False, shape, classes)
    head.zero_grad(set_to_none=True)
    with sync_debug("error"):
        step(head, False, shape, classes)
    assert head.weight.grad is not None


def test_tapas_first_pass_still_syncs():
    head = TapasHead(N, D, num_negatives=M, ignore_index=IGNORE, sparse_grad=True).cuda()
    step(head, False)
    with sync_debug("error"), pytest.raises(RuntimeError, match="synchroniz"):
        step(head, False)


def sparse_gradient_step() -> tuple[SampledSoftmaxHead, LazyAdam]:
    """A uniform head with a row-sparse gradient and a dense bias, and its LazyAdam."""
    head = SampledSoftmaxHead(N, D, num_negatives=M, bias=True, sparse_grad=True).cuda()
    optimizer = LazyAdam(head.parameters(), lr=1e-3)
    step(head, False)
    optimizer.step()  # creates the state
    optimizer.zero_grad(set_to_none=True)
    step(head, False)
    return head, optimizer


def test_lazy_adam_syncs_only_to_count_the_touched_rows():
    head, optimizer = sparse_gradient_step()
    grad = head.weight.grad
    with sync_debug("error"), pytest.raises(RuntimeError, match="synchroniz"):
        _summed_rows(grad)  # torch.unique: R distinct rows size the update
    rows, values = _summed_rows(grad)
    state = optimizer.state[head.weight]
    with sync_debug("error"):
        _update_block(
            head.weight.data,
            state["exp_avg"],
            state["exp_avg_sq"],
            rows,
            values,
            betas=(0.9, 0.999),
            eps=1e-8,
            step_size=1e-3,
            decay=1.0,
        )
    # the dense parameters alone (here the bias): torch's foreach Adam, steps on the host
    head.weight.grad = None
    with sync_debug("error"):
        optimizer.step()
