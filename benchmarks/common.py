"""What every benchmark shares: its command line, threads, progress lines, timing over
interleaved rounds, peak memory (in this process or a fresh one), the load average around a run,
provenance and the result files (CSV, Markdown, plots).

A benchmark's ``main`` is mostly::

    parser = common.make_parser(__doc__)  # the docstring's first paragraph describes it
    common.add_threads_argument(parser)
    args = parser.parse_args(argv)
    common.set_threads(args.threads)
    with common.measured_load(args.background) as load:
        rows = measure(args)  # common.timed_rounds: every variant once per round
    common.write_results(args.name, rows, title=..., header=load.header, notes=...)

(:func:`run_and_write` is that whole frame for a ``measure(args) -> rows``.)

Each benchmark writes ``results/<name>.csv`` (every row carries the machine, torch version and
commit), ``results/<name>.md`` (a Markdown table) and, where a picture helps,
``results/<name>.png``; a ``name`` may also be a path (absolute, or relative to ``results/``), so
that a run writes elsewhere (a GPU machine's output folder): :func:`result_path`.
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import importlib
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from recipes import memory
from recipes.memory import peak_rss_bytes

RESULTS_DIR = Path(__file__).resolve().parent / "results"

K = TypeVar("K", bound=Hashable)


def description(doc: str | None) -> str:
    """The first paragraph of a module's docstring: a benchmark's one-line description."""
    return (doc or "").strip().split("\n\n")[0]


def doc_section(doc: str | None, end: str) -> str:
    """A module docstring from its second paragraph up to the first ``end`` (its setup, for the
    notes under a results table), stripped."""
    return (doc or "").split("\n\n", 1)[-1].split(end)[0].strip()


def make_parser(doc: str | None, *, full: bool = False) -> argparse.ArgumentParser:
    """A benchmark's argument parser, described by the first paragraph of ``doc`` (its module
    docstring), or by all of it as written where ``full``."""
    if full:
        return argparse.ArgumentParser(
            description=doc, formatter_class=argparse.RawTextHelpFormatter
        )
    return argparse.ArgumentParser(description=description(doc))


def add_threads_argument(
    parser: argparse.ArgumentParser,
    default: int | None = 1,
    text: str = "torch's intra-op threads",
) -> None:
    """``--threads N`` (``default``; ``None`` leaves torch's own), for :func:`set_threads`;
    ``text`` is its help."""
    parser.add_argument("--threads", type=int, default=default, help=text)


def set_threads(threads: int | None, *, faiss: bool = False) -> None:
    """torch's intra-op thread count and, with ``faiss``, faiss' OpenMP one; ``None`` or ``0``
    leaves them as they are. Every benchmark (and every worker process it starts) sets its
    threads here."""
    if not threads:
        return
    torch.set_num_threads(threads)
    if faiss:
        import faiss as faiss_module

        faiss_module.omp_set_num_threads(threads)


def log(message: str) -> None:
    """A progress line on stderr, stamped with the program's name and the wall-clock time."""
    program = Path(sys.argv[0]).stem if sys.argv and sys.argv[0] else "benchmark"
    print(f"[{program} {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def gpu_driver() -> str:
    """The NVIDIA driver's version as ``nvidia-smi`` reports it, or why it is unknown."""
    try:
        return subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no nvidia-smi)"


def provenance() -> dict[str, str]:
    """Machine, torch version and git commit, stamped on every CSV row."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parent,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parent,
        ).stdout.strip()
        commit += "-dirty" if dirty else ""
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    if torch.cuda.is_available():
        machine = torch.cuda.get_device_name(0)
    else:
        machine = f"{platform.machine()} cpu x{os.cpu_count()} threads={torch.get_num_threads()}"
    return {"machine": machine, "torch": torch.__version__, "commit": commit}


def result_path(name: str, suffix: str) -> Path:
    """``results/<name><suffix>``, or ``<name><suffix>`` where ``name`` is an absolute path; its
    folder is created."""
    path = RESULTS_DIR / f"{name}{suffix}"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def load_average() -> str:
    """The 1, 5 and 15 minute load averages (``/proc/loadavg``, as ``uptime`` shows them), or
    ``"unknown"`` where that file is missing."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


@dataclass
class Load:
    """The load average (:func:`load_average`) at the start and at the end of a run, and what
    else ran beside it (free text, ``--background``)."""

    start: str
    end: str = ""
    background: str = ""

    @property
    def header(self) -> str:
        """:func:`load_header` of this run, for :func:`write_results`."""
        return load_header(self.start, self.end, self.background)


@contextmanager
def measured_load(background: str = "") -> Iterator[Load]:
    """The load average taken around the ``with`` block: ``load.start`` on entry, ``load.end``
    on exit (also when the block raises)."""
    load = Load(load_average(), background=background)
    try:
        yield load
    finally:
        load.end = load_average()


def add_background_argument(parser: argparse.ArgumentParser) -> None:
    """``--background TEXT``: what else ran on the machine, for :func:`load_header`."""
    parser.add_argument(
        "--background", default="", help="what else ran on the machine, for the results' header"
    )


def load_header(load_start: str, load_end: str, background: str = "") -> str:
    """Markdown for a results header: the load average (:func:`load_average`) at the start and
    at the end of a run, and what else ran beside it (``background``, free text)."""
    text = (
        f"Background load: load average (1, 5, 15 min) {load_start} at the start and {load_end} "
        f"at the end of this run."
    )
    if background:
        text += f" Running beside it: {background}; compare the ratios measured in this run."
    return text


def synchronize(device: str | torch.device) -> None:
    """Waits for ``device``'s queued work where it is a CUDA device; a no-op elsewhere."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: str | torch.device = "cpu") -> float:
    """Wall-clock seconds of one ``fn()``, ``device`` synchronised before and after."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def timed_rounds(
    fns: Mapping[K, Callable[[], Any]],
    repeats: int,
    device: str | torch.device = "cpu",
    *,
    warmup: int = 1,
    before: Callable[[K], Any] | None = None,
    progress: Callable[[K], str] | None = None,
) -> dict[K, list[float]]:
    """Seconds of each of ``fns`` over ``repeats`` interleaved rounds (one call of each per round,
    in order), after ``warmup`` rounds that are not kept, so that the load of other processes
    hits every variant alike; :func:`timed` synchronises ``device`` around each call.

    Args:
        fns: the variants, by key.
        repeats: the rounds kept.
        device: where the calls run.
        warmup: rounds run first and not kept.
        before: called with a variant's key before each of its calls, untimed (fresh gradients
            for an optimizer step, ...).
        progress: where given, a line after each kept round, each variant named by
            ``progress(key)`` with its seconds in that round.

    Returns:
        ``{key: [seconds of round 1, ..., seconds of round repeats]}``.
    """
    times: dict[K, list[float]] = {key: [] for key in fns}
    for round_index in range(warmup + repeats):
        for key, fn in fns.items():
            if before is not None:
                before(key)
            seconds = timed(fn, device)
            if round_index >= warmup:
                times[key].append(seconds)
        if progress is not None and round_index >= warmup:
            shown = ", ".join(f"{progress(key)} {t[-1]:.3f}s" for key, t in times.items())
            print(f"  round {round_index - warmup + 1}/{repeats}: {shown}", flush=True)
    return times


def timed_optimizer_steps(
    built: Mapping[K, tuple[torch.Tensor, torch.optim.Optimizer, torch.Tensor]],
    repeats: int,
    *,
    warmup: int = 0,
) -> dict[K, list[float]]:
    """:func:`timed_rounds` of ``optimizer.step()`` for each ``(parameter, optimizer, grad)`` of
    ``built``, the parameter's ``.grad`` set to a fresh copy of ``grad`` before each step
    (untimed; a step may consume its gradient in place)."""

    def fresh_grad(key: K) -> None:
        parameter, _, grad = built[key]
        parameter.grad = grad.clone()

    steps = {key: optimizer.step for key, (_, optimizer, _) in built.items()}
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return timed_rounds(steps, repeats, device, warmup=warmup, before=fresh_grad)


def medians_against(times: Mapping[K, list[float]], reference: K) -> dict[K, tuple[float, float]]:
    """Each entry's median seconds of :func:`timed_rounds` and its ratio to the median of
    ``reference``'s."""
    medians = {key: statistics.median(seconds) for key, seconds in times.items()}
    return {key: (median, median / medians[reference]) for key, median in medians.items()}


def median_time(fn: Callable[[], Any], repeats: int = 5, warmup: int = 1) -> tuple[float, list]:
    """Median wall-clock seconds of ``fn()`` over ``repeats`` runs after ``warmup`` runs
    (:func:`timed_rounds` of one variant; CUDA synchronised around each run where there is
    CUDA). Returns ``(median, all_times)``."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    times = timed_rounds({"fn": fn}, repeats, device, warmup=warmup)["fn"]
    return statistics.median(times), times


def add_timing_arguments(parser: argparse.ArgumentParser, *, repeats: int, name: str) -> None:
    """``--repeats`` (rounds of :func:`timed_rounds`), ``--threads``, ``--device``, ``--name``
    (the results' file stem) and ``--background``."""
    parser.add_argument("--repeats", type=int, default=repeats)
    add_threads_argument(parser)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--name", default=name, help="results file stem")
    add_background_argument(parser)


def _trim_heap() -> None:
    """Hands memory that glibc's allocator keeps after ``free`` back to the kernel
    (``malloc_trim``), so that the resident set is live memory: otherwise a function that reuses
    memory an earlier call freed shows no growth at all. A no-op without glibc."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def reset_peak_rss() -> int:
    """:func:`recipes.memory.reset_peak_rss` after trimming the heap: returns the current RSS,
    the baseline of a later :func:`peak_rss_bytes`."""
    _trim_heap()
    return memory.reset_peak_rss()


def peak_extra_bytes(fn: Callable[[], Any], device: str) -> float:
    """Peak bytes ``fn()`` allocates beyond what was allocated before it: CUDA's allocator
    statistics on ``"cuda"``, the process' peak RSS (reset first) elsewhere."""
    if device == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return float(torch.cuda.max_memory_allocated() - base)
    base = reset_peak_rss()
    fn()
    return float(peak_rss_bytes() - base)


def in_fresh_process(
    module: str, function: str, *args: Any, env: Mapping[str, str] | None = None
) -> Any:
    """``module.function(*args)`` in a fresh process (its own peak resident set, its own
    allocator state), its return value sent back; an exception there is raised here, and a crash
    of that process raises :class:`concurrent.futures.process.BrokenProcessPool`.

    Without ``env`` the process is forked from a server that has only imported ``module`` (so
    that each call pays no import time); with ``env`` it is a new interpreter started with those
    variables added to this one's (``MALLOC_MMAP_THRESHOLD_`` and the like, which take effect
    only when a process starts). ``args`` must pickle.
    """
    if env is None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([module])
    else:
        context = multiprocessing.get_context("spawn")
    target = getattr(importlib.import_module(module), function)
    env = dict(env or {})
    saved = {name: os.environ.get(name) for name in env}
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        try:
            os.environ.update(env)
            future = pool.submit(target, *args)  # starts the process, with this environment
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        return future.result()


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the file-only Agg backend (imported on first use)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str | Path, dpi: int = 110) -> Path:
    """Writes ``fig`` to ``path`` (a PNG) and closes it."""
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return Path(path)


def smooth(values: Sequence[float], window: int) -> list[float]:
    """Trailing moving average of ``values`` over ``window`` points (fewer at the start)."""
    return [
        sum(values[max(0, i - window + 1) : i + 1]) / min(window, i + 1) for i in range(len(values))
    ]


def write_results(
    name: str,
    rows: Sequence[dict[str, Any]],
    *,
    title: str,
    notes: str = "",
    columns: Sequence[str] | None = None,
    header: str = "",
    commit: str | None = None,
) -> Path:
    """Writes ``results/<name>.csv`` (with provenance on every row) and ``results/<name>.md``.

    Args:
        name: file stem, or a path without suffix (:func:`result_path`).
        rows: one dict per measurement; keys are columns.
        title: the Markdown heading.
        notes: Markdown text placed under the table (setup, targets, how to reproduce).
        columns: the Markdown table's columns, in order (default: every key of the first row).
        header: Markdown text placed between the heading and the table (what else ran, ...).
        commit: the commit to stamp instead of git's (a copy of the repository without git
            metadata, as on a GPU machine).

    Returns:
        The path of the Markdown file.
    """
    prov = provenance()
    if commit:
        prov["commit"] = commit
    full_rows = [{**row, **prov} for row in rows]
    csv_path = result_path(name, ".csv")
    with csv_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(full_rows[0]))
        writer.writeheader()
        writer.writerows(full_rows)
    columns = list(columns or rows[0])
    lines = [f"# {title}", ""]
    if header:
        lines += [header.strip(), ""]
    lines.append("| " + " | ".join(columns) + " |")
    lines.append("|" + "---|" * len(columns))
    for row in rows:
        lines.append("| " + " | ".join(_fmt(row.get(c, "")) for c in columns) + " |")
    lines += ["", f"Machine: {prov['machine']}; torch {prov['torch']}; commit {prov['commit']}."]
    if notes:
        lines += ["", notes.strip()]
    md_path = result_path(name, ".md")
    md_path.write_text("\n".join(lines) + "\n")
    return md_path


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def run_and_write(
    args: argparse.Namespace,
    measure: Callable[[argparse.Namespace], list[dict[str, Any]]],
    *,
    title: str,
    notes: str | Callable[[list[dict[str, Any]]], str] = "",
    columns: Sequence[str] | None = None,
    faiss: bool = False,
) -> list[dict[str, Any]]:
    """The frame of a simple benchmark: :func:`set_threads` to ``args.threads``, ``measure(args)``
    with the load taken around it (:func:`measured_load`, ``args.background``), then
    :func:`write_results` to ``args.name`` with the load as the header and ``notes`` (or
    ``notes(rows)``: text that reads the measured rows, such as a Targets list) under the table.
    Returns the rows."""
    set_threads(args.threads, faiss=faiss)
    with measured_load(args.background) as load:
        rows = measure(args)
    text = notes(rows) if callable(notes) else notes
    write_results(args.name, rows, title=title, header=load.header, notes=text, columns=columns)
    return rows
