"""A small LightningModule and data module that the integration tests train.

Synthetic classification over 257 classes: inputs are noisy copies of per-class centroids, so a
model that trains reaches a clearly better-than-chance NDCG within a couple of epochs.
"""

from __future__ import annotations

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_sampled.heads import FullSoftmaxHead, SampledSoftmaxHead
from lightning_sampled.metrics import NDCG, Recall, evaluation_sampler
from lightning_sampled.samplers import UnigramSampler

NUM_CLASSES = 257
NUM_FEATURES = 12


def toy_tensors(num_rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x [num_rows, 12], y [num_rows])`` drawn around fixed class centroids."""
    centroids = torch.randn(NUM_CLASSES, NUM_FEATURES, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(seed)
    popularity = torch.arange(1, NUM_CLASSES + 1, dtype=torch.float).reciprocal()
    y = torch.multinomial(popularity, num_rows, replacement=True, generator=g)
    x = centroids[y] + 0.3 * torch.randn(num_rows, NUM_FEATURES, generator=g)
    return x, y


class ToyData(L.LightningDataModule):
    def __init__(self, num_train: int = 2048, num_val: int = 509, batch_size: int = 64):
        super().__init__()
        self.train_set = TensorDataset(*toy_tensors(num_train, seed=1))
        self.val_set = TensorDataset(*toy_tensors(num_val, seed=2))
        self.batch_size = batch_size

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        # each row once under DDP: 509 rows do not split evenly over 2 ranks
        sampler = evaluation_sampler(self.val_set)
        return DataLoader(self.val_set, batch_size=self.batch_size, sampler=sampler)


class ToyModel(L.LightningModule):
    """An MLP encoder with one of our heads; validation logs exact NDCG@10 and Recall@10."""

    def __init__(self, head: str = "sampled", dim: int = 16, lr: float = 0.02):
        super().__init__()
        self.save_hyperparameters()
        self.encoder = nn.Sequential(nn.Linear(NUM_FEATURES, 32), nn.Tanh(), nn.Linear(32, dim))
        if head == "full":
            self.head = FullSoftmaxHead(NUM_CLASSES, dim, chunk_size=100)
        else:
            counts = torch.bincount(toy_tensors(2048, seed=1)[1], minlength=NUM_CLASSES)
            self.head = SampledSoftmaxHead(NUM_CLASSES, dim, UnigramSampler(counts), 32)
        self.ndcg = NDCG(k=10)
        self.recall = Recall(k=10)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = self.head(self.encoder(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        z = self.encoder(x)
        _, top = self.head.topk(z, 10)
        self.ndcg.update(top, y)
        self.recall.update(top, y)
        self.log("val/ndcg@10", self.ndcg, on_epoch=True)
        self.log("val/recall@10", self.recall, on_epoch=True)
        self.log("val/loss", self.head.full_loss(z, y), on_epoch=True, sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def evaluate(model: ToyModel, data: ToyData) -> dict[str, float]:
    """Exact NDCG@10 / Recall@10 of ``model`` over the whole validation set, in this process."""
    ndcg, recall = NDCG(k=10), Recall(k=10)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for x, y in data.val_dataloader():
            _, top = model.head.topk(model.encoder(x), 10)
            ndcg.update(top, y)
            recall.update(top, y)
    model.train(was_training)
    return {"val/ndcg@10": float(ndcg.compute()), "val/recall@10": float(recall.compute())}
