"""Two ranks that import the library only after ``init_process_group`` (as spawned workers and
launchers do), use every split head, compare it with the unsharded head, destroy the group and
exit. ``tests/sharding/test_import_after_init.py`` runs one pair; to run many in a row:

    python tests/sharding/import_after_init.py --runs 20

A rank exits 0 only if its results match the unsharded head and ``destroy_process_group`` ended
gloo's threads (a default argument that kept the world group alive left them running, and one of
them aborted the process at exit, SIGABRT, in 2 of 5 runs); the launcher counts the pairs whose
two ranks exited 0 without "terminate called" on stderr.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

N, D, WORLD = 23, 6, 2
#: seconds a pair may take (imports included) before the launcher counts it as hung
PAIR_TIMEOUT_S = 240


def thread_count() -> int:
    return len(os.listdir("/proc/self/task"))


def batch(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(3 + rank, D, generator=g), torch.randint(N, (3 + rank,), generator=g)


def check_split_heads(rank: int) -> None:
    """Every split head (exact and sampled), forward and backward and the exact methods, against
    the unsharded head on the same rows; an ``AssertionError`` where they differ."""
    from lightning_sampled.heads import FullSoftmaxHead, SampledSoftmaxHead

    torch.manual_seed(0)
    full = FullSoftmaxHead(N, D, sharded=True, bias=True)
    sampled = SampledSoftmaxHead(N, D, num_negatives=4, sharded=True, bias=True)
    for head in (full, sampled):
        whole = head.whole_table()
        plain = FullSoftmaxHead(N, D, bias=True)
        plain.load_state_dict(whole)
        z, y = batch(rank)
        z.requires_grad_(True)
        loss = head(z, y)
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(z.grad).all()
        with torch.no_grad():
            torch.testing.assert_close(head.full_loss(z, y), plain.full_loss(z, y))
            torch.testing.assert_close(head.log_prob(z, y), plain.log_prob(z, y))
            values, ids = head.topk(z, 5)
            want_values, want_ids = plain.topk(z, 5)
            torch.testing.assert_close(values, want_values)
            assert torch.equal(ids, want_ids)
            torch.testing.assert_close(head.embed(y), plain.embed(y))
    # the exact head's training step: its loss, the query's and the table's gradients (the
    # mean over the ranks' losses, as DDP's), against the unsharded head on both batches
    plain = FullSoftmaxHead(N, D, bias=True)
    plain.load_state_dict(full.whole_table())
    total = 0.0
    for other in range(WORLD):
        z, y = batch(other)
        z.requires_grad_(True)
        other_loss = plain(z, y)
        if other == rank:
            (z_grad,) = torch.autograd.grad(other_loss, z, retain_graph=True)
            torch.testing.assert_close(loss_and_grad(full, rank), (other_loss.detach(), z_grad))
        total = total + other_loss / WORLD
    total.backward()
    torch.testing.assert_close(full.weight.grad, plain.weight.grad[full.shard_ids])
    optimizer = torch.optim.Adam(full.parameters())  # its first step imports torch._dynamo
    optimizer.step()


def loss_and_grad(head, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The head's loss of rank ``rank``'s batch and the query's gradient; the table's gradient
    is this step's alone."""
    head.zero_grad(set_to_none=True)
    z, y = batch(rank)
    z.requires_grad_(True)
    loss = head(z, y)
    loss.backward()
    return loss.detach(), z.grad


def worker(rank: int, init_file: str) -> None:
    torch.set_num_threads(1)
    assert "lightning_sampled" not in sys.modules
    before = thread_count()
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=WORLD,
        timeout=timedelta(seconds=60),
    )
    check_split_heads(rank)  # imports the library: after init_process_group
    dist.destroy_process_group()
    after = thread_count()
    if after != before:
        print(f"rank {rank}: {after} threads after destroy_process_group, {before} before init")
        sys.exit(3)
    print(f"rank {rank}: ok", flush=True)


def run_pair() -> tuple[list[int], str]:
    """One pair of ranks as two processes: their exit codes and their output."""
    with tempfile.TemporaryDirectory() as tmp:
        init = str(Path(tmp) / "init")
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--rank", str(rank), "--init", init],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for rank in range(WORLD)
        ]
        codes, output = [], ""
        for proc in procs:
            try:
                out, _ = proc.communicate(timeout=PAIR_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
            codes.append(proc.returncode)
            output += out
    return codes, output


def clean(codes: list[int], output: str) -> bool:
    """Whether both ranks exited 0, each having checked its results, and nothing aborted."""
    return codes == [0] * WORLD and "terminate called" not in output and "ok" in output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rank", type=int)
    parser.add_argument("--init")
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    if args.rank is not None:
        worker(args.rank, args.init)
        return
    passed = 0
    for run in range(args.runs):
        codes, output = run_pair()
        passed += clean(codes, output)
        print(f"run {run + 1}: exit codes {codes}, {'clean' if clean(codes, output) else output}")
    print(f"{passed} of {args.runs} runs exited cleanly")


if __name__ == "__main__":
    main()
