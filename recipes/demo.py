"""``make demo``: an LSTM language model on GCIDE (108,620 words), full softmax vs sampled heads.

Each head trains the same tied LSTM (``recipes/configs/lstm_gcide.yaml``: embedding 256, one
LSTM layer of 256, 32 x 35 tokens a step) from the same seed for the same wall-clock budget: the
exact full softmax, then the MIDX-rq sampled softmax in the library's default configuration (20
MIDX-rq negatives per token plus the batch's other targets, ``in_batch_negatives="auto"``,
``recipes/configs/heads/sparse_midx_rq_mixed.yaml``) and, for comparison, the plain MIDX-rq
sampled softmax of the MIDX paper (its 20 negatives alone, ``sparse_midx_rq.yaml``). Both update
only the rows they touch (``sparse_grad``, ``LazyAdam``).
Each run's final weights are then scored by exact perplexity over the whole vocabulary on the
first ``--eval-tokens`` tokens of the validation and test splits, and a table prints tokens/s and
perplexity side by side. The first run fetches the data
(``apt-get download dict-gcide``, about 15 MB) and tokenises it (about 25 s); later runs read the
cache. It is :mod:`recipes.compare` with fixed arguments.

MIDX's proposal follows the learned embeddings, so in the first few hundred steps it is close to
uniform and frequent words are rarely drawn as negatives; the batch's own targets, a quarter of
them ``.``, ``,`` and ``the``, are negatives for every other token from the first step (see
``recipes/results/gcide.md``).

Run: ``python -m recipes.demo [--minutes 1.5] [--seed 0] [--threads 1] [--eval-tokens 3500]``.
"""

from __future__ import annotations

import argparse
import time

import torch

from .compare import CONFIGS, compare
from .data import GCIDE
from .tables import markdown_table

HEADS = {
    "full": "full softmax",
    "sparse_midx_rq_mixed": "MIDX-rq, default configuration: 20 negatives + the batch's targets",
    "sparse_midx_rq": "MIDX-rq alone (in_batch_negatives=False), 20 negatives",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=1.5, help="training budget per head")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument(
        "--eval-tokens", type=int, default=3500, help="validation / test tokens scored exactly"
    )
    return parser.parse_args(argv)


def summary(rows: list[dict]) -> list[dict]:
    """The side-by-side table: speed relative to the first row (the full softmax)."""
    base = rows[0]["positions/s"]
    return [
        {
            "head": HEADS.get(r["head"], r["head"]),
            "steps": r["steps"],
            "train tokens": r["train positions"],
            "tokens/s": round(r["positions/s"]),
            "speed-up": f"{r['positions/s'] / base:.1f}x",
            "val ppl": round(r["val/ppl"], 1),
            "test ppl": round(r["test/ppl"], 1),
            "peak RSS MB": round(r["peak RSS MB"]),
        }
        for r in rows
    ]


def demo(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    data = GCIDE()  # fetches and tokenises on the first run
    print(
        f"GCIDE: {data.num_classes:,} words, {len(data.ids['train']):,} training tokens "
        f"(ready in {time.perf_counter() - start:.0f} s)"
    )
    extra = [
        f"--data.init_args.max_eval_tokens={args.eval_tokens}",
        "--trainer.enable_progress_bar=false",
    ]
    config = CONFIGS / "lstm_gcide.yaml"
    rows = compare(config, list(HEADS), None, args.seed, extra, max_time=args.minutes)
    print(
        f"\nGCIDE LSTM LM, {args.minutes:g} min of training per head, seed {args.seed}, "
        f"{args.threads} thread(s); exact perplexity over all {data.num_classes:,} words "
        f"on the first {args.eval_tokens:,} validation / test tokens"
    )
    table = summary(rows)
    print(markdown_table(table))
    print(f"demo took {time.perf_counter() - start:.0f} s")
    return table


if __name__ == "__main__":
    demo()
