"""``torch.compile`` of the heads' training losses: graph breaks, and compiled equals eager.

``torch._dynamo.explain`` counts the graph breaks of the loss (the forward). It cannot follow
``loss.backward()``, which dynamo never traces (a break of its own, outside the head); the
backward graph is the one AOTAutograd derives from each forward graph, so a forward without
breaks compiles forward and backward as one graph each.

The compiled heads run with ``fallback_random`` so that their draws are eager's. Under compile the
sampled heads keep the ignored positions (weighted 0, for static shapes) and draw for them too,
so their draws match eager's only where the ignored positions come last.
"""

import copy
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch._dynamo
import torch._inductor.config
from fake_samplers import draw_like_compiled_code

from lightning_sampled.heads import FullSoftmaxHead, SampledSoftmaxHead, TapasHead
from lightning_sampled.kernels.codeword_logits import triton_interpreted
from lightning_sampled.samplers import LogUniformSampler, MIDXSampler, UnigramSampler

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[2]

N, D = 64, 8
IGNORE = -100


def midx_head():
    head = SampledSoftmaxHead(N, D, MIDXSampler(N, 4, kmeans_iters=3), num_negatives=7)
    head.refresh_index()
    return head


#: name -> (head factory, ignored flat positions of the [3, 5] batch, whether weighted)
HEADS = {
    "full": (lambda: FullSoftmaxHead(N, D, bias=True, padding_idx=0), (1, 7, 8), True),
    "full_smoothed": (
        lambda: FullSoftmaxHead(N, D, label_smoothing=0.1, temperature=0.5),
        (0, 14),
        False,
    ),
    "full_cosine": (lambda: FullSoftmaxHead(N, D, normalize=True), (4,), True),
    "uniform": (
        lambda: SampledSoftmaxHead(N, D, num_negatives=7, bias=True, padding_idx=0),
        (13, 14),
        False,
    ),
    "uniform_shared": (
        lambda: SampledSoftmaxHead(
            N, D, num_negatives=7, shared_negatives=True, convention="corrected_all", padding_idx=0
        ),
        (12, 13, 14),
        True,
    ),
    "unigram": (
        lambda: SampledSoftmaxHead(N, D, UnigramSampler(torch.arange(1.0, N + 1)), num_negatives=7),
        (14,),
        False,
    ),
    "log_uniform": (
        lambda: SampledSoftmaxHead(N, D, LogUniformSampler(N), num_negatives=7),
        (14,),
        False,
    ),
    # in-batch negatives: the ignored positions kept under compile are left out by their mask
    "in_batch": (
        lambda: SampledSoftmaxHead(
            N, D, num_negatives=0, in_batch_negatives=True, target_counts=torch.arange(1.0, N + 1)
        ),
        (1, 7, 8),
        True,
    ),
    "mixed": (
        lambda: SampledSoftmaxHead(
            N, D, num_negatives=7, in_batch_negatives=True, target_counts=torch.ones(N)
        ),
        (13, 14),
        False,
    ),
    # 6 of the 13 scored positions' targets as in-batch draws, drawn in the graph by random
    # keys in fixed shapes (ignored at the end: eager draws the same first 13 keys)
    "in_batch_limited": (
        lambda: SampledSoftmaxHead(
            N, D, num_negatives=0, target_counts=torch.arange(1.0, N + 1), max_in_batch_draws=6
        ),
        (13, 14),
        True,
    ),
    # groups of 4 rows share their 6 draws, scored by one product per group
    "in_batch_grouped": (
        lambda: SampledSoftmaxHead(
            N,
            D,
            num_negatives=0,
            target_counts=torch.arange(1.0, N + 1),
            max_in_batch_draws=6,
            in_batch_group_size=4,
        ),
        (13, 14),
        True,
    ),
    # q_b streamed (TargetFrequency.update in the graph): counted, so compared with eager apart
    "mixed_streaming": (
        lambda: SampledSoftmaxHead(N, D, num_negatives=7, in_batch_negatives=True),
        (0, 9),
        True,
    ),
    "tapas": (lambda: TapasHead(N, D, num_negatives=6, presample_factor=3), (2, 6), False),
    "midx": (midx_head, (), True),
}
BREAK_FREE = [
    "full", "full_smoothed", "uniform", "uniform_shared", "in_batch", "mixed", "in_batch_limited",
    "in_batch_grouped",
]  # fmt: skip


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    with torch._inductor.config.patch(fallback_random=True):
        yield
    torch._dynamo.reset()


def make(name):
    """A head of :data:`HEADS` (seeded) and its batch: ``z [3, 5, D]``, ``target [3, 5]`` with
    the head's ignored positions, ``sample_weight [3, 5]`` or ``None``."""
    factory, ignored, weighted = HEADS[name]
    torch.manual_seed(0)
    head = factory()
    z = torch.randn(3, 5, D)
    target = torch.randint(1, N, (3, 5))
    target.view(-1)[list(ignored)] = IGNORE
    return head, z, target, torch.rand(3, 5) + 0.5 if weighted else None


def break_files(name):
    """The graph-break count of the head's loss and the files the breaks happen in."""
    head, z, target, weight = make(name)
    explained = torch._dynamo.explain(head)(z, target, weight)
    files = {"/".join(b.user_stack[-1].filename.split("/")[-2:]) for b in explained.break_reasons}
    return explained.graph_break_count, files


@pytest.mark.parametrize("name", [*BREAK_FREE, "mixed_streaming", "unigram", "log_uniform", "midx"])
def test_training_loss_compiles_without_graph_breaks(name):
    assert break_files(name) == (0, set())


@pytest.mark.parametrize(
    ("name", "where"),
    [
        # the backward of the unit class vectors calls torch.autograd.grad, which dynamo does
        # not trace: the chunked cross-entropy runs eagerly between two graphs
        ("full_cosine", {"ops/chunked.py"}),
        # ignored positions are dropped (the second pass scores the whole batch, so they cannot
        # stay in, weighted 0), and the first pass draws until K + 1 distinct classes turn up
        ("tapas", {"ops/inputs.py", "heads/tapas.py"}),
    ],
)
def test_where_the_other_heads_still_break(name, where):
    """What is true today of the heads that still break: where they do. None of them breaks in
    the input checks or the sampled loss."""
    breaks, files = break_files(name)
    assert breaks > 0 and files == where


def loss_and_grads(head, fn, z, target, weight):
    """``fn(z, target, weight)`` and the gradients of ``z`` and of the head's parameters; the
    draws come from torch's default generator seeded just before (``draw_like_compiled_code``).
    """
    head.zero_grad()
    z = z.detach().clone().requires_grad_()
    torch.manual_seed(1)
    loss = fn(z, target, weight)
    loss.backward()
    grads = [p.grad.clone() for p in head.parameters()]
    return [loss.detach(), z.grad, *grads]


@pytest.mark.parametrize(
    ("name", "backend"),
    [(name, "inductor") for name in BREAK_FREE]
    + [(name, "aot_eager") for name in ("full_cosine", "tapas", "midx")],
)
def test_compiled_loss_and_gradients_equal_eager(name, backend):
    """Inductor for the heads without graph breaks; the others (TAPAS and MIDX: a dozen graphs
    each, 15 s apiece with inductor) through AOTAutograd's eager backend: the traced graphs, not
    the generated code, are what the compiled paths change."""
    head, z, target, weight = make(name)
    draw_like_compiled_code(head)
    before = copy.deepcopy(head.state_dict())  # a training call changes state (in-batch q_b)
    eager = loss_and_grads(head, head, z, target, weight)
    head.load_state_dict(before)
    compiled = loss_and_grads(head, torch.compile(head, backend=backend), z, target, weight)
    assert len(eager) == len(compiled) >= 3
    for want, got in zip(eager, compiled, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.skipif(
    triton_interpreted(),
    reason="the Triton interpreter is on in this process: `make test-gpu` compiles for CUDA",
)
@pytest.mark.parametrize("name", BREAK_FREE)
def test_compiled_loss_and_gradients_equal_eager_on_cuda(name):
    head, *batch = make(name)
    head = draw_like_compiled_code(head).cuda()
    z, target, weight = (None if t is None else t.cuda() for t in batch)
    eager = loss_and_grads(head, head, z, target, weight)
    compiled = loss_and_grads(head, torch.compile(head, fullgraph=True), z, target, weight)
    for want, got in zip(eager, compiled, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "name", ["unigram", "log_uniform", "uniform_shared", "in_batch_limited", "tapas", "midx"]
)
def test_a_changed_batch_shape_compiles_and_equals_eager(name):
    """A training loop's smaller last batch or another sequence length: the second shape
    recompiles with symbolic sizes (dynamo's automatic dynamic shapes), which every draw of every
    proposal must accept (``torch.randint`` / ``torch.rand`` with ``generator=`` refused them:
    "SymIntArrayRef expected to contain only concrete integers"). The contract suite runs the
    heads' own proposals on two shapes with ``fullgraph=True``; here the other proposals and the
    heads that break the graph, through AOTAutograd's eager backend."""
    head = draw_like_compiled_code(HEADS[name][0]())
    compiled = torch.compile(head, backend="aot_eager")
    for shape in ((3, 5), (2, 7), (4, 3)):
        z = torch.randn(*shape, D)
        target = torch.randint(1, N, shape)
        before = copy.deepcopy(head.state_dict())
        eager = loss_and_grads(head, head, z, target, None)
        head.load_state_dict(before)
        got = loss_and_grads(head, compiled, z, target, None)
        for want, result in zip(eager, got, strict=True):
            torch.testing.assert_close(result, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["full", "uniform_shared"])
def test_bad_input_fails_loudly_when_compiled(name):
    """Under compile the checks are ``torch._assert_async`` (``RuntimeError``), traced here by
    dynamo and run by AOTAutograd's eager backend."""
    head, z, target, weight = make(name)
    compiled = torch.compile(head, backend="aot_eager", fullgraph=True)
    compiled(z, target, weight)
    bad_z = z.clone()
    bad_z[1, 2, 3] = math.nan
    with pytest.raises(RuntimeError, match="z contains NaN or inf values"):
        compiled(bad_z, target, weight)
    for bad in (N, -1, 0):  # out of range, negative, the padding class
        bad_target = target.clone()
        bad_target[2, 0] = bad
        with pytest.raises(RuntimeError, match=r"target must be in \[0, 64\)"):
            compiled(z, bad_target, weight)
    ignored_negative = torch.where(target == IGNORE, -1.0, weight)  # as eager: any position
    for bad_weight in (-weight, ignored_negative):
        with pytest.raises(RuntimeError, match="sample_weight must be non-negative"):
            compiled(z, target, bad_weight)
    with pytest.raises(RuntimeError, match="sample_weight is 0 at all scored positions"):
        compiled(z, target, weight * (target == IGNORE))


@pytest.mark.parametrize("name", ["full", "uniform_shared", "in_batch"])
def test_every_position_ignored_gives_zero_when_compiled(name):
    head, z, target, weight = make(name)
    target = torch.full_like(target, IGNORE)
    compiled = torch.compile(head, backend="aot_eager", fullgraph=True)
    z = z.clone().requires_grad_()
    loss = compiled(z, target, weight)
    loss.backward()
    assert loss.item() == 0.0 and head(z, target, weight).item() == 0.0
    assert torch.equal(z.grad, torch.zeros_like(z))


def environ_without(name):
    """The environment of this process without ``name``."""
    return {key: value for key, value in os.environ.items() if key != name}


#: one compiled training step of FullSoftmaxHead in a fresh process (the CPU's peak resident set
#: is per process); prints the peak bytes the step allocates beyond what was allocated before it
STEP_MEMORY = """
import sys, torch
from benchmarks.common import peak_extra_bytes
from lightning_sampled.heads import FullSoftmaxHead
device, num_classes, batch, dim, chunk = sys.argv[1], *map(int, sys.argv[2:])
torch.set_num_threads(1)
torch.manual_seed(0)
head = FullSoftmaxHead(num_classes, dim, chunk_size=chunk).to(device)
z = torch.randn(batch, dim, device=device, requires_grad=True)
target = torch.randint(0, num_classes, (batch,), device=device)
compiled = torch.compile(head, fullgraph=True)

def step():
    compiled(z, target).backward()
    z.grad = None
    head.zero_grad(set_to_none=True)

step()  # compiles
print(int(peak_extra_bytes(step, device)))
"""


def test_compiled_full_softmax_keeps_one_chunk_of_logits_alive(device):
    """Compiled, the exact head's step holds one ``[T, chunk]`` block of logits at a time, as it
    does eagerly, not all of them: traced as plain torch, inductor ran every chunk's matmul
    before the reductions (a ``[T, N]`` = 256 MB step here, against 64 MB eagerly)."""
    if device.type == "cpu" and not os.access("/proc/self/clear_refs", os.W_OK):
        pytest.skip("the peak resident set is reset through Linux's /proc/self/clear_refs")
    num_classes, batch, dim, chunk = 8192, 8192, 16, 2048
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            STEP_MEMORY,
            device.type,
            *map(str, (num_classes, batch, dim, chunk)),
        ],
        cwd=ROOT,
        # inductor's CUDA kernels compiled, not interpreted (conftest interprets our own kernels);
        # glibc's mmap threshold fixed, so that a freed block leaves the resident set at once
        env={**environ_without("TRITON_INTERPRET"), "MALLOC_MMAP_THRESHOLD_": "131072"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    peak = int(proc.stdout.split()[-1])
    logits_bytes = 4 * batch * num_classes
    chunk_bytes = 4 * batch * chunk
    # one block, its exp and the few [T] / [N, D] buffers beside it; all N / chunk = 4 blocks
    # would be logits_bytes
    assert chunk_bytes / 2 < peak < logits_bytes / 2, (peak, chunk_bytes, logits_bytes)
