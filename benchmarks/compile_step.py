"""Eager against ``torch.compile``: forward + backward time of one training step of each head.

One training step (forward + backward of the head's loss, no optimizer step) on ``B`` queries of
dimension ``D`` (default N = 1e5 classes, B = 8,192, D = 64, on the CPU with one thread, or on
``--device cuda``, where every timed step is synchronised), for the
heads of ``benchmarks/head_step.py`` with their settings there: ``FullSoftmaxHead``,
``SampledSoftmaxHead`` with 100 uniform negatives per query, ``TapasHead`` (100 shared negatives
picked from 200 uniform presamples) and ``SampledSoftmaxHead`` with MIDX-rq (K = 32, fast mode;
its index built before timing). Each head runs eagerly and as ``torch.compile(head)`` (inductor,
default mode; ``loss.backward()`` outside it, its graph compiled by AOTAutograd from the
forward's), both on the same head, class table, queries and Zipfian targets.

``graph_breaks`` is ``torch._dynamo.explain``'s count for the head's forward on the same problem.
``compile_s`` is the first compiled step (tracing, inductor's code generation and the step itself;
inductor's on-disk cache may shorten it on a second run). Time: after ``--warmup`` compiled steps
(default 3: TAPAS' first pass has data-dependent shapes, which recompile) and one eager step,
both variants of every head are timed side by side, round-robin (one step of each per
round), so that load from other processes hits all of them alike; the median over ``--repeats``
rounds is reported, with the compiled median over the eager one of the same rounds.

Memory (``peak_mb``): after the warm-up, one more step of each head and mode, the peak bytes it
allocates beyond what was allocated before it (:func:`benchmarks.common.peak_extra_bytes`: the
growth of the process' peak resident set on the CPU, ``max_memory_allocated`` on CUDA), so the
gradients are included. On the CPU run it with ``MALLOC_MMAP_THRESHOLD_=131072``: glibc then maps
every block of 128 KiB or more on its own and unmaps it when freed, so that a step cannot reuse
resident memory an earlier step freed and under-count. ``FullSoftmaxHead``'s loops over class
chunks are custom ops (:func:`~lightning_sampled.ops.chunked.chunked_softmax_sums`), so compiled
it holds one ``[B, chunk_size]`` block of logits at a time, as eagerly; traced as plain torch they
were unrolled and inductor ran every chunk's matmul before the reductions, holding the whole
``[B, N]`` logits: at B = 8,192, D = 64, one thread, the compiled step's ``peak_mb`` was 882 at
N = 2e4 and 3,384 at N = 1e5 (its compile 131 s), against 78 and 97 eagerly; now 74 and 94
(``results/compile_step_memory.md``, ``--heads full_softmax_head --sizes 20000 100000``).
``--eager-only HEAD@N`` skips a compiled step.

Run: ``python -m benchmarks.compile_step [--sizes 100000] [--batch 8192] [--dim 64]
[--repeats 5] [--warmup 3] [--threads 1] [--heads NAME ...] [--eager-only HEAD@N ...]
[--device cuda] [--background TEXT] [--name compile_step]``; results in
``benchmarks/results/<name>.{csv,md}`` (``--name`` may be an absolute path without suffix).
"""

from __future__ import annotations

import argparse
import statistics
import time
import traceback
from collections.abc import Callable

import torch
from torch import nn

from benchmarks.common import (
    add_background_argument,
    add_threads_argument,
    make_parser,
    measured_load,
    peak_extra_bytes,
    set_threads,
    timed_rounds,
    write_results,
)
from benchmarks.head_step import SPARSE_CAPABLE_HEADS, Problem, full_head, make_problem
from lightning_sampled.heads import SampledSoftmaxHead

EAGER_ONLY = "compiled not run (--eager-only)"

#: name -> the head, built as benchmarks/head_step.py builds it (dense class-table gradient)
HEADS: dict[str, Callable[[Problem, bool], nn.Module]] = {
    "full_softmax_head": full_head,
    "uniform": SPARSE_CAPABLE_HEADS["uniform"],
    "tapas": SPARSE_CAPABLE_HEADS["tapas"],
    "midx_rq": SPARSE_CAPABLE_HEADS["midx_rq"],
}


def build_head(name: str, problem: Problem) -> nn.Module:
    """Head ``name`` over the problem's class table, its index (MIDX) built."""
    head = HEADS[name](problem, False).to(problem.z.device)
    if isinstance(head, SampledSoftmaxHead):
        head.refresh_index()
    return head


def step_of(head: nn.Module, loss_module: Callable, problem: Problem) -> Callable[[], None]:
    """One forward + backward of ``loss_module`` (the head, or its compiled wrapper) on
    ``problem``; gradients are dropped at the end, so that every step starts without them."""
    params = [*head.parameters(), problem.z]

    def step() -> None:
        loss_module(problem.z, problem.target).backward()
        for p in params:
            p.grad = None

    return step


def graph_breaks(head: nn.Module, problem: Problem) -> int:
    """``torch._dynamo.explain``'s graph-break count of the head's forward on ``problem``."""
    torch._dynamo.reset()
    count = torch._dynamo.explain(head)(problem.z, problem.target).graph_break_count
    torch._dynamo.reset()
    return count


def measure(args: argparse.Namespace, num_classes: int) -> list[dict]:
    """Graph breaks, compile time and round-robin step times of every head at ``num_classes``,
    eager and compiled; a head whose compiled step fails or is not run gets a row that says
    why."""
    problem = make_problem(num_classes, args.batch, args.dim, args.device)
    heads = {name: build_head(name, problem) for name in args.heads}
    # explain resets dynamo (and so every compiled head): all counts first
    info = {
        name: {"graph_breaks": graph_breaks(head, problem), "compile_s": "", "status": "ok"}
        for name, head in heads.items()
    }
    steps: dict[tuple[str, str], Callable[[], None]] = {}
    for name, head in heads.items():
        steps[name, "eager"] = step_of(head, head, problem)
        steps[name, "eager"]()  # warm-up
        if f"{name}@{num_classes}" in args.eager_only:
            info[name]["status"] = EAGER_ONLY
            continue
        compiled = step_of(head, torch.compile(head), problem)
        start = time.perf_counter()
        try:
            compiled()
            info[name]["compile_s"] = time.perf_counter() - start
            for _ in range(args.warmup - 1):  # data-dependent shapes recompile (TAPAS)
                compiled()
        except Exception as error:  # noqa: BLE001 - any failure of the compiler is a result
            traceback.print_exc()
            info[name]["status"] = f"compile failed: {type(error).__name__}: {error}"[:200]
            continue
        steps[name, "compiled"] = compiled
        print(f"  N = {num_classes:,}, {name}: {info[name]}", flush=True)
    peaks = {key: peak_extra_bytes(step, args.device) for key, step in steps.items()}
    times = timed_rounds(steps, args.repeats, args.device, warmup=0, progress="/".join)
    rows = []
    for name in args.heads:
        eager = statistics.median(times[name, "eager"])
        for mode in ("eager", "compiled"):
            t = times.get((name, mode))
            median = statistics.median(t) if t else None
            peak = peaks.get((name, mode))
            rows.append(
                {
                    "num_classes": num_classes,
                    "head": name,
                    "mode": mode,
                    "batch": args.batch,
                    "dim": args.dim,
                    "graph_breaks": info[name]["graph_breaks"] if mode == "compiled" else "",
                    "compile_s": info[name]["compile_s"] if mode == "compiled" else "",
                    "median_s": median if median is not None else "",
                    "times_s": " ".join(f"{x:.4f}" for x in t) if t else "",
                    "vs_eager": median / eager if median is not None else "",
                    "peak_mb": peak / 2**20 if peak is not None else "",
                    "status": info[name]["status"] if mode == "compiled" else "ok",
                }
            )
    return rows


def notes(args: argparse.Namespace) -> str:
    return f"""
One training step (forward + backward, no optimizer step), N in {args.sizes},
B = {args.batch:,}, D = {args.dim}, {args.device}, {args.threads or torch.get_num_threads()} torch
thread(s);
Zipfian targets; heads as in `head_step` (dense class-table gradient). `compiled`:
`torch.compile(head)` (inductor, default mode), `loss.backward()` outside it. `graph_breaks`:
`torch._dynamo.explain` of the head's forward. `compile_s`: the first compiled step (tracing and
code generation included). `median_s`: median of {args.repeats} round-robin rounds after one eager
and {args.warmup} compiled warm-up steps;
`vs_eager`: that median over the same head's eager median (below 1: compiled is faster).
`peak_mb`: the peak memory one step allocates beyond what was allocated before it (on the CPU
the growth of the peak resident set, with `MALLOC_MMAP_THRESHOLD_=131072`), gradients included.
After the first size a head's compile may reuse what dynamo and inductor made for the first
(automatic dynamic shapes, inductor's cache): a short `compile_s` there is not a cold compile.

Reproduce: `MALLOC_MMAP_THRESHOLD_=131072 python -m benchmarks.compile_step --threads 1 --sizes
{" ".join(map(str, args.sizes))} --heads {" ".join(args.heads)} --name {args.name}`.
"""


def main(argv: list[str] | None = None) -> None:
    parser = make_parser(__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000], help="values of N")
    parser.add_argument("--batch", type=int, default=8192)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--warmup", type=int, default=3, help="compiled steps before timing (the first compiles)"
    )
    add_threads_argument(parser, 1, "torch and faiss threads")
    parser.add_argument("--heads", nargs="+", choices=list(HEADS), default=list(HEADS))
    parser.add_argument(
        "--eager-only",
        nargs="+",
        default=[],
        metavar="HEAD@N",
        help="run these heads at these sizes eagerly only (e.g. full_softmax_head@100000)",
    )
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    add_background_argument(parser)
    parser.add_argument(
        "--name",
        default="compile_step",
        help="file stem under benchmarks/results/, or an absolute path without suffix",
    )
    args = parser.parse_args(argv)
    set_threads(args.threads, faiss=True)

    with measured_load(args.background) as load:
        rows = [row for n in args.sizes for row in measure(args, n)]
    md = write_results(
        args.name,
        rows,
        title="torch.compile: eager against compiled training steps of each head",
        notes=notes(args),
        header=load.header,
        columns=[
            "num_classes",
            "head",
            "mode",
            "graph_breaks",
            "compile_s",
            "median_s",
            "vs_eager",
            "peak_mb",
            "status",
        ],
    )
    print(md.read_text())


if __name__ == "__main__":
    main()
