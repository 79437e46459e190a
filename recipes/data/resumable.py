"""A training dataloader that Lightning resumes exactly, mid-epoch included.

Lightning saves the ``state_dict`` of every training dataloader that has one in the checkpoint's
loop state and hands it back to ``load_state_dict`` before the resumed run iterates (its
"stateful dataloader" interface). :class:`ResumableLoader` keeps there the seed of the current
epoch's order and the number of batches already handed out, so a resumed run continues the
interrupted epoch with the batches that the uninterrupted run would have drawn next.
"""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Any

import torch
from torch.utils.data import DataLoader, Sampler


def draw_seed() -> int:
    """A seed from torch's global generator (as ``RandomSampler`` draws one each epoch)."""
    return int(torch.empty((), dtype=torch.int64).random_().item())


class EpochOrder(Sampler[int]):
    """The indices ``0 .. size - 1`` of one epoch, shuffled or in order, from position ``start``.

    A shuffled epoch draws its seed from torch's global generator when it starts, like
    ``RandomSampler``, and yields the same order ``RandomSampler`` would; the seed is kept in
    :attr:`seed` so that a resumed epoch can replay it. ``start`` (the indices to skip) applies to
    the next iteration only and keeps that iteration's seed.

    Args:
        size: the number of indices.
        shuffle: a random permutation per epoch (else ``0 .. size - 1`` in order).
    """

    def __init__(self, size: int, shuffle: bool) -> None:
        self.size = size
        self.shuffle = shuffle
        self.seed: int | None = None
        self.start = 0

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[int]:
        start, self.start = self.start, 0
        if start == 0 and self.shuffle:
            self.seed = draw_seed()
        yield from self.order()[start:].tolist()

    def order(self) -> torch.Tensor:
        """The ``[size]`` order of the current epoch."""
        if not self.shuffle:
            return torch.arange(self.size)
        return torch.randperm(self.size, generator=torch.Generator().manual_seed(self.seed))


class ResumableLoader(DataLoader):
    """A ``DataLoader`` over an :class:`EpochOrder` whose position Lightning saves in checkpoints.

    ``state_dict()`` is ``{"seed", "batches"}``: the seed of the current epoch's order and the
    batches of it handed out so far. Lightning's sized training loaders are not prefetched, so
    at a checkpoint ``batches`` is exactly the number of batches trained on in this epoch.
    ``load_state_dict`` makes the next iteration replay that epoch's order from the following
    batch; a state at the end of an epoch (``batches == len(self)``) lets the next epoch start
    afresh. Together with :class:`~lightning_sampled.callbacks.RNGCheckpoint` a run resumed from
    any checkpoint trains on the same batches as the uninterrupted run.

    Args:
        dataset: a map-style dataset.
        batch_size: as ``DataLoader``'s (``None``: the dataset's items are already batches).
        shuffle: a random order each epoch (see :class:`EpochOrder`).
        sampler: a sampler to use instead of :class:`EpochOrder` (Lightning passes its
            distributed sampler here under DDP; such a loader cannot resume mid-epoch).
        **kwargs: further ``DataLoader`` arguments (``num_workers``, ``collate_fn``, ...).
    """

    def __init__(
        self,
        dataset: Sized,
        batch_size: int | None = 1,
        shuffle: bool = False,
        sampler: Sampler | None = None,
        **kwargs: Any,
    ) -> None:
        if sampler is None:
            sampler = EpochOrder(len(dataset), shuffle)
        super().__init__(dataset, batch_size=batch_size, sampler=sampler, **kwargs)
        self.batches = 0
        self._resume_at = 0

    def __iter__(self) -> Iterator[Any]:
        self.batches, self._resume_at = self._resume_at, 0
        for batch in self._batches_from(self.batches):
            self.batches += 1
            yield batch

    def _batches_from(self, start: int) -> Iterator[Any]:
        """An iterator over this epoch's batches from batch ``start`` on.

        ``DataLoader`` draws its workers' base seed from torch's global generator whenever an
        iterator is created; the uninterrupted run did so when the epoch began, before the
        checkpoint's random state was saved, so a resumed epoch creates its iterator without
        touching the global generator. (Its workers get another base seed than the interrupted
        epoch's: exact only while workers draw nothing random, as in the recipes.)
        """
        if start == 0:
            return super().__iter__()
        self.sampler.start = start * (self.batch_size or 1)
        with torch.random.fork_rng(devices=[]):
            return super().__iter__()

    def state_dict(self) -> dict[str, int | None]:
        return {"seed": getattr(self.sampler, "seed", None), "batches": self.batches}

    def load_state_dict(self, state_dict: dict[str, int | None]) -> None:
        batches = state_dict["batches"]
        if not 0 <= batches <= len(self):
            raise ValueError(
                f"the checkpoint's loader state is at batch {batches} of an epoch, but this "
                f"loader has {len(self)} batches: resume with the data settings of the checkpoint"
            )
        if 0 < batches < len(self):
            if not isinstance(self.sampler, EpochOrder):
                raise ValueError(
                    f"cannot resume mid-epoch (batch {batches} of {len(self)}) with sampler "
                    f"{type(self.sampler).__name__}: resume from an end-of-epoch checkpoint"
                )
            self.sampler.seed = state_dict["seed"]
            self._resume_at = batches
        self.batches = batches
