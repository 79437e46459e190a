"""Runs a training script as its own program, as Lightning's DDP launcher needs (it re-runs the
script once per extra rank), and fails with the ranks' own tracebacks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_script(script: Path, args: list[str], cwd: Path, errors: str) -> None:
    """Runs ``python script *args`` in ``cwd`` with the script's folder and the repository root
    (for ``recipes``) on ``PYTHONPATH``;
    asserts that it succeeded, showing the files matching ``errors`` in ``cwd`` (where each rank
    writes its traceback) or else the end of its stderr."""
    path = os.pathsep.join([str(script.parent), str(ROOT), os.environ.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, str(script), *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=300,
    )
    written = "".join(p.read_text() for p in cwd.glob(errors))
    assert proc.returncode == 0, written or proc.stderr[-3000:]
