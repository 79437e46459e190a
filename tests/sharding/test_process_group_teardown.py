"""A process that imported the library before ``init_process_group`` ends gloo's threads at
``destroy_process_group`` even when ``torch._dynamo`` is first imported after it (as an optimizer's
first step does). Otherwise the threads outlive the group and one that releases a finished
collective while the interpreter exits aborts the process (SIGABRT at exit, 1 in ~30 runs)."""

import importlib
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import lightning_sampled.sharding.collectives  # noqa: F401  (the import under test, before init)


def thread_count() -> int:
    return len(os.listdir("/proc/self/task"))


def worker(rank: int, init_file: str, out: str) -> None:
    before = thread_count()
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    running = thread_count()
    importlib.import_module("torch._dynamo")  # first imported here, after init

    x = torch.ones(3)
    dist.all_reduce(x)
    dist.destroy_process_group()
    with open(f"{out}{rank}", "w") as f:
        f.write(f"{before} {running} {thread_count()} {x.tolist()}")


def test_destroying_the_group_ends_its_threads_after_a_late_dynamo_import(tmp_path):
    mp.spawn(worker, args=(str(tmp_path / "init"), str(tmp_path / "rank")), nprocs=2)
    for rank in range(2):
        before, running, after, total = (tmp_path / f"rank{rank}").read_text().split(" ", 3)
        assert int(running) > int(before)  # gloo started its threads
        assert int(after) == int(before)  # and destroy_process_group ended them
        assert total == "[2.0, 2.0, 2.0]"
