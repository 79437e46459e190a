"""Forward + backward time and peak memory of one training step of every head, and of the peers.

One training step (forward + backward, no optimizer step) on ``B`` queries of dimension ``D``
(default 1024 x 128) for N in ``--sizes`` (default 1e4, 1e5, 1e6; 1e7 on request), with targets
drawn from a Zipf law over frequency-sorted ids (``p(i) ∝ 1 / (i + 1)``, the order the log-uniform
proposal and the adaptive softmax's clusters assume). Every method scores the same class table.

Ours (``lightning_sampled.heads``), the sampled ones built from the recipe head config of their
name (``recipes/configs/heads/<name>.yaml``, read by ``recipes.registry``), with the default dense
class-table gradient and with ``sparse_grad=True`` (``<name>_sparse``):

- ``full_softmax_head``: exact, in class chunks (no sparse path: every row gets a gradient);
- ``SampledSoftmaxHead`` with 100 negatives per query from the uniform, unigram (the Zipf counts,
  squashed by alpha = 0.75), log-uniform and MIDX proposals (PQ, RQ and learnable RQ codebooks,
  K = 32, fast mode), 100 uniform negatives shared by the batch, and in-batch negatives only
  (``num_negatives=0``, ``in_batch_negatives=True``);
- ``TapasHead`` (100 shared negatives picked from 200 uniform presamples), ``OneVsEachHead``
  (``ove``: 100 uniform negatives per query) and ``CaneHead`` (20 beam-search candidates, beam
  20, over a 10-ary tree, plus 80 uniform noises).

The MIDX indexes and CANE's tree are built before timing; their refresh is not timed (see
``benchmarks/sampler_time.py`` for refresh times), except MIDX-Learn's, which reassigns its classes
to the learned codewords in every step (as its recipe config does: they move every step).

Peers: plain ``F.cross_entropy(z @ W.T, y)`` (the reference of every ratio), torch's
``F.linear_cross_entropy`` with its chunked path (``options=nn.LinearCrossEntropyOptions()``;
``options=None`` is plain cross-entropy), Cut Cross-Entropy (``cut-cross-entropy``, its
``torch_compile`` implementation; the Triton one needs a GPU) and
``nn.AdaptiveLogSoftmaxWithLoss`` with cutoffs ``[N / 50, N / 5]`` and ``div_value=4``: a different
model (its own head and two low-rank tail clusters, about 12% of the class table's parameters), not
a softmax over the class table. A peer that is not installed gets a row saying so.

Time: all methods at one N are built first (sharing the class table, the queries and the
targets), warmed up once on a small problem (``torch.compile`` included), then timed side by
side, round-robin (one step of each per round), so that load from other processes hits all of
them alike; the median over ``--repeats`` rounds is reported, with its ratio to plain
cross-entropy's median of the same rounds. Memory: each method runs in a fresh process (forked
from a server that has only imported this module; the sizes in increasing order, after the same
small warm-up); the peak is the growth of peak resident memory (CPU) or of
``max_memory_allocated`` (CUDA) over one step beyond the class table, inputs and index, so it
includes the gradients. A method is not run at a size where its estimated memory
(:func:`estimated_bytes`) does not fit in the memory available, or where its step, estimated
linear in N from its median at the previous size, would take longer than ``--max-step-seconds``
(default 120; plain cross-entropy, the reference, always runs): its row says why.

On CPU in float32, ``LinearCrossEntropyOptions()``'s ``"auto"`` settings fall back to
``("compact", "aspect_ratio:2")``: chunks of ``next_pow2(ceil(B / ceil(N / D))) / 2`` queries,
that is one query per chunk from N = 1e5 on at B = 1024, D = 128, so each chunk is a
matrix-vector product that reads the whole class table (bound by memory bandwidth).

Run: ``python -m benchmarks.head_step [--sizes 10000 100000 1000000] [--repeats 3] [--threads 1]
[--methods NAME ...] [--max-step-seconds 120] [--background TEXT] [--name head_step]``; results in
``benchmarks/results/<name>.{csv,md,png}``. At N = 1e7 the class table alone is 5.1 GB and a
dense-gradient step needs about 10 GB more (plain cross-entropy about 120 GB: skipped), so there
run the sparse heads (``--methods``) beside the time check's previous size, e.g.
``--sizes 100000 10000000``.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures.process import BrokenProcessPool
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from benchmarks.common import (
    RESULTS_DIR,
    add_background_argument,
    add_threads_argument,
    in_fresh_process,
    make_parser,
    measured_load,
    peak_extra_bytes,
    pyplot,
    save_figure,
    set_threads,
    timed_rounds,
    write_results,
)
from lightning_sampled.callbacks.index_refresh import trained_samplers
from lightning_sampled.heads import FullSoftmaxHead, SampledSoftmaxHead
from recipes.registry import entry

# A process forked for the memory measurement re-runs this module as ``__mp_main__`` when it was
# started with ``python -m``; runpy then warns that the module is already imported (harmless).
warnings.filterwarnings(
    "ignore", message=".*found in sys.modules after import of package", category=RuntimeWarning
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: the MIDX codebook size of the recipes' configs (the MIDX methods' K)
CODEBOOK_SIZE = entry("midx_rq").sampler_factory.keywords["codebook_size"]
WARMUP_CLASSES = 1_000
#: memory kept free beside a method's estimated need before it is run
MEMORY_MARGIN_BYTES = 2 * 2**30
FLOAT_BYTES = 4


@dataclass
class Problem:
    """One step's inputs, shared by every method at one ``N``.

    Attributes:
        table: ``[N, D]`` class table (data; each method wraps it in its own parameter).
        z: ``[B, D]`` queries (requiring grad, as an encoder's output would).
        target: long ``[B]`` targets, Zipfian over frequency-sorted ids.
        counts: float64 ``[N]`` the Zipf weights ``1 / (i + 1)`` the targets are drawn from.
    """

    table: Tensor
    z: Tensor
    target: Tensor
    counts: Tensor

    @property
    def num_classes(self) -> int:
        return self.table.shape[0]

    @property
    def dim(self) -> int:
        return self.table.shape[1]

    def new_weight(self) -> nn.Parameter:
        """A parameter of its own over the shared table's storage (no copy): hooks a head
        installs on its class table (``sparse_grad``'s checks) and gradients stay with it."""
        return nn.Parameter(self.table)


def make_problem(
    num_classes: int,
    batch: int,
    dim: int,
    device: str,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> Problem:
    """The class table (``N(0, 0.05^2)`` entries) and queries (``N(0, 1)``) in ``dtype``, drawn
    on ``device`` by its own seeded generator (a GPU draws a 5 GB table in milliseconds), and
    Zipfian targets (drawn on the CPU)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    table = (torch.randn(num_classes, dim, generator=gen, device=device) * 0.05).to(dtype)
    z = torch.randn(batch, dim, generator=gen, device=device).to(dtype).requires_grad_()
    counts = 1.0 / torch.arange(1, num_classes + 1, dtype=torch.float64)
    cpu_gen = torch.Generator().manual_seed(seed)
    target = torch.multinomial(counts, batch, replacement=True, generator=cpu_gen).to(device)
    return Problem(table, z, target, counts)


LossFn = Callable[[], Tensor]
Built = tuple[LossFn, list[Tensor]]


@dataclass(frozen=True)
class Method:
    """One benchmarked method.

    Attributes:
        name: row label.
        family: ``"ours"`` or ``"peer"``.
        exact: whether the loss is the exact softmax cross-entropy over the class table.
        sparse_grad: whether the class table's gradient is row-sparse.
        build: makes ``(loss_fn, params)`` for a :class:`Problem`: ``loss_fn()`` is the scalar
            training loss, ``params`` every tensor whose ``.grad`` a step fills.
        logits_bytes: bytes per ``(query, class)`` pair the step keeps alive at once (0 where
            the logits are never materialised), for :func:`estimated_bytes`.
        requires: a module that must be importable (a peer's package), or ``None``.
        fused_on_cuda: whether on CUDA it never materialises logits (Cut Cross-Entropy's Triton
            implementation; its CPU ``torch_compile`` one does).
    """

    name: str
    family: str
    exact: bool
    sparse_grad: bool
    build: Callable[[Problem], Built]
    logits_bytes: int = 0
    requires: str | None = None
    fused_on_cuda: bool = False


def build_plain(problem: Problem) -> Built:
    p, weight = problem, problem.new_weight()

    def loss_fn() -> Tensor:
        return F.cross_entropy(p.z @ weight.T, p.target)

    return loss_fn, [weight, p.z]


def build_linear_cross_entropy(problem: Problem) -> Built:
    p, weight = problem, problem.new_weight()
    options = nn.LinearCrossEntropyOptions()

    def loss_fn() -> Tensor:
        return F.linear_cross_entropy(p.z, weight, p.target, options=options)

    return loss_fn, [weight, p.z]


def build_cut_cross_entropy(problem: Problem) -> Built:
    from cut_cross_entropy import linear_cross_entropy

    p, weight = problem, problem.new_weight()
    impl = "cce" if p.z.is_cuda else "torch_compile"  # its Triton kernels need a GPU

    def loss_fn() -> Tensor:
        return linear_cross_entropy(p.z, weight, p.target, impl=impl)

    return loss_fn, [weight, p.z]


def adaptive_cutoffs(num_classes: int) -> list[int]:
    """``[N / 50, N / 5]``: a head of the 2% most frequent classes and two tail clusters."""
    return [max(1, num_classes // 50), max(2, num_classes // 5)]


def build_adaptive(problem: Problem) -> Built:
    p = problem
    torch.manual_seed(0)
    model = nn.AdaptiveLogSoftmaxWithLoss(
        p.dim, p.num_classes, adaptive_cutoffs(p.num_classes), div_value=4.0
    ).to(p.z.device, p.z.dtype)

    def loss_fn() -> Tensor:
        return model(p.z, p.target).loss

    return loss_fn, [*model.parameters(), p.z]


def head_builder(
    make_head: Callable[[Problem, bool], nn.Module], sparse_grad: bool
) -> Callable[[Problem], Built]:
    """A builder for one of our heads, tied to the problem's class table; its index (MIDX
    codebooks; CANE's tree, which its constructor builds) is built here, before any timing."""

    def build(problem: Problem) -> Built:
        head = make_head(problem, sparse_grad).to(problem.z.device)
        if isinstance(head, SampledSoftmaxHead):
            head.refresh_index()
        # learned codewords move every step, so their classes are reassigned every step
        reassign = trained_samplers(head)

        def loss_fn() -> Tensor:
            if reassign:
                head.refresh_index()
            with mixed_precision(problem.z):
                return head(problem.z, problem.target)

        return loss_fn, [*head.parameters(), problem.z]

    return build


def mixed_precision(z: Tensor) -> AbstractContextManager:
    """Autocast to ``z``'s dtype where it is bf16 / fp16, as Lightning's ``"bf16-mixed"`` runs
    a head: our heads' products run in fp32 for half-precision inputs outside autocast
    (``ops/chunked.py``: ``compute_dtype``), while the peers take the half-precision tensors as
    they are."""
    half = z.dtype in (torch.bfloat16, torch.float16)
    return torch.autocast(z.device.type, dtype=z.dtype) if half else nullcontext()


def full_head(problem: Problem, sparse_grad: bool) -> nn.Module:
    return FullSoftmaxHead(problem.num_classes, problem.dim, weight=problem.new_weight())


def chunked_full_head(problem: Problem, sparse_grad: bool) -> nn.Module:
    """The exact head's torch path in class chunks (``backend="torch"``), what ``"auto"`` runs
    on the CPU and ran everywhere before the fused kernel."""
    p = problem
    return FullSoftmaxHead(p.num_classes, p.dim, weight=p.new_weight(), backend="torch")


def config_head(name: str, **options) -> Callable[[Problem, bool], nn.Module]:
    """The head of the recipe config ``name`` (``recipes/configs/heads/<name>.yaml``, through
    :mod:`recipes.registry`) on the problem's class table, with the Zipf weights as the
    ``class_counts`` of a unigram proposal and ``options`` added to the config's."""

    def make(problem: Problem, sparse_grad: bool) -> nn.Module:
        return entry(name).head(
            problem.num_classes,
            problem.dim,
            weight=problem.new_weight(),
            class_counts=problem.counts,
            sparse_grad=sparse_grad,
            **options,
        )

    return make


#: our heads that take ``sparse_grad``: name (a recipe head config's, but for
#: ``uniform_shared``) -> head factory
SPARSE_CAPABLE_HEADS: dict[str, Callable[[Problem, bool], nn.Module]] = {
    "uniform": config_head("uniform"),
    "uniform_shared": config_head("uniform", shared_negatives=True),
    **{
        name: config_head(name)
        for name in (
            "unigram",
            "log_uniform",
            "in_batch",
            "midx_pq",
            "midx_rq",
            "midx_learn",
            "tapas",
            "ove",
            "cane",
        )
    },
}


def all_methods() -> list[Method]:
    """Every benchmarked method, peers first; each of our sparse-capable heads twice."""
    methods = [
        Method("plain_cross_entropy", "peer", True, False, build_plain, logits_bytes=12),
        Method(
            "linear_cross_entropy", "peer", True, False, build_linear_cross_entropy, logits_bytes=0
        ),
        Method(
            "cut_cross_entropy",
            "peer",
            True,
            False,
            build_cut_cross_entropy,
            logits_bytes=12,
            requires="cut_cross_entropy",
            fused_on_cuda=True,
        ),
        Method("adaptive_log_softmax", "peer", False, False, build_adaptive),
        Method("full_softmax_head", "ours", True, False, head_builder(full_head, False)),
        Method(
            "full_softmax_head_chunked",
            "ours",
            True,
            False,
            head_builder(chunked_full_head, False),
            requires="cuda",
        ),
    ]
    for name, make_head in SPARSE_CAPABLE_HEADS.items():
        for sparse in (False, True):
            label = f"{name}_sparse" if sparse else name
            methods.append(Method(label, "ours", False, sparse, head_builder(make_head, sparse)))
    return methods


METHODS = {m.name: m for m in all_methods()}
REFERENCE = "plain_cross_entropy"


def missing_requirement(method: Method, device: str = "cpu") -> str | None:
    """Why ``method`` cannot run in this environment on ``device`` (``None`` when it can).
    ``requires="cuda"``: a row that only differs from another on the GPU (on the CPU
    ``full_softmax_head``'s ``backend="auto"`` is the chunked path)."""
    if method.requires == "cuda":
        return None if device == "cuda" else "CUDA only: on the CPU it is full_softmax_head"
    if method.requires:
        try:
            importlib.import_module(method.requires)
        except ImportError as error:
            return f"not installed: {error}"
    if method.name == "linear_cross_entropy" and not hasattr(F, "linear_cross_entropy"):
        return f"not available: torch {torch.__version__} has no F.linear_cross_entropy"
    return None


def estimated_bytes(
    method: Method, num_classes: int, batch: int, dim: int, device: str = "cpu"
) -> int:
    """An upper estimate of one step's memory beyond the inputs: the logits it keeps alive
    (``logits_bytes`` per query and class: logits, softmax and their gradient for plain
    cross-entropy; none for a method ``fused_on_cuda`` there) plus a dense ``[N, D]`` gradient
    and one ``[N, D]`` temporary."""
    dense_table = 0 if method.sparse_grad else 2 * num_classes * dim * FLOAT_BYTES
    logits_bytes = 0 if method.fused_on_cuda and device == "cuda" else method.logits_bytes
    return logits_bytes * batch * num_classes + dense_table


def available_bytes(device: str) -> int:
    """Memory a step may still take: free CUDA memory, or ``MemAvailable`` of ``/proc/meminfo``."""
    if device == "cuda":
        return torch.cuda.mem_get_info()[0]
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("MemAvailable missing from /proc/meminfo")


def skip_reason(method: Method, num_classes: int, batch: int, dim: int, device: str) -> str | None:
    """Why ``method`` is not run at ``num_classes`` (missing package, or too little memory)."""
    missing = missing_requirement(method, device)
    if missing:
        return missing
    need = estimated_bytes(method, num_classes, batch, dim, device)
    free = available_bytes(device)
    if need + MEMORY_MARGIN_BYTES > free:
        return (
            f"skipped: needs about {need / 2**30:.1f} GiB (estimate), "
            f"{free / 2**30:.1f} GiB available"
        )
    return None


def make_step(method: Method, problem: Problem) -> Callable[[], None]:
    """One forward + backward of ``method`` on ``problem``; gradients are dropped at the end, so
    a step starts with none and its peak includes them."""
    loss_fn, params = method.build(problem)

    def step() -> None:
        loss_fn().backward()
        for p in params:
            p.grad = None

    return step


def warm_up(
    method: Method, batch: int, dim: int, device: str, dtype: torch.dtype = torch.float32
) -> None:
    """One step on a small problem: compiles, lazy initialisations and thread pools happen here,
    outside what is timed or measured."""
    make_step(method, make_problem(WARMUP_CLASSES, batch, dim, device, dtype=dtype))()


def time_methods(
    methods: Sequence[Method],
    problem: Problem,
    repeats: int,
    device: str,
    peaks: dict[str, float] | None = None,
) -> dict[str, list[float]]:
    """Seconds per step of each method, ``repeats`` round-robin rounds (one step each per round);
    with ``peaks``, then one more step of each with its peak extra memory stored there (CUDA's
    allocator statistics are exact within one process, unlike the CPU's peak RSS)."""
    steps, build_s = {}, {}
    for m in methods:
        start = time.perf_counter()
        steps[m.name] = make_step(m, problem)
        build_s[m.name] = time.perf_counter() - start
    print("  built: " + ", ".join(f"{n} {t:.1f}s" for n, t in build_s.items() if t >= 0.1))
    times = timed_rounds(steps, repeats, device, warmup=0, progress=str)
    if peaks is not None:
        for name, step in steps.items():
            gc.collect()
            peaks[name] = peak_extra_bytes(step, device)
    return times


def measure_memory(
    name: str,
    sizes: Sequence[int],
    batch: int,
    dim: int,
    device: str,
    threads: int | None,
    dtype: torch.dtype = torch.float32,
) -> list[float | str]:
    """Peak extra bytes of one step of method ``name`` at each size, in this (fresh) process;
    a size the method is not run at gives the reason instead."""
    set_threads(threads, faiss=True)
    method = METHODS[name]
    warm_up(method, batch, dim, device, dtype)
    peaks: list[float | str] = []
    for n in sizes:
        reason = skip_reason(method, n, batch, dim, device)
        if reason:
            peaks.append(reason)
            continue
        step = make_step(method, make_problem(n, batch, dim, device, dtype=dtype))
        gc.collect()
        peaks.append(peak_extra_bytes(step, device))
        del step
        gc.collect()
    return peaks


def memory_in_subprocess(
    name: str,
    sizes: Sequence[int],
    batch: int,
    dim: int,
    device: str,
    threads: int | None,
    dtype: torch.dtype = torch.float32,
) -> list[float | str]:
    """:func:`measure_memory` in a fresh process, forked from a server that has only imported
    this module (so that each method pays no import time); a crash becomes the reason."""
    measured = (name, sizes, batch, dim, device, threads, dtype)
    try:
        return in_fresh_process("benchmarks.head_step", "measure_memory", *measured)
    except BrokenProcessPool as error:
        return [f"failed: the measuring process died ({error})"] * len(sizes)


def slow_step_reason(previous: tuple[int, list[float]] | None, n: int, limit: float) -> str | None:
    """Why a method is not timed at ``n``: its step, estimated linear in ``N`` from its median at
    the previous size ``previous = (N0, times)``, would take more than ``limit`` seconds."""
    if previous is None:
        return None
    n0, times0 = previous
    median = statistics.median(times0)
    estimate = median * n / n0
    if estimate <= limit:
        return None
    return (
        f"skipped: about {estimate:.0f} s per step (linear in N from {median:.2f} s at "
        f"N = {n0:,}) > --max-step-seconds {limit:g}"
    )


def selected_methods(args: argparse.Namespace) -> list[Method]:
    """The methods ``--methods`` names, in the registry's order, plain cross-entropy (the
    reference of the ratios) always among them."""
    wanted = {REFERENCE, *args.methods}
    return [m for m in METHODS.values() if m.name in wanted]


def time_all_sizes(
    args: argparse.Namespace, cuda_peaks: dict[tuple[str, int], float]
) -> dict[tuple[str, int], list[float] | str]:
    """``(method, N) -> seconds per round``, or the reason the method was not run there. Plain
    cross-entropy, the reference of the ratios, is exempt from ``--max-step-seconds``. On CUDA
    the peak memory of each timed step is stored in ``cuda_peaks`` as well."""
    results: dict[tuple[str, int], list[float] | str] = {}
    runnable = []
    for method in selected_methods(args):
        missing = missing_requirement(method, args.device)
        if missing:
            results.update({(method.name, n): missing for n in args.sizes})
            continue
        warm_up(method, args.batch, args.dim, args.device, args.dtype)
        runnable.append(method)
    previous: dict[str, tuple[int, list[float]]] = {}
    for n in args.sizes:
        print(f"N = {n:,}: building", flush=True)
        problem = make_problem(n, args.batch, args.dim, args.device, dtype=args.dtype)
        timed_here = []
        for method in runnable:
            reason = skip_reason(method, n, args.batch, args.dim, args.device)
            if reason is None and method.name != REFERENCE:
                reason = slow_step_reason(previous.get(method.name), n, args.max_step_seconds)
            if reason:
                results[method.name, n] = reason
                print(f"  {method.name}: {reason}", flush=True)
            else:
                timed_here.append(method)
        peaks: dict[str, float] | None = {} if args.device == "cuda" else None
        times = time_methods(timed_here, problem, args.repeats, args.device, peaks)
        cuda_peaks.update({(name, n): peak for name, peak in (peaks or {}).items()})
        results.update({(name, n): t for name, t in times.items()})
        previous.update({name: (n, t) for name, t in times.items()})
        del problem
        gc.collect()
    return results


def measure_all_memory(
    args: argparse.Namespace,
    times: dict[tuple[str, int], list[float] | str],
    cuda_peaks: dict[tuple[str, int], float],
) -> dict[tuple[str, int], float | str]:
    """``(method, N) -> peak extra bytes``, or the reason it was not measured (the timing's reason
    where the method was not timed at that size); one fresh process per method on the CPU, the
    timing's own ``cuda_peaks`` on CUDA."""
    peaks: dict[tuple[str, int], float | str] = {}
    if args.device == "cuda":
        return {key: cuda_peaks.get(key, value) for key, value in times.items()}
    for method in selected_methods(args):
        sizes = [n for n in args.sizes if isinstance(times[method.name, n], list)]
        peaks.update({(method.name, n): times[method.name, n] for n in args.sizes})
        if not sizes:
            continue
        start = time.perf_counter()
        values = memory_in_subprocess(
            method.name, sizes, args.batch, args.dim, args.device, args.threads, args.dtype
        )
        shown = ", ".join(v if isinstance(v, str) else f"{v / 2**20:.1f} MiB" for v in values)
        print(f"  memory {method.name}: {shown} ({time.perf_counter() - start:.1f}s)", flush=True)
        peaks.update({(method.name, n): v for n, v in zip(sizes, values, strict=True)})
    return peaks


def result_rows(
    args: argparse.Namespace,
    times: dict[tuple[str, int], list[float] | str],
    peaks: dict[tuple[str, int], float | str],
) -> list[dict]:
    """One row per (N, method): median time and its ratio to plain cross-entropy's, peak memory
    and its ratio to plain's, and a status saying why a number is missing."""
    rows = []
    for n in args.sizes:
        reference_time = times.get((REFERENCE, n))
        reference_peak = peaks.get((REFERENCE, n))
        for method in selected_methods(args):
            t, peak = times[method.name, n], peaks[method.name, n]
            median = statistics.median(t) if isinstance(t, list) else None
            ref_median = (
                statistics.median(reference_time) if isinstance(reference_time, list) else None
            )
            status = next((s for s in (t, peak) if isinstance(s, str)), "ok")
            rows.append(
                {
                    "num_classes": n,
                    "method": method.name,
                    "family": method.family,
                    "exact": method.exact,
                    "sparse_grad": method.sparse_grad,
                    "batch": args.batch,
                    "dim": args.dim,
                    "device": args.device,
                    "median_s": median if median is not None else "",
                    "times_s": " ".join(f"{x:.4f}" for x in t) if isinstance(t, list) else "",
                    "time_vs_plain": median / ref_median if median and ref_median else "",
                    "peak_mib": peak / 2**20 if isinstance(peak, float) else "",
                    "memory_vs_plain": (
                        peak / reference_peak
                        if isinstance(peak, float) and isinstance(reference_peak, float)
                        else ""
                    ),
                    "status": status,
                }
            )
    return rows


def plot(rows: list[dict], path: Path) -> None:
    """Time per step (left) and peak memory (right) against N, log-log, one line per method:
    dense gradient solid, sparse dashed, peers dotted."""
    plt = pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(15, 7))
    cmap = plt.get_cmap("tab20")
    shown = [m for m in METHODS.values() if any(r["method"] == m.name for r in rows)]
    bases = list(dict.fromkeys(m.name.removesuffix("_sparse") for m in shown))
    for method in shown:
        base = method.name.removesuffix("_sparse")
        style = ":" if method.family == "peer" else ("--" if method.sparse_grad else "-")
        color = cmap(bases.index(base) % 20)
        for ax, key in zip(axes, ("median_s", "peak_mib"), strict=True):
            points = [
                (r["num_classes"], r[key])
                for r in rows
                if r["method"] == method.name and r[key] != "" and r[key] > 0
            ]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, style, marker="o", ms=3, color=color, label=method.name)
    axes[0].set_ylabel("seconds per step (forward + backward)")
    axes[1].set_ylabel("peak extra memory of one step (MiB)")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("number of classes N")
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.suptitle(
        f"One training step, B = {rows[0]['batch']}, D = {rows[0]['dim']} "
        f"(solid: our heads, dense gradient; dashed: sparse_grad; dotted: peers)"
    )
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


def device_name(device: str) -> str:
    """``device``, with the GPU's name and the Triton version on CUDA."""
    if device != "cuda":
        return device
    import triton

    return f"cuda ({torch.cuda.get_device_name()}, Triton {triton.__version__})"


def notes(args: argparse.Namespace) -> str:
    return f"""
One training step (forward + backward, no optimizer step), B = {args.batch}, D = {args.dim},
{str(args.dtype).removeprefix("torch.")} table and queries, device {device_name(args.device)},
torch {torch.__version__}, {args.threads or torch.get_num_threads()} torch thread(s); Zipfian
targets. In bf16 / fp16 our heads run under autocast (as Lightning's `"bf16-mixed"` runs them),
the peers on the half-precision tensors.
Time: median of {args.repeats} round-robin rounds after a warm-up on a {WARMUP_CLASSES:,}-class
problem; `time_vs_plain` is that median over plain cross-entropy's median of the same rounds
(below 1: faster). `peak_mib`: growth of peak memory over one step in a fresh process, beyond the
class table, inputs and index (gradients included); `memory_vs_plain` likewise. Sampled heads:
100 negatives per query (in-batch: the batch's targets only); MIDX K = {CODEBOOK_SIZE}, index
built before timing, refresh not timed except MIDX-Learn's reassignment of its classes, which its
step includes; `uniform_shared`: 100 negatives shared by the batch;
`_sparse`: `sparse_grad=True`. `adaptive_log_softmax`
(cutoffs N/50, N/5, div_value 4) is a different model, not an exact softmax, and its cost
depends on the targets' distribution. `linear_cross_entropy`: torch's chunked path
(`options=nn.LinearCrossEntropyOptions()`); `cut_cross_entropy`: `impl="cce"` (its Triton kernels,
default gradient filtering) on CUDA, `impl="torch_compile"` on the CPU. `full_softmax_head` is
`backend="auto"`: the fused Triton kernel on CUDA, the chunked torch path on the CPU;
`full_softmax_head_chunked` (CUDA only) is `backend="torch"`. `peak_mib` on CUDA: the growth of
`max_memory_allocated` over one more step in the timing process.
A `status` other than `ok` says why a number is missing (not installed, estimated memory not
available, or an estimated step longer than `--max-step-seconds` {args.max_step_seconds:g}).
`linear_cross_entropy`'s auto chunking on CPU fp32 is one query per chunk from N = 1e5 on (module
docstring), hence its time.

Reproduce: `make bench` (or `python -m benchmarks.head_step --threads 1`).
"""


def main(argv: list[str] | None = None) -> None:
    parser = make_parser(__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add_threads_argument(parser, None, "torch and faiss threads (default: torch's)")
    parser.add_argument(
        "--max-step-seconds",
        type=float,
        default=120.0,
        help="skip a method at a size where its step, linear in N from the previous size, "
        "would take longer (plain cross-entropy, the reference, is always run)",
    )
    add_background_argument(parser)
    parser.add_argument(
        "--methods",
        nargs="+",
        choices=list(METHODS),
        default=list(METHODS),
        metavar="METHOD",
        help=f"the methods to run (default: all; plain cross-entropy always): {', '.join(METHODS)}",
    )
    parser.add_argument(
        "--dtype",
        choices=list(DTYPES),
        default="float32",
        help="the class table's and queries' dtype; for bf16 / fp16 our heads run under "
        "autocast (mixed_precision), the peers on the half-precision tensors",
    )
    parser.add_argument("--name", default="head_step", help="file stem, or an absolute path")
    parser.add_argument(
        "--commit", default=None, help="the commit to stamp instead of git's (a copy without git)"
    )
    args = parser.parse_args(argv)
    args.dtype = DTYPES[args.dtype]
    args.sizes = sorted(set(args.sizes))
    set_threads(args.threads, faiss=True)

    with measured_load(args.background) as load:
        cuda_peaks: dict[tuple[str, int], float] = {}
        times = time_all_sizes(args, cuda_peaks)
        peaks = measure_all_memory(args, times, cuda_peaks)
    rows = result_rows(args, times, peaks)
    md = write_results(
        args.name,
        rows,
        title="Head training step: time and peak memory of every head and of the peers",
        notes=notes(args),
        header=load.header,
        commit=args.commit,
        columns=[
            "num_classes",
            "method",
            "family",
            "exact",
            "sparse_grad",
            "median_s",
            "time_vs_plain",
            "peak_mib",
            "memory_vs_plain",
            "status",
        ],
    )
    plot(rows, RESULTS_DIR / f"{args.name}.png")
    print(md.read_text())
    print(f"results under {RESULTS_DIR}")


if __name__ == "__main__":
    main()
