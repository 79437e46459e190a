"""This process' resident memory from ``/proc`` (Linux): the peak-RSS counter and its reset,
shared by ``recipes.compare`` and the benchmarks."""

from __future__ import annotations

import resource
from pathlib import Path


def _proc_status_bytes(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def reset_peak_rss() -> int:
    """Resets the kernel's peak-RSS counter (Linux ``clear_refs``); returns the current RSS.

    Where that is unavailable the peak is not reset, and the returned baseline is the peak so far,
    so a later :func:`peak_rss_bytes` difference can only under-count.
    """
    try:
        Path("/proc/self/clear_refs").write_text("5")
        current = _proc_status_bytes("VmRSS")
        if current is not None:
            return current
    except OSError:
        pass
    return peak_rss_bytes()


def peak_rss_bytes() -> int:
    """This process' peak resident set size since the last :func:`reset_peak_rss`, in bytes."""
    peak = _proc_status_bytes("VmHWM")
    if peak is not None:
        return peak
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
