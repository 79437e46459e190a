"""Whole training step (forward, backward, optimizer step) of ``SampledSoftmaxHead``: dense Adam vs
the row-sparse path with ``LazyAdam``, uniform and MIDX-rq proposals, N from 1e4 to 1e7.

Setup: B = 1024 queries ``z = Linear(64, D)(x)`` from fixed random inputs ``x [B, 64]`` (the
encoder's parameters are in the same optimizer as the class table), D = 64, M = 100 negatives per
query (per-query draws), uniform targets. Two paths:

- ``dense``: ``SampledSoftmaxHead(..., sparse_grad=False)`` + ``torch.optim.Adam``: the class
  table gets a dense ``[N, D]`` gradient and Adam updates all ``N`` rows (``O(N D)`` per step).
- ``sparse``: ``sparse_grad=True`` + ``lightning_sampled.optim.LazyAdam``: a row-sparse gradient
  over the ``B (1 + M)`` gathered rows and SparseAdam's lazy update of the touched rows.
- ``dense_fused`` (reference): the dense path with ``torch.optim.Adam(fused=True)``, whose CPU
  kernel updates the table in one pass without Adam's two ``[N, D]`` temporaries.

Proposals: ``UniformSampler`` and ``MIDXSampler(N, K, quantizer="rq")`` with K = 32 and 64. The
heads of one (N, path) share one class table and one optimizer; the paths have their own
tables (same seed) and share the MIDX samplers, whose index is built once per (N, K) by
``head.refresh_index()`` and timed on its own (not part of the step).

Time: one step of every configuration per round (round-robin) after ``--warmup`` warm-up steps
each (the first allocates the optimizer state); medians over ``--repeats`` rounds, every raw time
kept. Wall-clock and process CPU time (``time.process_time``, user + system, so page faults of
fresh allocations count) are both recorded: with one thread on a machine shared with other jobs,
CPU time is the steadier of the two. Each step is also split into ``forward`` (zero_grad,
encoder, draw, head), ``backward`` and ``optimizer``.

Schedules: where all configurations of one N fit ``--mem-budget-gb`` (estimate ``13 N D 4``
bytes: table and two moments per path, plus the dense gradients and Adam's two ``[N, D]``
temporaries) all of them (nine by default) are interleaved. Otherwise (N = 1e7) the sparse path
runs first, interleaved with a *companion* sparse path at ``--companion-size`` (2e5, where
``B M`` touches about as many distinct rows), so that target (1) compares the two sizes under the
same load; then its memory is freed and each dense path runs alone.

Memory (CPU): after timing, one more step per configuration with the peak-RSS counter reset just
before it (after ``gc.collect()`` and ``malloc_trim`` so freed heap pages are not reused unseen):
``step_peak_mib`` is the step's transient memory (gradients, Adam temporaries, gathered rows,
sampler work); ``state_mib`` is what persists between steps (class table, encoder, optimizer
moments, the sampler's index buffers). On CUDA: ``max_memory_allocated`` growth over one step.

Profile: at ``--profile-sizes`` every sparse configuration and the dense uniform ones get
``--profile-steps`` ``torch.profiler`` traces of one step each (interleaved); the Markdown lists
the top operators by self time per step, and compares the operators of the two targets' pairs.

Run: ``OMP_NUM_THREADS=1 python -m benchmarks.train_step [--sizes 10000 200000] [--threads 1]
[--paths sparse dense_fused] [--device cuda] [--name NAME]``; results in
``benchmarks/results/<name>.{csv,md,png}`` (``--name`` may be an absolute path without suffix).
Peak memory at N = 1e7: about 16 GB (the dense path: table, gradient, two moments, two
temporaries), about 11 GB during the sparse phase and the MIDX refresh (faiss k-means).
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import gc
import os
import resource
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from benchmarks.common import (
    RESULTS_DIR,
    add_threads_argument,
    load_average,
    log,
    make_parser,
    peak_extra_bytes,
    peak_rss_bytes,
    provenance,
    pyplot,
    reset_peak_rss,
    result_path,
    save_figure,
    set_threads,
    write_results,
)
from lightning_sampled.heads import SampledSoftmaxHead
from lightning_sampled.optim import LazyAdam
from lightning_sampled.samplers import MIDXSampler, Sampler, UniformSampler

PHASES = ("forward", "backward", "optimizer")
INPUT_DIM = 64
OPTIMIZER = {"sparse": "LazyAdam", "dense": "Adam", "dense_fused": "Adam(fused=True)"}
PATHS = tuple(OPTIMIZER)

Config = tuple[int, str, str]  # (N, path, sampler)


def sampler_names(codebook_sizes: list[int]) -> list[str]:
    return ["uniform"] + [f"midx_rq{k}" for k in codebook_sizes]


def make_samplers(num_classes: int, codebook_sizes: list[int], device: str) -> dict[str, Sampler]:
    """The uniform sampler and one (not yet refreshed) MIDX-rq sampler per codebook size."""
    samplers: dict[str, Sampler] = {"uniform": UniformSampler(num_classes).to(device)}
    for k in codebook_sizes:
        samplers[f"midx_rq{k}"] = MIDXSampler(num_classes, codebook_size=k, quantizer="rq").to(
            device
        )
    return samplers


@dataclass
class TrainPath:
    """One optimisation path at one N: a class table, an encoder, an optimizer, fixed inputs and
    one head per sampler, all heads sharing the table."""

    num_classes: int
    name: str
    weight: nn.Parameter
    encoder: nn.Linear
    optimizer: torch.optim.Optimizer
    x: torch.Tensor
    y: torch.Tensor
    heads: dict[str, SampledSoftmaxHead] = field(default_factory=dict)


def make_path(
    name: str,
    num_classes: int,
    samplers: dict[str, Sampler],
    args: argparse.Namespace,
) -> TrainPath:
    """Builds the table (same seed for every path, drawn on ``args.device`` by its own
    generator: a GPU draws a 1e7-row table in milliseconds), encoder, inputs, heads and
    optimizer."""
    gen = torch.Generator(device=args.device).manual_seed(0)
    weight = nn.Parameter(
        torch.randn(num_classes, args.dim, generator=gen, device=args.device) * 0.05
    )
    x = torch.randn(args.batch, INPUT_DIM, generator=gen, device=args.device)
    y = torch.randint(num_classes, (args.batch,), generator=gen, device=args.device)
    torch.manual_seed(1)
    encoder = nn.Linear(INPUT_DIM, args.dim).to(args.device)
    sparse = name == "sparse"
    heads = {
        s: SampledSoftmaxHead(
            num_classes,
            args.dim,
            sampler,
            args.negatives,
            weight=weight,
            sparse_grad=sparse,
            in_batch_negatives=False,
        ).to(args.device)  # fmt: skip
        for s, sampler in samplers.items()
    }
    params = [weight, *encoder.parameters()]
    if sparse:
        optimizer: torch.optim.Optimizer = LazyAdam(params, lr=1e-3)
    else:
        optimizer = torch.optim.Adam(params, lr=1e-3, fused=name == "dense_fused")
    return TrainPath(num_classes, name, weight, encoder, optimizer, x, y, heads)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def make_step(path: TrainPath, sampler: str) -> Callable[[], list[float]]:
    """A closure running one training step; returns wall and CPU seconds of its three phases and
    the step's system CPU seconds, ``[fwd, bwd, opt, fwd_cpu, bwd_cpu, opt_cpu, sys]``."""
    head = path.heads[sampler]

    def step() -> list[float]:
        marks = []
        _sync()
        sys0 = resource.getrusage(resource.RUSAGE_SELF).ru_stime
        marks.append((time.perf_counter(), time.process_time()))
        path.optimizer.zero_grad(set_to_none=True)
        loss = head(path.encoder(path.x), path.y)
        _sync()
        marks.append((time.perf_counter(), time.process_time()))
        loss.backward()
        _sync()
        marks.append((time.perf_counter(), time.process_time()))
        path.optimizer.step()
        _sync()
        marks.append((time.perf_counter(), time.process_time()))
        sys1 = resource.getrusage(resource.RUSAGE_SELF).ru_stime
        return [marks[i + 1][j] - marks[i][j] for j in (0, 1) for i in range(3)] + [sys1 - sys0]

    return step


def _malloc_trim() -> None:
    """Returns freed heap pages to the OS (glibc), so a later peak-RSS reading sees new pages."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def step_memory(step: Callable[[], list[float]], device: str) -> float:
    """Peak bytes one step allocates beyond what persists between steps."""
    gc.collect()
    if device != "cuda":
        _malloc_trim()
    return peak_extra_bytes(step, device)


def state_bytes(path: TrainPath, sampler: str) -> float:
    """Bytes that persist between steps: parameters, optimizer state and the sampler's buffers."""
    total = sum(p.numel() * p.element_size() for p in path.optimizer.param_groups[0]["params"])
    for state in path.optimizer.state.values():
        total += sum(v.numel() * v.element_size() for v in state.values() if torch.is_tensor(v))
    total += sum(b.numel() * b.element_size() for b in path.heads[sampler].sampler.buffers())
    return float(total)


def grad_bytes(path: TrainPath) -> float:
    """Bytes of the gradients, which ``zero_grad(set_to_none=True)`` at the start of the next step
    keeps alive between steps (dense: ``N D`` floats; sparse: the COO indices and values)."""
    total = 0
    for p in path.optimizer.param_groups[0]["params"]:
        g = p.grad
        if g is None:
            continue
        if g.is_sparse:
            total += g._values().numel() * g.element_size() + g._indices().numel() * 8
        else:
            total += g.numel() * g.element_size()
    return float(total)


def profile_steps(
    steps: dict[Config, Callable[[], list[float]]], configs: list[Config], repeats: int
) -> dict[Config, dict[str, tuple[float, float]]]:
    """``repeats`` profiled steps of each config, interleaved: per operator, the mean number of
    calls and the mean self time (ms) per step."""
    from torch.profiler import ProfilerActivity, profile

    sums: dict[Config, dict[str, list[float]]] = {
        c: defaultdict(lambda: [0.0, 0.0]) for c in configs
    }
    for _ in range(repeats):
        for c in configs:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                steps[c]()
            for e in prof.key_averages():
                sums[c][e.key][0] += e.count / repeats
                sums[c][e.key][1] += e.self_cpu_time_total / 1e3 / repeats
    return {c: {k: (v[0], v[1]) for k, v in ops.items()} for c, ops in sums.items()}


def machine_load() -> str:
    """The load average and the busiest other processes, for the Markdown's account of what else
    ran on the machine during the run."""
    load = load_average()
    try:
        out = subprocess.run(
            ["ps", "-eo", "pid,pcpu,rss,etime,args", "--sort=-pcpu", "--no-headers"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    others = []
    for line in out:
        pid, pcpu, rss, etime, cmd = line.split(None, 4)
        if int(pid) == os.getpid() or cmd.startswith("ps ") or float(pcpu) < 5:
            continue
        others.append(f"`{cmd[:60]}` ({pcpu}% CPU, {int(rss) / 2**20:.1f} GiB, up {etime})")
    return f"load average {load}; other busy processes: " + ("; ".join(others[:4]) or "none")


def mem_available_bytes() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float("inf")


def path_bytes(num_classes: int, path: str, dim: int) -> int:
    """Rough memory of one (N, path): table and two moments, plus the dense gradient (and, for
    unfused Adam, its two temporaries) on the dense paths."""
    return {"sparse": 3, "dense": 6, "dense_fused": 4}[path] * num_classes * dim * 4


@dataclass
class Run:
    """What a benchmark run collects."""

    args: argparse.Namespace
    rows: list[dict] = field(default_factory=list)
    refresh: dict[tuple[int, str], tuple[float, float]] = field(default_factory=dict)
    profiles: dict[Config, dict[str, tuple[float, float]]] = field(default_factory=dict)
    profile_schedule: dict[Config, str] = field(default_factory=dict)
    load: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def refresh_indexes(run: Run, paths: list[TrainPath], names: list[str]) -> None:
    """Builds every MIDX index of the group's sizes once (timed the first time per (N, K))."""
    done: set[int] = set()
    for path in paths:
        for s in names:
            sampler = path.heads[s].sampler
            if not s.startswith("midx") or id(sampler) in done or sampler.is_built:
                continue
            done.add(id(sampler))
            gc.collect()
            base = reset_peak_rss()
            t0 = time.perf_counter()
            path.heads[s].refresh_index()
            _sync()
            seconds, peak = time.perf_counter() - t0, float(peak_rss_bytes() - base)
            run.refresh.setdefault((path.num_classes, s), (seconds, peak))
            log(f"  refresh N = {path.num_classes:,} {s}: {seconds:.2f} s, {peak / 2**20:.0f} MiB")


def run_group(
    run: Run,
    units: list[tuple[int, str]],
    samplers: dict[int, dict[str, Sampler]],
    schedule: str,
    companions: set[int],
) -> None:
    """Builds the (N, path) units, times all their configurations round-robin, measures memory,
    profiles, and frees everything."""
    args = run.args
    names = sampler_names(args.codebook_sizes)
    needed = sum(path_bytes(n, p, args.dim) for n, p in units)
    if args.device == "cpu" and needed > mem_available_bytes():
        log(f"  skipping {units}: needs ~{needed / 2**30:.1f} GiB, not available")
        run.skipped.append(f"{units}: not enough free memory")
        return
    log(f"  building {units} ({schedule})")
    paths = {(n, p): make_path(p, n, samplers[n], args) for n, p in units}
    refresh_indexes(run, list(paths.values()), names)
    configs: list[Config] = [(n, p, s) for n, p in units for s in names]
    steps = {c: make_step(paths[c[:2]], c[2]) for c in configs}
    for c in configs:
        for _ in range(args.warmup):
            steps[c]()
    times: dict[Config, list[list[float]]] = {c: [] for c in configs}
    for r in range(args.repeats):
        for c in configs:
            times[c].append(steps[c]())
        log(
            f"  round {r + 1}/{args.repeats} (wall/cpu s): "
            + ", ".join(
                f"{n:.0e} {p}/{s} {sum(times[(n, p, s)][-1][:3]):.3f}/"
                f"{sum(times[(n, p, s)][-1][3:6]):.3f}"
                for n, p, s in configs
            )
        )
    run.load.append(f"{units} after timing: {machine_load()}")
    for c in configs:
        n, p, s = c
        mem = step_memory(steps[c], args.device)
        state = state_bytes(paths[c[:2]], s)
        grad = grad_bytes(paths[c[:2]])
        wall = [sum(t[:3]) for t in times[c]]
        cpu = [sum(t[3:6]) for t in times[c]]
        phases = {}
        for i, ph in enumerate(PHASES):
            phases[f"{ph}_s"] = statistics.median(t[i] for t in times[c])
            phases[f"{ph}_cpu_s"] = statistics.median(t[3 + i] for t in times[c])
        refresh = run.refresh.get((n, s), ("", ""))
        run.rows.append(
            {
                "num_classes": n,
                "path": p,
                "optimizer": OPTIMIZER[p],
                "sampler": s,
                "batch": args.batch,
                "dim": args.dim,
                "negatives": args.negatives,
                "median_s": statistics.median(wall),
                "cpu_s": statistics.median(cpu),
                "sys_s": statistics.median(t[6] for t in times[c]),
                **phases,
                "times_s": " ".join(f"{t:.4f}" for t in wall),
                "cpu_times_s": " ".join(f"{t:.4f}" for t in cpu),
                "step_peak_mib": mem / 2**20,
                "state_mib": state / 2**20,
                "grad_mib": grad / 2**20,
                "refresh_s": refresh[0],
                "refresh_peak_mib": refresh[1] / 2**20 if refresh[1] != "" else "",
                "schedule": schedule,
                "companion": n in companions,
                "threads": args.threads,
            }
        )
        log(
            f"  N = {n:,} {p}/{s}: median {run.rows[-1]['median_s']:.4f} s wall, "
            f"{run.rows[-1]['cpu_s']:.4f} s CPU, step peak {mem / 2**20:.0f} MiB, state "
            f"{state / 2**20:.0f} MiB"
        )
    profiled = [
        c
        for c in configs
        if c[0] in args.profile_sizes
        and (c[1] == "sparse" or c[2] == "uniform")
        and (c[0] in companions or c not in run.profiles)
    ]
    if profiled and args.profile_steps > 0:
        log(f"  profiling {len(profiled)} configurations x {args.profile_steps} steps")
        for c, ops in profile_steps(steps, profiled, args.profile_steps).items():
            run.profiles[c] = ops
            run.profile_schedule[c] = schedule
    del steps, paths
    gc.collect()
    _malloc_trim()


def run_size(run: Run, n: int) -> None:
    """Every configuration at ``N = n`` (and the companion size where N needs one)."""
    args = run.args
    run.load.append(f"N = {n:,} start: {machine_load()}")
    samplers = {n: make_samplers(n, args.codebook_sizes, args.device)}
    budget = args.mem_budget_gb * 2**30
    if sum(path_bytes(n, p, args.dim) for p in args.paths) <= budget:
        log(f"N = {n:,}: all paths interleaved")
        run_group(run, [(n, p) for p in args.paths], samplers, "all interleaved", set())
    else:
        comp = args.companion_size
        if "sparse" in args.paths:
            units = [(n, "sparse")]
            if comp and comp != n and path_bytes(comp, "sparse", args.dim) <= budget:
                samplers[comp] = make_samplers(comp, args.codebook_sizes, args.device)
                units.append((comp, "sparse"))
            log(f"N = {n:,}: one path at a time, sparse with {units[1:]}")
            schedule = f"sparse at N = {n:.0e} and {comp:.0e} interleaved"
            run_group(run, units, samplers, schedule, {comp})
            samplers.pop(comp, None)
        for p in args.paths:
            if p != "sparse":
                run_group(run, [(n, p)], samplers, f"{p} alone (samplers interleaved)", set())
    del samplers
    gc.collect()
    _malloc_trim()


def find_row(
    rows: list[dict], n: int, path: str, sampler: str, schedule: str | None = None
) -> dict | None:
    for row in rows:
        if (row["num_classes"], row["path"], row["sampler"]) != (n, path, sampler):
            continue
        if schedule is None and not row["companion"] or row["schedule"] == schedule:
            return row
    return None


def _ratio_line(label: str, num: dict, den: dict, ok: Callable[[float], bool], goal: str) -> str:
    wall = num["median_s"] / den["median_s"]
    cpu = num["cpu_s"] / den["cpu_s"]
    verdict = "PASS" if ok(wall) and ok(cpu) else ("FAIL" if not (ok(wall) or ok(cpu)) else "MIXED")
    return (
        f"- **{verdict}** {label}: wall {num['median_s']:.4f} / {den['median_s']:.4f} s = "
        f"**{wall:.2f}x**, CPU {num['cpu_s']:.4f} / {den['cpu_s']:.4f} s = **{cpu:.2f}x** "
        f"(target {goal})"
    )


def targets(rows: list[dict], names: list[str], companion: int) -> list[str]:
    """PASS / FAIL lines of the two targets, on wall and on CPU time (MIXED: one passes)."""
    lines = ["(1) LazyAdam step at N = 1e7 within 1.5x of the step at N = 2e5:", ""]
    for s in names:
        large = find_row(rows, 10_000_000, "sparse", s)
        small = large and find_row(rows, companion, "sparse", s, large["schedule"])
        how = "interleaved with N = 1e7"
        if large and not small:
            small, how = find_row(rows, companion, "sparse", s), "measured separately"
        if large and small and companion == 200_000:
            lines.append(
                _ratio_line(
                    f"{s}, N = 1e7 / 2e5 ({how})", large, small, lambda r: r <= 1.5, "<= 1.5x"
                )
            )
        else:
            lines.append(f"- {s}: not measured (needs N = 2e5 and 1e7)")
    lines += [
        "",
        "(2) at N = 1e6 the LazyAdam step at least 10x faster than the dense Adam step:",
        "",
    ]
    for s in names:
        dense, sparse = (find_row(rows, 1_000_000, p, s) for p in ("dense", "sparse"))
        if dense and sparse:
            lines.append(
                _ratio_line(f"{s}, Adam / LazyAdam", dense, sparse, lambda r: r >= 10, ">= 10x")
            )
        else:
            lines.append(f"- {s}: not measured (needs N = 1e6)")
    lines += ["", "For reference (no target), Adam(fused=True) / LazyAdam at N = 1e6:", ""]
    for s in names:
        fused, sparse = (find_row(rows, 1_000_000, p, s) for p in ("dense_fused", "sparse"))
        if fused and sparse:
            wall, cpu = (fused[k] / sparse[k] for k in ("median_s", "cpu_s"))
            lines.append(f"- {s}: wall {wall:.2f}x, CPU {cpu:.2f}x")
    return lines


def profile_tables(run: Run, top: int) -> list[str]:
    """Markdown: the top operators of every profiled configuration, then side-by-side operator
    comparisons of the targets' pairs."""
    out = []
    for (n, p, s), ops in sorted(run.profiles.items()):
        total = sum(ms for _, ms in ops.values())
        best = sorted(ops.items(), key=lambda kv: -kv[1][1])[:top]
        listing = "; ".join(f"`{k}` x{c:.0f} {ms:.1f}" for k, (c, ms) in best)
        when = run.profile_schedule[(n, p, s)]
        out.append(f"- N = {n:,} {p}/{s} ({when}): {total:.0f} ms/step in all ops. {listing}")
    pairs = []
    for s in sampler_names(run.args.codebook_sizes):
        pairs.append(((run.args.companion_size, "sparse", s), (10_000_000, "sparse", s)))
    pairs.append(((1_000_000, "sparse", "uniform"), (1_000_000, "dense", "uniform")))
    pairs.append(((1_000_000, "sparse", "uniform"), (1_000_000, "dense_fused", "uniform")))
    for a, b in pairs:
        if a not in run.profiles or b not in run.profiles:
            continue
        pa, pb = run.profiles[a], run.profiles[b]
        keys = sorted(
            set(pa) | set(pb), key=lambda k: -max(pa.get(k, (0, 0))[1], pb.get(k, (0, 0))[1])
        )
        name_a, name_b = f"{a[0]:.0e} {a[1]}/{a[2]}", f"{b[0]:.0e} {b[1]}/{b[2]}"
        out += [
            "",
            f"{name_a} vs {name_b}, ms per step (self time; calls in brackets):",
            "",
            f"| operator | {name_a} | {name_b} | difference |",
            "|---|---|---|---|",
        ]
        for k in keys[:top]:
            ca, ma = pa.get(k, (0, 0.0))
            cb, mb = pb.get(k, (0, 0.0))
            out.append(f"| `{k}` | {ma:.1f} ({ca:.0f}) | {mb:.1f} ({cb:.0f}) | {mb - ma:+.1f} |")
        ta, tb = sum(v[1] for v in pa.values()), sum(v[1] for v in pb.values())
        out.append(f"| all operators | {ta:.1f} | {tb:.1f} | {tb - ta:+.1f} |")
    return out


def plot(rows: list[dict], names: list[str], path: Path) -> None:
    plt = pyplot()

    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    main_rows = [r for r in rows if not r["companion"]]
    styles = {"dense": ("--", "C3"), "dense_fused": (":", "C1"), "sparse": ("-", "C0")}
    markers = dict(zip(names, "os^dv", strict=False))
    for p, (style, color) in styles.items():
        for s in names:
            pts = [r for r in main_rows if r["path"] == p and r["sampler"] == s]
            if not pts:
                continue
            ns = [r["num_classes"] for r in pts]
            kw = dict(color=color, marker=markers[s], label=f"{p} ({OPTIMIZER[p]}), {s}")
            axes[0].plot(ns, [r["median_s"] for r in pts], style, **kw)
            axes[1].plot(ns, [r["cpu_s"] for r in pts], style, **kw)
            total = [r["step_peak_mib"] + r["state_mib"] + r["grad_mib"] for r in pts]
            axes[2].plot(ns, total, style, **kw)
    axes[0].set(xscale="log", yscale="log", xlabel="classes N", ylabel="seconds (median)")
    axes[0].set_title("training step, wall clock")
    axes[1].set(xscale="log", yscale="log", xlabel="classes N", ylabel="seconds (median)")
    axes[1].set_title("training step, process CPU time")
    axes[2].set(xscale="log", yscale="log", xlabel="classes N", ylabel="MiB")
    axes[2].set_title("state + gradient between steps + one step's peak")
    axes[0].legend(fontsize=7)
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)


def replot(name: str, names: list[str]) -> Path:
    """Redraws ``results/<name>.png`` from ``results/<name>.csv`` (no measurement)."""
    with (RESULTS_DIR / f"{name}.csv").open() as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r["num_classes"] = int(r["num_classes"])
        r["companion"] = r["companion"] == "True"
        for k in ("median_s", "cpu_s", "step_peak_mib", "state_mib", "grad_mib"):
            r[k] = float(r[k])
    path = RESULTS_DIR / f"{name}.png"
    plot(rows, names, path)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = make_parser(__doc__)
    parser.add_argument(
        "--sizes", type=float, nargs="+", default=[1e4, 2e5, 1e6, 1e7], help="values of N"
    )
    parser.add_argument("--codebook-sizes", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--negatives", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    add_threads_argument(parser, 1, "torch and faiss threads")
    parser.add_argument("--mem-budget-gb", type=float, default=8.0)
    parser.add_argument("--companion-size", type=float, default=2e5)
    parser.add_argument("--profile-sizes", type=float, nargs="*", default=[2e5, 1e6, 1e7])
    parser.add_argument("--profile-steps", type=int, default=3)
    parser.add_argument("--profile-top", type=int, default=10)
    parser.add_argument(
        "--paths", nargs="+", choices=PATHS, default=list(PATHS), help="optimisation paths"
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--name",
        default="train_step",
        help="file stem under benchmarks/results/, or an absolute path without suffix",
    )
    parser.add_argument("--load-note", default="", help="what else ran, for the Markdown")
    parser.add_argument(
        "--replot", action="store_true", help="only redraw the PNG from the existing CSV"
    )
    args = parser.parse_args(argv)
    args.sizes = [int(s) for s in args.sizes]
    args.companion_size = int(args.companion_size)
    args.profile_sizes = {int(s) for s in args.profile_sizes}
    set_threads(args.threads, faiss=True)
    names = sampler_names(args.codebook_sizes)
    if args.replot:
        print(replot(args.name, names))
        return
    log(f"{provenance()}; sizes {args.sizes}")

    run = Run(args)
    start = time.perf_counter()
    for n in args.sizes:
        run_size(run, n)
    elapsed = time.perf_counter() - start

    refresh_lines = [
        "| num_classes | sampler | refresh_s | refresh_peak_mib |",
        "|---|---|---|---|",
    ]
    for (n, s), (seconds, peak) in sorted(run.refresh.items()):
        if n in args.sizes:
            refresh_lines.append(f"| {n} | {s} | {seconds:.2f} | {peak / 2**20:.0f} |")
    command = " ".join(["python -m benchmarks.train_step", *(argv or sys.argv[1:])])
    notes = "\n".join(
        [
            f"""
One training step: `optimizer.zero_grad()`, queries `z = Linear({INPUT_DIM}, {args.dim})(x)` for
B = {args.batch} fixed random inputs, `SampledSoftmaxHead` loss with M = {args.negatives}
negatives per query, backward, optimizer step; D = {args.dim}, device {args.device},
{args.threads} thread(s). `dense`: `sparse_grad=False` + `torch.optim.Adam` (defaults); `sparse`:
`sparse_grad=True` + `LazyAdam`; `dense_fused` (a reference, no target): `sparse_grad=False` +
`torch.optim.Adam(fused=True)`. `midx_rqK` is `MIDXSampler(N, codebook_size=K,
quantizer="rq")`, its index built once per N (not in the step time; table below). The heads of
one (N, path) share one class table and optimizer. Times: medians of {args.repeats} rounds after
{args.warmup} warm-up steps per configuration, the configurations of a `schedule` interleaved
round-robin; `median_s` is wall clock, `cpu_s` process CPU time (user + system: the steadier
measure on this shared machine); the phase columns are CPU-time medians (`forward` includes
zero_grad, the encoder and the draw); raw times in the CSV. At N = 1e7 the paths do not fit
together in {args.mem_budget_gb:g} GiB: the sparse path is interleaved with a companion sparse
path at N = {args.companion_size:,} (rows marked `companion` in the CSV, used for target 1), then
each dense path runs alone. `sys_s`: median system CPU time per step (page faults of fresh
allocations; from `getrusage`, tick-sampled split of the precise total). `state_mib`: table,
encoder, optimizer moments and sampler buffers, which persist between steps (LazyAdam keeps dense
`[N, D]` moments, as SparseAdam does, so its state is as large as Adam's); `grad_mib`: the
gradients, also alive between steps (`zero_grad(set_to_none=True)` frees them only at the start
of the next step); `step_peak_mib`: peak-RSS growth over one steady-state step beyond both (the
new gradient replaces the old one, so this is Adam's two `[N, D]` temporaries on the dense path,
the gathered rows and sparse-gradient work on the sparse one). A path's footprint is the sum of
the three (plus faiss' k-means during a MIDX refresh, in the refresh table).

## Targets

Verdicts on the median wall-clock and the median CPU-time ratios (MIXED: one passes).

"""
            + "\n".join(targets(run.rows, names, args.companion_size)),
            "\n## MIDX refresh (`head.refresh_index()`, once per N and K, not in the step)\n",
            "\n".join(refresh_lines),
            f"\n## Where the time goes (torch.profiler, mean of {args.profile_steps} steps)\n",
            "Self time per operator (wall clock inside the operator, so other jobs' load inflates "
            "it; compare columns of one table, which were profiled interleaved).\n",
            "\n".join(profile_tables(run, args.profile_top)) or "(no profiled sizes)",
            "\n## Run\n",
            f"`OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')} "
            f"THP_MEM_ALLOC_ENABLE={os.environ.get('THP_MEM_ALLOC_ENABLE', 'unset')} {command}` "
            f"(or `make bench-train-step`); {elapsed / 60:.1f} min in all.",
            "\n## Machine load during the run\n",
            args.load_note,
            "\n".join(f"- {line}" for line in [*run.load, f"end: {machine_load()}"]),
            ("\nSkipped: " + "; ".join(run.skipped)) if run.skipped else "",
        ]
    )
    md = write_results(
        args.name,
        run.rows,
        title="Training step: dense Adam vs row-sparse LazyAdam, uniform and MIDX-rq",
        notes=notes,
        columns=[
            "num_classes",
            "path",
            "sampler",
            "median_s",
            "cpu_s",
            "sys_s",
            "forward_cpu_s",
            "backward_cpu_s",
            "optimizer_cpu_s",
            "step_peak_mib",
            "state_mib",
            "grad_mib",
            "schedule",
        ],
    )
    plot(run.rows, names, result_path(args.name, ".png"))
    print(md.read_text())
    print(f"results under {RESULTS_DIR}")


if __name__ == "__main__":
    main()
