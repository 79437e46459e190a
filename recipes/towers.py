"""A candidate tower for the recommenders: item vectors computed from item features instead of
looked up in a table of ``N`` rows (two-tower retrieval's item side).

At a million items a table row is trained only by the steps that touch its item (2.4 times an
epoch on ``recipes.SyntheticSequences``' default catalogue), so a tied table barely moves from
its initialisation and every head ends at the popularity ranking. A tower shares its parameters
across items: a rarely seen item gets a useful vector from its features. The head scores the
tower's vectors (``OutputHead(candidate_encoder=...)``): sampled heads call it on the candidates
of a step only, exact evaluation on every item in chunks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class ItemFeatures:
    """What a data module knows of every item id (row 0 is padding).

    Attributes:
        dense: float ``[N, F]`` numeric features (padding: zeros).
        category: long ``[N]`` a categorical feature in ``[0, C)`` (padding: any).
    """

    dense: Tensor
    category: Tensor

    def __post_init__(self) -> None:
        if self.dense.ndim != 2 or not self.dense.is_floating_point():
            raise ValueError(f"dense must be a float [N, F] tensor, got {self.dense.shape}")
        if self.category.shape != self.dense.shape[:1] or self.category.dtype != torch.long:
            raise ValueError(
                f"category must be a long [N] tensor with N = {self.dense.shape[0]}, got "
                f"{self.category.dtype} {tuple(self.category.shape)}"
            )


@dataclass(frozen=True)
class TowerSpec:
    """A recommender's ``item_tower`` option: the sizes of :class:`ItemTower` that the data
    module's :class:`ItemFeatures` must match (``recipes.SyntheticSequences``: ``latent_dim``
    dense features, ``num_clusters`` categories)."""

    feature_dim: int = 16
    num_categories: int = 1000
    num_buckets: int = 20


def popularity_buckets(class_counts: Tensor, num_buckets: int) -> Tensor:
    """``[N]`` each class's bucket ``min(floor(log2(1 + count)), num_buckets - 1)`` of its
    training count: 0 for unseen classes, then one bucket per doubling."""
    counts = torch.as_tensor(class_counts, dtype=torch.float64)
    return torch.log2(1 + counts).floor().clamp(max=num_buckets - 1).long()


class ItemTower(nn.Module):
    """Item vectors ``dense_i W + e_category(i) + e_popularity(i)``: a linear map of the dense
    features plus an embedding of the category and one of the item's training-count bucket
    (:func:`popularity_buckets`). Its parameters do not grow with ``N``; the features are
    buffers, filled by :meth:`load` from the data module (not saved in checkpoints).

    Args:
        num_items: ``N``, the ids it maps (``0..N - 1``).
        dim: ``D``, the vectors' width.
        feature_dim: ``F``, the dense features per item.
        num_categories: ``C``, the categorical feature's values.
        class_counts: ``[N]`` training counts (for the popularity buckets); ``None``: every item
            in bucket 0 (no popularity feature).
        num_buckets: popularity buckets (items seen ``2^(num_buckets - 1) - 1`` times or more
            share the last).
    """

    def __init__(
        self,
        num_items: int,
        dim: int,
        feature_dim: int,
        num_categories: int,
        class_counts: Tensor | None = None,
        num_buckets: int = 20,
    ) -> None:
        super().__init__()
        for name, value in (
            ("num_items", num_items),
            ("dim", dim),
            ("feature_dim", feature_dim),
            ("num_categories", num_categories),
            ("num_buckets", num_buckets),
        ):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if class_counts is not None and len(class_counts) != num_items:
            raise ValueError(f"class_counts must have {num_items} entries, got {len(class_counts)}")
        self.dense = nn.Linear(feature_dim, dim, bias=False)
        self.category = nn.Embedding(num_categories, dim)
        self.popularity = nn.Embedding(num_buckets, dim)
        for table in (self.category, self.popularity):
            nn.init.normal_(table.weight, std=dim**-0.5)
        buckets = (
            torch.zeros(num_items, dtype=torch.long)
            if class_counts is None
            else popularity_buckets(class_counts, num_buckets)
        )
        self.register_buffer("bucket_of", buckets, persistent=False)
        self.register_buffer("dense_of", torch.zeros(num_items, feature_dim), persistent=False)
        self.register_buffer(
            "category_of", torch.zeros(num_items, dtype=torch.long), persistent=False
        )
        self.loaded = False

    def load(self, features: ItemFeatures) -> None:
        """Copies the data module's features into the buffers (on their device)."""
        if tuple(features.dense.shape) != tuple(self.dense_of.shape):
            raise ValueError(
                f"the tower expects dense features {tuple(self.dense_of.shape)}, the data "
                f"module gave {tuple(features.dense.shape)}"
            )
        low, high = int(features.category.min()), int(features.category.max())
        if low < 0 or high >= self.category.num_embeddings:
            raise ValueError(
                f"categories must be in [0, {self.category.num_embeddings}), got [{low}, {high}]"
            )
        self.dense_of.copy_(features.dense)
        self.category_of.copy_(features.category)
        self.loaded = True

    def forward(self, ids: Tensor) -> Tensor:
        """``[*ids.shape, D]`` the vectors of item ``ids``."""
        if not self.loaded:
            raise RuntimeError("ItemTower has no features: call load(features) first")
        return (
            self.dense(self.dense_of[ids])
            + self.category(self.category_of[ids])
            + self.popularity(self.bucket_of[ids])
        )
