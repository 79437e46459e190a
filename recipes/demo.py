"""``make demo``: SASRec on MovieLens-100k with full softmax and with MIDX-rq sampled softmax.

Both runs start from the same seed, train for a few epochs with the configs in
``recipes/configs/``, restore the best validation checkpoint and print exact full-ranking
NDCG@10 / Recall@10 on the leave-one-out test split (all 1,682 items, seen items excluded) and the
time per epoch (training plus validation).

Run: ``python -m recipes.demo [--epochs 15] [--seed 0] [--threads 1]``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from pathlib import Path

import lightning as L
import torch

from .cli import main

CONFIGS = Path(__file__).parent / "configs"
HEADS = {"full softmax": "full.yaml", "MIDX-rq (100 negatives)": "midx_rq.yaml"}


class EpochTimer(L.Callback):
    """Records the wall time of each training epoch (its validation included)."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = time.perf_counter()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.seconds.append(time.perf_counter() - self._start)


def run(head_file: str, epochs: int, seed: int, root: str) -> dict[str, float]:
    """Fits SASRec with one head config and returns its test metrics and mean epoch time."""
    cli = main(
        [
            "--config",
            str(CONFIGS / "sasrec_ml-100k.yaml"),
            "--config",
            str(CONFIGS / "heads" / head_file),
            f"--seed_everything={seed}",
            f"--trainer.max_epochs={epochs}",
            f"--trainer.default_root_dir={root}",
            "--trainer.logger=false",
            "--trainer.enable_model_summary=false",
        ],
        run=False,
    )
    timer = EpochTimer()
    cli.trainer.callbacks.append(timer)
    cli.trainer.fit(cli.model, cli.datamodule)
    (result,) = cli.trainer.test(cli.model, cli.datamodule, ckpt_path="best", verbose=False)
    result["epochs"] = len(timer.seconds)
    result["seconds/epoch"] = sum(timer.seconds) / len(timer.seconds)
    return result


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    return parser.parse_args()


def demo() -> None:
    args = parse_args()
    warnings.filterwarnings("ignore", "LightningCLI's args parameter")  # this script's own argv
    torch.set_num_threads(args.threads)
    results = {}
    with tempfile.TemporaryDirectory() as root:
        for name, head_file in HEADS.items():
            results[name] = run(head_file, args.epochs, args.seed, str(Path(root) / head_file))
    print(f"\nSASRec on MovieLens-100k, seed {args.seed}, exact full ranking on the test split")
    print(f"{'head':<26}{'epochs':>7}{'NDCG@10':>10}{'Recall@10':>11}{'s/epoch':>9}")
    for name, r in results.items():
        print(
            f"{name:<26}{r['epochs']:>7}{r['test/ndcg@10']:>10.4f}{r['test/recall@10']:>11.4f}"
            f"{r['seconds/epoch']:>9.1f}"
        )


if __name__ == "__main__":
    demo()
