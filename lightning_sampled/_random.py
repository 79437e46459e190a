"""Random streams shared by samplers and heads: each rank of a process group draws its own."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

_MASK64 = (1 << 64) - 1


def _rank() -> int:
    """This process's rank under ``torch.distributed`` (0 without it)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _splitmix64(x: int) -> int:
    """SplitMix64's output function: a bijection of 64-bit words that spreads nearby inputs."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def mixed_seed(*words: int) -> int:
    """One 63-bit seed from several integers (seed, draw number, rank): distinct tuples give
    unrelated seeds, so the generators they seed give unrelated streams."""
    seed = 0
    for word in words:
        seed = _splitmix64(seed ^ (word & _MASK64))
    return seed >> 1


# Draws whose shape follows the batch. ``torch.randint(high, shape, generator=g)`` and
# ``torch.rand(shape, generator=g)`` (even with ``g=None``) refuse the symbolic sizes of a
# compiled graph whose batch shape changed (dynamo's automatic dynamic shapes: "SymIntArrayRef
# expected to contain only concrete integers"); their ``*_like`` forms on an empty tensor of the
# same shape accept them and, in eager code, draw exactly the same numbers.


def randint(
    high: int,
    shape: Sequence[int],
    device: torch.device,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Long ``shape`` uniform in ``[0, high)``: ``torch.randint(high, shape, generator=...)``."""
    like = torch.empty(shape, dtype=torch.long, device=device)
    return torch.randint_like(like, high, generator=generator)


def rand(
    shape: Sequence[int],
    device: torch.device,
    generator: torch.Generator | None = None,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``shape`` uniform in ``[0, 1)``: ``torch.rand(shape, generator=..., dtype=...)``."""
    like = torch.empty(shape, dtype=dtype, device=device)
    return torch.rand_like(like, generator=generator)


def rank_generator(device: torch.device) -> torch.Generator | None:
    """The generator of this rank's random *initialisation* under ``torch.distributed`` (a
    sharded head's rows); ``None`` (torch's default generator) in a single process or a group of
    one. Draws of negatives use a sampler's own :class:`DrawStream` instead.

    Every rank runs the same seeded program (``seed_everything`` seeds every rank alike), so
    draws from the default generator would be the same on every rank. Instead each call draws one
    seed ``s`` from torch's global CPU generator, which stays identical across ranks, and returns
    a generator on ``device`` seeded with ``s + rank``.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    seed = int(torch.randint(2**62, ()).item())
    return torch.Generator(device=device).manual_seed(seed + dist.get_rank())


class DrawStream:
    """A sampler's own source of random draws, independent of torch's global generator.

    Draw number ``k`` on rank ``r`` uses a fresh ``torch.Generator`` on the queries' device
    seeded from ``(seed, k, r)``. The whole state is the pair ``(seed, draws)``, two integers that
    are the same on every rank of a DDP run (the ranks make the same calls), so the checkpoint
    Lightning writes from rank 0 restores every rank's stream, and a run resumed anywhere draws
    exactly the negatives of the uninterrupted run, whatever else (a data loader's shuffle,
    dropout) consumed torch's global generator in between.

    ``seed`` defaults to one draw from torch's global CPU generator when the stream is made, so
    ``seed_everything`` (or ``torch.manual_seed``) before building a model fixes it, as it fixes
    the model's initial weights. A fresh generator per draw costs microseconds.

    Under ``torch.compile`` (which cannot trace a ``torch.Generator``) :meth:`generator` returns
    ``None``: compiled code draws from torch's default generator, whose state
    :class:`~lightning_sampled.callbacks.RNGCheckpoint` saves.

    Args:
        seed: the stream's seed (``None``: drawn from torch's global generator).
    """

    def __init__(self, seed: int | None = None) -> None:
        self.seed = int(torch.randint(2**62, ()).item()) if seed is None else int(seed)
        self.draws = 0

    def generator(self, device: torch.device, per_rank: bool = True) -> torch.Generator | None:
        """The generator of the next draw on ``device``; advances the stream.

        Args:
            device: where the draw happens (a generator must live on its tensors' device).
            per_rank: seed it from this process's rank too (``False``: every rank draws the
                same; the rank is 0 without ``torch.distributed``).
        """
        if torch.compiler.is_compiling():
            return None
        rank = _rank() if per_rank else 0
        generator = torch.Generator(device=device)
        generator.manual_seed(mixed_seed(self.seed, self.draws, rank))
        self.draws += 1
        return generator

    def state(self) -> dict[str, int]:
        """``{"seed", "draws"}``: everything needed to continue the stream."""
        return {"seed": self.seed, "draws": self.draws}

    def load(self, state: Any) -> None:
        """Continues the stream from a :meth:`state`."""
        if not (isinstance(state, dict) and {"seed", "draws"} <= state.keys()):
            raise ValueError(f"a draw stream's state is {{'seed', 'draws'}}, got {state!r}")
        seed, draws = int(state["seed"]), int(state["draws"])
        if draws < 0:
            raise ValueError(f"a draw stream's count of draws must be >= 0, got {draws}")
        self.seed, self.draws = seed, draws
