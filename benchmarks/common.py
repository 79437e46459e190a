"""What every benchmark shares: timing, peak memory, provenance and the three result files.

Each benchmark writes ``results/<name>.csv`` (every row carries the machine, torch version and
commit), ``results/<name>.md`` (a Markdown table) and, where a picture helps,
``results/<name>.png``; a ``name`` may also be a path (absolute, or relative to ``results/``), so
that a run writes elsewhere (a GPU machine's output folder): :func:`result_path`.
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from recipes import memory
from recipes.memory import peak_rss_bytes

RESULTS_DIR = Path(__file__).resolve().parent / "results"


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


def median_time(fn: Callable[[], Any], repeats: int = 5, warmup: int = 1) -> tuple[float, list]:
    """Median wall-clock seconds of ``fn()`` over ``repeats`` runs after ``warmup`` runs.

    Synchronises CUDA around each run. Returns ``(median, all_times)``.
    """
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times), times


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
