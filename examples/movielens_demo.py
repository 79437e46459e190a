"""Demo: next-item recommendation on MovieLens-100k with exact full-ranking evaluation.

A GRU4Rec-style model (item embedding -> GRU -> output head tied to the item embedding) is trained
twice from the same seed, once with the exact ``FullSoftmaxHead`` and once with a
``SampledSoftmaxHead`` over 100 negatives per batch (shared, TensorFlow style) from the squashed
unigram proposal. Both are evaluated exactly over all 1,682 items on the leave-one-out test split
(each user's last item), excluding the items already in the user's history, and the script prints
NDCG@10, Recall@10 and the time per epoch.

Data: ``recbole/dataset_example/ml-100k/ml-100k.inter`` from
``pip install --no-deps recbole==1.2.1``.
Run: ``make demo`` or ``python examples/movielens_demo.py [--epochs 5]``.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import time
from collections import defaultdict
from pathlib import Path

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_sampled.heads import FullSoftmaxHead, SampledSoftmaxHead
from lightning_sampled.metrics import evaluate_ranking
from lightning_sampled.samplers import UnigramSampler


def movielens_100k_path() -> Path:
    """The interaction file shipped inside the ``recbole`` package."""
    spec = importlib.util.find_spec("recbole")
    if spec is None or spec.origin is None:
        raise SystemExit(
            "MovieLens-100k comes from the recbole package: "
            "pip install --no-deps recbole==1.2.1 (make setup does this)"
        )
    return Path(spec.origin).parent / "dataset_example" / "ml-100k" / "ml-100k.inter"


def load_sequences(path: Path) -> list[list[int]]:
    """Each user's items ordered by time, re-indexed from 1 (0 is padding)."""
    by_user: dict[str, list[tuple[float, str]]] = defaultdict(list)
    with path.open() as f:
        reader = csv.reader(f, delimiter="\t")
        header = next(reader)
        user_col = header.index("user_id:token")
        item_col = header.index("item_id:token")
        time_col = header.index("timestamp:float")
        for row in reader:
            by_user[row[user_col]].append((float(row[time_col]), row[item_col]))
    item_ids: dict[str, int] = {}
    sequences = []
    for user in sorted(by_user, key=int):
        events = sorted(by_user[user])
        sequences.append([item_ids.setdefault(item, len(item_ids) + 1) for _, item in events])
    return sequences


def left_pad(seq: list[int], length: int, value: int) -> list[int]:
    seq = seq[-length:]
    return [value] * (length - len(seq)) + seq


def build_splits(sequences: list[list[int]], max_len: int):
    """Leave-one-out: train on all but the last two items, validate on the second last, test on
    the last. Training windows predict every next item; evaluation rows hold the history, the
    target and the history again as the items to exclude."""
    train_inputs, train_targets = [], []
    for seq in sequences:
        train = seq[:-2]
        for end in range(len(train), 1, -max_len):
            window = train[max(0, end - max_len - 1) : end]
            train_inputs.append(left_pad(window[:-1], max_len, 0))
            train_targets.append(left_pad(window[1:], max_len, -100))
    history = [left_pad(seq[:-1], max_len, 0) for seq in sequences]
    test = TensorDataset(
        torch.tensor(history),
        torch.tensor([seq[-1] for seq in sequences]),
        torch.tensor([left_pad(seq[:-1], max(map(len, sequences)), -1) for seq in sequences]),
    )
    train = TensorDataset(torch.tensor(train_inputs), torch.tensor(train_targets))
    return train, test


class GRU4Rec(L.LightningModule):
    """Item embedding -> GRU -> output head tied to the item embedding."""

    def __init__(self, num_items: int, head: str, counts: torch.Tensor, dim: int = 64):
        super().__init__()
        self.item_emb = nn.Embedding(num_items + 1, dim, padding_idx=0)
        self.gru = nn.GRU(dim, dim, batch_first=True)
        n = num_items + 1
        if head == "full":
            self.head = FullSoftmaxHead(n, dim, weight=self.item_emb.weight, padding_idx=0)
        else:
            sampler = UnigramSampler(counts, alpha=0.75, padding_idx=0)
            self.head = SampledSoftmaxHead(
                n,
                dim,
                sampler,
                100,
                shared_negatives=True,
                weight=self.item_emb.weight,
                padding_idx=0,
            )
        self.epoch_seconds: list[float] = []

    def encode(self, items: torch.Tensor) -> torch.Tensor:
        """``[B, L]`` item ids -> ``[B, L, D]`` states."""
        return self.gru(self.item_emb(items))[0]

    def training_step(self, batch, batch_idx):
        items, targets = batch
        loss = self.head(self.encode(items), targets)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def on_train_epoch_start(self):
        self._epoch_start = time.perf_counter()

    def on_train_epoch_end(self):
        self.epoch_seconds.append(time.perf_counter() - self._epoch_start)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=3e-3)


def run(head: str, train, test, num_items, counts, epochs: int, seed: int) -> dict[str, float]:
    L.seed_everything(seed, verbose=False)
    model = GRU4Rec(num_items, head, counts)
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=epochs,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(model, DataLoader(train, batch_size=64, shuffle=True))
    model.eval()
    metrics = evaluate_ranking(
        model.head,
        DataLoader(test, batch_size=256),
        lambda b: (model.encode(b[0])[:, -1], b[1], b[2]),
        ks=10,
        metrics=("ndcg", "recall"),
        exclude_seen=True,
    )
    metrics["s/epoch"] = sum(model.epoch_seconds) / len(model.epoch_seconds)
    return metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--max-len", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    path = movielens_100k_path()
    sequences = load_sequences(path)
    num_items = max(max(s) for s in sequences)
    print(
        f"MovieLens-100k: {len(sequences)} users, {num_items} items, "
        f"{sum(map(len, sequences))} interactions ({path.name})"
    )
    train, test = build_splits(sequences, args.max_len)
    counts = torch.bincount(train.tensors[1][train.tensors[1] > 0], minlength=num_items + 1)
    results = {
        name: run(name, train, test, num_items, counts, args.epochs, args.seed)
        for name in ("full", "sampled")
    }
    print(f"\nTest (last item per user), exact ranking over all {num_items} items, seen excluded;")
    print(f"{args.epochs} epochs, seed {args.seed}:")
    print(f"{'head':<41}{'NDCG@10':>9}{'Recall@10':>11}{'s/epoch':>9}")
    labels = {"full": "FullSoftmaxHead", "sampled": "SampledSoftmaxHead(unigram, M=100 shared)"}
    for name, m in results.items():
        print(f"{labels[name]:<41}{m['ndcg@10']:>9.4f}{m['recall@10']:>11.4f}{m['s/epoch']:>9.2f}")


if __name__ == "__main__":
    main()
