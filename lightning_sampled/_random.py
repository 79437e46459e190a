"""Random streams shared by samplers and heads: each rank of a process group draws its own."""

from __future__ import annotations

import torch
import torch.distributed as dist


def rank_generator(device: torch.device) -> torch.Generator | None:
    """The generator of this rank's draws under ``torch.distributed``; ``None`` (torch's default
    generator) in a single process or a group of one.

    Every rank runs the same seeded program (``seed_everything`` seeds every rank alike), so draws
    from the default generator would be the same negatives on every rank: the extra ranks would
    add no new samples. Instead each call draws one seed ``s`` from torch's global CPU generator,
    which stays identical across ranks (and is what ``RNGCheckpoint`` saves), and returns a
    generator on ``device`` seeded with ``s + rank``: the ranks' streams differ, and a run stays
    repeatable. The extra CPU draw and the new generator cost microseconds per call.
    """
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    seed = int(torch.randint(2**62, ()).item())
    return torch.Generator(device=device).manual_seed(seed + dist.get_rank())
