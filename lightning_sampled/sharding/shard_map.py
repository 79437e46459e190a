"""``ShardMap``: which rank holds which rows of a class table split across a process group.

The map is strided: class ``c`` lives on rank ``c mod W``, at local row ``c div W``. Class ids are
often sorted by frequency (the log-uniform proposal and the language-model vocabularies assume
it), so contiguous ranges would put every frequent class, and most of the proposal's mass and of
the gradient traffic, on rank 0; strides give every rank the same mix of frequent and rare
classes. Rank ``r`` holds ``ceil((N - r) / W)`` rows: shards differ by at most one row.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._validation import check_positive_int


class ShardMap:
    """The strided split of ``num_classes`` classes over ``world_size`` ranks, seen from ``rank``.

    Args:
        num_classes: ``N``, at least ``world_size`` (every rank holds a row).
        world_size: ``W``, the ranks of the group.
        rank: this process's rank in the group, in ``[0, W)``.
    """

    def __init__(self, num_classes: int, world_size: int, rank: int) -> None:
        self.num_classes = check_positive_int("num_classes", num_classes)
        self.world_size = check_positive_int("world_size", world_size)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
        if num_classes < world_size:
            raise ValueError(
                f"a table of {num_classes} classes cannot be split over {world_size} ranks: "
                f"every rank must hold at least one row"
            )
        self.rank = rank

    def num_local(self, rank: int | None = None) -> int:
        """The number of rows rank ``rank`` (default: this one) holds."""
        rank = self.rank if rank is None else rank
        return (self.num_classes - rank + self.world_size - 1) // self.world_size

    def shard_ids(self, device: torch.device | str | None = None) -> Tensor:
        """long ``[N_r]``: the global ids of this rank's rows, in local order."""
        return torch.arange(self.rank, self.num_classes, self.world_size, device=device)

    def owner(self, ids: Tensor) -> Tensor:
        """The rank that holds each of the global ``ids`` (any shape, same shape out)."""
        return ids % self.world_size

    def local_or(self, ids: Tensor, fill: int = -1) -> Tensor:
        """Local row of each of the global ``ids`` held here, ``fill`` for those held elsewhere
        (and for negative ids, such as padding); the shape of ``ids``."""
        mine = (ids >= 0) & (ids % self.world_size == self.rank)
        return torch.where(mine, ids // self.world_size, torch.full_like(ids, fill))

    def global_ids(self, local: Tensor) -> Tensor:
        """The global ids of local rows ``local`` (any shape); negative entries stay ``-1``."""
        return torch.where(local >= 0, local * self.world_size + self.rank, -1)

    def local_padding(self, padding_idx: int | None) -> int | None:
        """The local row of ``padding_idx`` when this rank holds it, else ``None``."""
        if padding_idx is None or padding_idx % self.world_size != self.rank:
            return None
        return padding_idx // self.world_size

    def grown(self, num_classes: int) -> ShardMap:
        """The map of the same ranks over ``num_classes >= N`` classes: every class keeps its
        rank and local row, and each rank's new classes follow its old rows in class order
        (what a split table's growth appends, :meth:`~lightning_sampled.heads.OutputHead.
        add_classes`)."""
        if num_classes < self.num_classes:
            raise ValueError(
                f"num_classes must be >= {self.num_classes} (a map only grows), got {num_classes}"
            )
        return ShardMap(num_classes, self.world_size, self.rank)

    def __repr__(self) -> str:
        return (
            f"ShardMap(num_classes={self.num_classes}, world_size={self.world_size}, "
            f"rank={self.rank}, num_local={self.num_local()})"
        )
