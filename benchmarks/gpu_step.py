"""Issue 29 on one GPU: the MIDX-rq head against the uniform head, the index refresh at 1e7
classes, the whole training step flat in N, and compiled against eager; one run, one device.

Four parts (``--parts``), each built from the benchmark that owns the measurement:

- ``head``: forward + backward of ``SampledSoftmaxHead(N = 1e6, D = 64, M = 100)`` on 25,600
  queries with the uniform sampler and with MIDX-rq (fast) at K = 32 and 128
  (:func:`benchmarks.sampler_time.time_sequence_heads`: round-robin, medians, then one more call
  each for the peak memory beyond what was allocated before).
- ``refresh``: ``MIDXSampler(1e7, K, "rq").refresh(table)`` on a ``[1e7, 64]`` table on the
  device, K = 32 and 128: the first (cold) refresh, then the median of 3 warm-started ones
  (what an ``IndexRefresh`` during training runs), and the peak memory of one more.
- ``train``: the whole step of :mod:`benchmarks.train_step` (encoder, ``SampledSoftmaxHead``
  with B = 1024, M = 100, D = 64, backward, optimizer step) at N = 1e5, 1e6 and 1e7, uniform and
  MIDX-rq (K = 32), with ``sparse_grad=True`` + ``LazyAdam`` and with the dense gradient +
  ``torch.optim.Adam(fused=True)``, all configurations of one N interleaved.
- ``compile``: :func:`benchmarks.compile_step.measure` at N = 1e6, B = 1024: forward + backward of
  the head's loss (``torch.compile(head)``, inductor's default mode; ``loss.backward()`` outside
  it, its graph compiled by AOTAutograd; no optimizer step), eager vs compiled, compile time
  excluded from the medians, with dynamo's graph-break count. A head is skipped when less than
  ``--compile-reserve-s`` of ``--budget-s`` is left.

Results (rewritten after every part, so that a run stopped early keeps what it measured):
``<out>/gpu_step.csv`` (one row per measurement, machine, torch version and commit on each) and
``<out>/gpu_step.md`` (the table, a "Targets" list with "met" / "NOT met" per target, the GPU,
its driver, torch / CUDA / Triton versions and the commit).

Run (repository root, GPU machine): ``python3 -m benchmarks.gpu_step --out $OUT/t29
[--commit SHA]``; about 1-2 minutes on an H100. ``--tiny`` runs every part at toy sizes (a CPU
dry run: ``python -m benchmarks.gpu_step --tiny --device cpu --out /tmp/t29``).
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch

from benchmarks import compile_step, sampler_time, train_step
from benchmarks.common import (
    doc_section,
    gpu_driver,
    log,
    make_parser,
    median_time,
    peak_extra_bytes,
    provenance,
    timed,
    write_results,
)
from benchmarks.head_step import CODEBOOK_SIZE
from benchmarks.sampler_time import SEQ_NEGATIVES, class_table
from lightning_sampled.samplers import MIDXSampler

PARTS = ("head", "refresh", "train", "compile")
COLUMNS = ("part", "method", "codebook_size", "num_classes", "batch", "median_ms", "peak_mib")
COLUMNS += ("note",)


@dataclass(frozen=True)
class Sizes:
    """The problem sizes of every part (:data:`FULL` on the GPU, :data:`TINY` for a dry run)."""

    head_classes: int
    head_queries: int
    head_codebooks: tuple[int, ...]
    refresh_classes: int
    refresh_codebooks: tuple[int, ...]
    train_classes: tuple[int, ...]
    train_batch: int
    train_codebook: int
    compile_classes: int
    repeats: int
    dim: int = 64


FULL = Sizes(
    head_classes=1_000_000,
    head_queries=25_600,
    head_codebooks=(32, 128),
    refresh_classes=10_000_000,
    refresh_codebooks=(32, 128),
    train_classes=(100_000, 1_000_000, 10_000_000),
    train_batch=1024,
    train_codebook=32,
    compile_classes=1_000_000,
    repeats=10,
)
TINY = Sizes(
    head_classes=3_000,
    head_queries=256,
    head_codebooks=(4, 8),
    refresh_classes=20_000,
    refresh_codebooks=(4,),
    train_classes=(1_000, 3_000, 10_000),
    train_batch=32,
    train_codebook=4,
    compile_classes=1_000,
    repeats=2,
    dim=16,
)
COMPILED_HEADS = ("midx_rq", "uniform")  # in order of interest: the budget may stop the second


@dataclass
class Run:
    """What the parts collect: result rows, target lines and notes, and the clock."""

    args: argparse.Namespace
    sizes: Sizes
    rows: list[dict] = field(default_factory=list)
    targets: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    start: float = field(default_factory=time.perf_counter)

    def row(self, part: str, method: str, num_classes: int, **values: object) -> None:
        """Appends one result row (missing columns left empty)."""
        row = dict.fromkeys(COLUMNS, "")
        row.update(part=part, method=method, num_classes=num_classes, **values)
        self.rows.append(row)

    def target(self, label: str, value: str, ok: bool | None) -> None:
        """One "Targets" line: what was measured and whether it meets the target."""
        verdict = "not measured" if ok is None else ("met" if ok else "NOT met")
        self.targets.append(f"- {label}: {value}: **{verdict}**")

    def elapsed(self) -> float:
        return time.perf_counter() - self.start


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def head_part(run: Run) -> None:
    """MIDX-rq heads against the uniform head at the sequence shape (time and peak memory)."""
    s, args = run.sizes, run.args
    ns = argparse.Namespace(
        seq_classes=s.head_classes,
        seq_queries=s.head_queries,
        seq_methods=["uniform", "midx_rq"],
        seq_codebook_sizes=list(s.head_codebooks),
        dim=s.dim,
        device=args.device,
        repeats=s.repeats,
    )
    rows: list[dict] = []
    sampler_time.time_sequence_heads(ns, rows)
    by_key = {(r["sampler"], r["codebook_size"]): r for r in rows}
    for r in rows:
        run.row(
            "head",
            r["sampler"],
            r["num_classes"],
            codebook_size=r["codebook_size"],
            batch=s.head_queries,
            median_ms=r["median_ms"],
            peak_mib=r["peak_mib"],
            note="forward + backward",
        )
    uniform = by_key["uniform", ""]
    for k in s.head_codebooks:
        rq = by_key["midx_rq", k]
        time_ratio = rq["median_ms"] / uniform["median_ms"]
        mem_ratio = rq["peak_mib"] / uniform["peak_mib"]
        where = f"{s.head_queries:,} queries, N = {s.head_classes:.0e}, M = {SEQ_NEGATIVES}"
        run.target(
            f"MIDX-rq head K = {k} / uniform head, time ({where}; target <= 1.3x)",
            f"{rq['median_ms']:.2f} / {uniform['median_ms']:.2f} ms = {time_ratio:.2f}x",
            time_ratio <= 1.3,
        )
        run.target(
            f"MIDX-rq head K = {k} / uniform head, peak memory (target <= 2x)",
            f"{rq['peak_mib']:.0f} / {uniform['peak_mib']:.0f} MiB = {mem_ratio:.2f}x",
            mem_ratio <= 2.0,
        )


def refresh_part(run: Run) -> None:
    """``MIDXSampler.refresh`` of a ``[N, D]`` table on the device: cold, warm-started median,
    and peak memory."""
    s, args = run.sizes, run.args
    n = s.refresh_classes
    table = class_table(n, argparse.Namespace(dim=s.dim, device=args.device))
    for k in s.refresh_codebooks:
        refresh = partial(MIDXSampler(n, k, "rq", "fast").to(args.device).refresh, table)
        cold = timed(refresh, args.device)
        runs = min(s.repeats, 3)  # at 1e7 a refresh may take seconds: keep to the budget
        warm, _ = median_time(refresh, runs, warmup=0)
        peak = peak_extra_bytes(refresh, args.device)
        run.row(
            "refresh",
            "midx_rq",
            n,
            codebook_size=k,
            median_ms=1e3 * warm,
            peak_mib=peak / 2**20,
            note=f"warm-started median of {runs}; first (cold) refresh {cold:.3f} s",
        )
        run.target(
            f"refresh at N = {n:.0e}, D = {s.dim}, K = {k}, table on {args.device} "
            "(warm-started median; target <= 0.5 s)",
            f"{warm:.3f} s (cold first refresh {cold:.3f} s)",
            warm <= 0.5,
        )
        log(f"refresh N = {n:.0e} K = {k}: cold {cold:.3f} s, warm {warm:.3f} s")


def train_part(run: Run) -> None:
    """The whole training step at every training size, sparse + LazyAdam and dense fused Adam."""
    s, args = run.sizes, run.args
    k = s.train_codebook
    ns = argparse.Namespace(
        dim=s.dim,
        batch=s.train_batch,
        negatives=SEQ_NEGATIVES,
        codebook_sizes=[k],
        paths=["sparse", "dense_fused"],
        device=args.device,
        warmup=2,
        repeats=s.repeats,
        mem_budget_gb=args.mem_budget_gb,
        companion_size=0,
        profile_sizes=set(),
        profile_steps=0,
        threads=torch.get_num_threads(),
    )
    tr = train_step.Run(ns)
    for n in s.train_classes:
        train_step.run_size(tr, n)
        _free()
    for r in tr.rows:
        built = f"; index built in {r['refresh_s']:.2f} s" if r["refresh_s"] != "" else ""
        run.row(
            "train",
            f"{r['path']}/{r['sampler']}",
            r["num_classes"],
            codebook_size=k if r["sampler"] != "uniform" else "",
            batch=s.train_batch,
            median_ms=1e3 * r["median_s"],
            peak_mib=r["step_peak_mib"],
            note=f"{r['optimizer']}; {r['schedule']}{built}",
        )
    step = {(r["num_classes"], r["path"], r["sampler"]): r["median_s"] for r in tr.rows}
    small, large = s.train_classes[0], s.train_classes[-1]
    for sampler in train_step.sampler_names([k]):
        a, b = step.get((large, "sparse", sampler)), step.get((small, "sparse", sampler))
        run.target(
            f"LazyAdam step, {sampler}, N = {large:.0e} / N = {small:.0e} (target <= 1.5x)",
            "missing"
            if a is None or b is None
            else f"{a * 1e3:.2f} / {b * 1e3:.2f} ms = {a / b:.2f}x",
            None if a is None or b is None else a <= 1.5 * b,
        )
    for n in s.train_classes[1:]:
        for sampler in train_step.sampler_names([k]):
            a, b = step.get((n, "sparse", sampler)), step.get((n, "dense_fused", sampler))
            run.target(
                f"sparse + LazyAdam vs dense + Adam(fused=True), {sampler}, N = {n:.0e} "
                "(target: sparse faster)",
                "missing"
                if a is None or b is None
                else f"{a * 1e3:.2f} vs {b * 1e3:.2f} ms (fused / sparse = {b / a:.2f}x)",
                None if a is None or b is None else a < b,
            )


def compile_part(run: Run) -> None:
    """Eager against ``torch.compile(head)`` (forward + backward), head by head within the
    time budget."""
    s, args = run.sizes, run.args
    n = s.compile_classes
    for head in COMPILED_HEADS:
        left = args.budget_s - run.elapsed()
        if left < args.compile_reserve_s:
            run.notes.append(f"compile of {head} skipped: {left:.0f} s left of --budget-s")
            run.target(f"compiled step faster than eager, {head}", "skipped (time)", None)
            continue
        ns = argparse.Namespace(
            heads=[head],
            batch=s.train_batch,
            dim=s.dim,
            device=args.device,
            eager_only=[],
            warmup=3,
            repeats=s.repeats,
        )
        rows = compile_step.measure(ns, n)
        by_mode = {r["mode"]: r for r in rows}
        for r in rows:
            note = (
                ""
                if r["mode"] == "eager"
                else (
                    f"graph breaks {r['graph_breaks']}; compile {_fmt_s(r['compile_s'])}; "
                    f"{r['status']}"
                )
            )
            median = r["median_s"]
            run.row(
                "compile",
                f"{head}/{r['mode']}",
                n,
                codebook_size=CODEBOOK_SIZE if head == "midx_rq" else "",
                batch=s.train_batch,
                median_ms=1e3 * median if median != "" else "",
                note=note,
            )
        eager, compiled = by_mode["eager"]["median_s"], by_mode["compiled"]["median_s"]
        measured = compiled != ""
        run.target(
            f"compiled forward + backward faster than eager, {head}, N = {n:.0e}, "
            f"B = {s.train_batch} (graph breaks: {by_mode['compiled']['graph_breaks']})",
            f"{compiled * 1e3:.2f} vs {eager * 1e3:.2f} ms ({compiled / eager:.2f}x)"
            if measured
            else by_mode["compiled"]["status"],
            compiled < eager if measured else None,
        )
        _free()


def _fmt_s(value: object) -> str:
    return f"{value:.1f} s" if isinstance(value, float) else "n/a"


PART_FUNCTIONS: dict[str, Callable[[Run], None]] = {
    "head": head_part,
    "refresh": refresh_part,
    "train": train_part,
    "compile": compile_part,
}


def environment(args: argparse.Namespace) -> list[str]:
    """Markdown lines: the device, its driver, torch / CUDA / Triton versions and the commit."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    driver = gpu_driver() if args.device == "cuda" else "n/a"
    prov = provenance()
    return [
        f"- device: {prov['machine'] if args.device == 'cuda' else 'cpu (dry run)'}",
        f"- driver: {driver}; CUDA (torch build): {torch.version.cuda}",
        f"- torch {torch.__version__}; Triton {triton_version}",
        f"- commit: {args.commit or prov['commit']}",
    ]


def write(run: Run) -> Path:
    """(Re)writes ``gpu_step.csv`` and ``gpu_step.md`` under ``--out``."""
    args = run.args
    notes = "\n".join(
        [
            "## Targets",
            "",
            *run.targets,
            "",
            "## Environment",
            "",
            *environment(args),
            "",
            "## Notes",
            "",
            f"Parts run: {', '.join(args.parts)}; {run.elapsed():.0f} s in all."
            + (" Toy sizes (--tiny): the targets' numbers mean nothing." if args.tiny else ""),
            *[f"- {note}" for note in run.notes],
            "",
            doc_section(__doc__, "\n\nResults"),
        ]
    )
    return write_results(
        str(Path(args.out).resolve() / "gpu_step"),
        run.rows,
        title="Issue 29: sampled training on one GPU",
        notes=notes,
        columns=COLUMNS,
        commit=args.commit,
    )


def main(argv: list[str] | None = None) -> Path:
    parser = make_parser(__doc__)
    parser.add_argument("--out", required=True, help="folder of gpu_step.csv and gpu_step.md")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--tiny", action="store_true", help="toy sizes (a CPU dry run)")
    parser.add_argument("--commit", default="", help="commit to report (default: git's)")
    parser.add_argument("--budget-s", type=float, default=140.0, help="wall-clock budget")
    parser.add_argument(
        "--compile-reserve-s",
        type=float,
        default=35.0,
        help="compile a head only while this much of --budget-s is left",
    )
    parser.add_argument("--mem-budget-gb", type=float, default=40.0, help="train_step's budget")
    args = parser.parse_args(argv)
    run = Run(args, TINY if args.tiny else FULL)
    log(f"{provenance()}; device {args.device}; parts {args.parts}")
    path = Path()
    for part in args.parts:
        log(f"part {part} at {run.elapsed():.0f} s")
        PART_FUNCTIONS[part](run)
        _free()
        path = write(run)
    log(f"wrote {path} and gpu_step.csv after {run.elapsed():.0f} s")
    print(path.read_text())
    return path


if __name__ == "__main__":
    main()
