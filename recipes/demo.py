"""``make demo``: SASRec on MovieLens-100k with full softmax and with MIDX-rq sampled softmax.

Both runs start from the same seed, train for a few epochs with the configs in
``recipes/configs/``, restore the best validation checkpoint and print exact full-ranking
NDCG@10 / Recall@10 on the leave-one-out test split (all 1,682 items, seen items excluded) and the
time per epoch (training plus validation). It is :mod:`recipes.compare` with fixed arguments.

Run: ``python -m recipes.demo [--epochs 15] [--seed 0] [--threads 1]``.
"""

from __future__ import annotations

import argparse

import torch

from .compare import CONFIGS, compare


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    return parser.parse_args()


def demo() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    compare(CONFIGS / "sasrec_ml-100k.yaml", ["full", "midx_rq"], args.epochs, args.seed)


if __name__ == "__main__":
    demo()
