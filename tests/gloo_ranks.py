"""Runs a test's function on gloo processes and hands back what each rank returned: the spawn,
process group and teardown that the split-table tests share."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _rank_main(
    rank: int, run: Callable[[int], object], world: int, tmp: str, timeout_s: float
) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{tmp}/init",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout_s),
    )
    try:
        torch.save(run(rank), f"{tmp}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_on_ranks(
    run: Callable[[int], object], tmp: Path, world: int = 2, timeout_s: float = 30.0
) -> list:
    """``run(rank)`` on each of ``world`` spawned processes in one gloo group (a module-level
    function of the test, so that the processes can import it); their results in rank order.
    ``timeout_s`` bounds every collective, so that a rank left waiting fails the test fast."""
    mp.spawn(_rank_main, args=(run, world, str(tmp), timeout_s), nprocs=world, join=True)
    return [torch.load(tmp / f"rank{rank}.pt", weights_only=False) for rank in range(world)]
