"""Validates (or tests) a recipe checkpoint in ``DEVICES`` processes and writes rank 0's metrics
as JSON.

``python sharded_validate.py OUT_JSON DEVICES CKPT STAGE RECIPE_ARGS...`` (``STAGE``: ``validate``
or ``test``): Lightning's DDP launcher
re-runs this script once per extra rank; on failure each rank writes its error to
``OUT_JSON.error{R}.txt``.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

from recipes.cli import main as recipe


def main(out: str, devices: int, ckpt: str, stage: str, args: list[str]) -> None:
    rank = int(os.environ.get("LOCAL_RANK", 0))
    strategy = "ddp" if devices > 1 else "auto"
    try:
        cli = recipe(
            [*args, f"--trainer.devices={devices}", f"--trainer.strategy={strategy}"], run=False
        )
        run = getattr(cli.trainer, stage)
        metrics = run(cli.model, cli.datamodule, ckpt_path=ckpt, verbose=False)
    except Exception:
        with open(f"{out}.error{rank}.txt", "w") as f:
            f.write(traceback.format_exc())
        raise
    if rank == 0:
        with open(out, "w") as f:
            json.dump(metrics[0], f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:])
