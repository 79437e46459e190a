"""Trains ``ToyModel`` for two epochs under ``strategy="ddp"`` on CPU processes (gloo).

Run as a script (Lightning's DDP launcher re-runs it once per extra rank):
``python ddp_train.py OUT_DIR [DEVICES]``. Rank 0 writes ``OUT_DIR/metrics.json`` (the validation
metrics that Lightning reduced across ranks) and ``OUT_DIR/final.ckpt``.
"""

import json
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")

import lightning as L  # noqa: E402
from toy_lightning import ToyData, ToyModel  # noqa: E402


def main(out_dir: str, devices: int) -> None:
    L.seed_everything(0, verbose=False)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = ToyModel(head="sampled")
    trainer.fit(model, ToyData())
    trainer.save_checkpoint(os.path.join(out_dir, "final.ckpt"))
    if trainer.is_global_zero:
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
        metrics["world_size"] = trainer.world_size
        with open(os.path.join(out_dir, "metrics.json"), "w") as f:
            json.dump(metrics, f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2)
