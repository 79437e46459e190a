"""A class table split across ranks (``sharded=True``) against one process holding it all:
per-rank memory, step time and bytes communicated per training step.

For each ``N`` of ``--classes`` and each world size ``W`` of ``--worlds``, ``W`` processes (gloo,
spawned by ``torch.multiprocessing``, one thread each) build a
``SampledSoftmaxHead(N, D, UniformSampler(N), M, sparse_grad=True, sharded=True)`` and a
``LazyAdam`` over it, in each optimizer configuration of ``--optimizers``
(``TABLE_STATE:STATE_DTYPE:TABLE_DTYPE``: today's Adam state on an fp32 table, FBGEMM's
row-wise Adagrad on an fp32 and on a bf16 table), then run ``--warmup`` + ``--steps`` training
steps (forward, backward, optimizer step) on ``T`` scored positions per rank with queries from
a linear encoder. Each rank measures:

- **peak memory**: its peak resident set beyond what it held before building the head (the
  table, the optimizer state and every step's temporaries; Linux ``VmHWM`` after a reset);
- **step time**: the median of the timed steps (every rank takes part in each collective, so
  the ranks' medians agree; rank 0's is reported);
- **bytes sent per step**: the payloads this rank hands to ``torch.distributed`` collectives
  (the tensor of each ``all_gather`` and ``all_reduce``), counted by wrapping them, over the
  timed steps.

The bytes have a closed form (:func:`expected_bytes`), from :mod:`lightning_sampled.heads.
stratified`: per step and rank, ``24 + T (4 D + 8)`` forward for the ranks' agreement on the
call's inputs (8 bytes, :func:`~lightning_sampled.sharding.collectives.one_outcome`), the sizes,
the queries and the targets it sends, and ``W T (4 D + 24)`` for the positives' logits and
log-sizes (the default convention, ``corrected_all``, corrects the positive), the log-sum-exps
(max and sum) and, in backward, their gradients and the queries' gradient: nothing grows with
``N``. The benchmark checks the count against the formula at every ``N``.

Run: ``python -m benchmarks.sharded [--classes 1000000 10000000] [--worlds 1 2] [--dim 64]
[--positions 2048] [--negatives 100] [--steps 5] [--optimizers adam:float32:float32 ...]
[--name sharded]``;
results in ``benchmarks/results/<name>.{csv,md}``. The two processes need both cores: run it
alone, or say what ran beside it (``--background``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks.common import (
    add_background_argument,
    make_parser,
    measured_load,
    set_threads,
    write_results,
)
from recipes import memory

GIB = 2**30
#: optimizer configurations: LazyAdam's table_state and state_dtype, and the table's dtype
OPTIMIZERS = (
    "adam:float32:float32",
    "row_wise_adagrad:float32:float32",
    "row_wise_adagrad:float32:bfloat16",
)


def expected_bytes(positions: int, dim: int, world: int) -> int:
    """Bytes a rank sends per step of the stratified sampled head (module docstring) under the
    default convention, with ``positions`` scored positions on every rank, fp32 queries and
    per-query draws; 0 in one process."""
    if world == 1:
        return 0
    return 24 + positions * (4 * dim + 8) + world * positions * (4 * dim + 24)


class CollectiveBytes:
    """Counts the bytes this rank passes to ``dist.all_gather`` and ``dist.all_reduce`` while
    ``counting`` is on (``torch.distributed``'s functions are wrapped in place)."""

    def __init__(self) -> None:
        self.total = 0
        self.counting = False
        for name in ("all_gather", "all_reduce"):
            setattr(dist, name, self._counted(getattr(dist, name), name))

    def _counted(self, collective: Callable, name: str) -> Callable:
        def counted(*args: Any, **kwargs: Any) -> Any:
            if self.counting:
                tensor = args[1] if name == "all_gather" else args[0]
                self.total += tensor.numel() * tensor.element_size()
            return collective(*args, **kwargs)

        return counted


def run_rank(rank: int, world: int, init_file: str, args: argparse.Namespace, out: str) -> None:
    """One rank's measurement, written as JSON to ``out``."""
    from lightning_sampled.heads import SampledSoftmaxHead
    from lightning_sampled.optim import LazyAdam
    from lightning_sampled.samplers import UniformSampler

    set_threads(1)
    if world > 1:
        dist.init_process_group(
            "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world
        )
    counter = CollectiveBytes()
    try:
        torch.manual_seed(args.seed)
        base = memory.reset_peak_rss()
        head = SampledSoftmaxHead(
            args.n,
            args.dim,
            UniformSampler(args.n),
            args.negatives,
            sparse_grad=True,
            sharded=True,
            in_batch_negatives=False,
        )
        head.shard()  # creates the table (split already when built under torch.distributed)
        if args.table_dtype == "bfloat16":
            head.weight.data = head.weight.data.bfloat16()
        encoder = torch.nn.Linear(args.dim, args.dim)
        optimizer = LazyAdam(
            [*head.parameters(), *encoder.parameters()],
            table_state=args.table_state,
            state_dtype=args.state_dtype,
        )
        inputs = torch.randn(args.positions, args.dim)
        target = torch.randint(args.n, (args.positions,))

        def step() -> None:
            optimizer.zero_grad(set_to_none=True)
            head(encoder(inputs), target).backward()
            optimizer.step()

        for _ in range(args.warmup):
            step()
        times = []
        counter.counting = True
        for _ in range(args.steps):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        counter.counting = False
        state = sum(  # the table's optimizer state (not the encoder's)
            t.numel() * t.element_size()
            for t in optimizer.state[head.weight].values()
            if isinstance(t, torch.Tensor) and t.dim() > 0
        )
        result = {
            "rows": head.weight.shape[0],
            "table_bytes": head.weight.numel() * head.weight.element_size(),
            "state_bytes": state,
            "peak_bytes": memory.peak_rss_bytes() - base,
            "step_s": statistics.median(times),
            "bytes_per_step": counter.total // args.steps,
        }
        Path(out).write_text(json.dumps(result))
    finally:
        if world > 1:
            dist.destroy_process_group()


def measure(args: argparse.Namespace, n: int, world: int) -> list[dict]:
    """Every rank's result for ``N = n`` over ``world`` processes."""
    with tempfile.TemporaryDirectory() as tmp:
        run = argparse.Namespace(**{**vars(args), "n": n})
        outs = [f"{tmp}/rank{r}.json" for r in range(world)]
        if world == 1:
            run_rank(0, 1, "", run, outs[0])
        else:
            mp.spawn(_spawned, args=(world, f"{tmp}/init", run, outs), nprocs=world, join=True)
        return [json.loads(Path(out).read_text()) for out in outs]


def _spawned(rank: int, world: int, init_file: str, args: argparse.Namespace, outs: list) -> None:
    run_rank(rank, world, init_file, args, outs[rank])


def table_rows(args: argparse.Namespace) -> list[dict]:
    rows = []
    for config in args.optimizers:
        table_state, state_dtype, table_dtype = config.split(":")
        run = argparse.Namespace(
            **vars(args), table_state=table_state, state_dtype=state_dtype, table_dtype=table_dtype
        )
        rows += config_rows(run, config)
    return rows


def config_rows(args: argparse.Namespace, config: str) -> list[dict]:
    """The rows of one optimizer configuration, every ``N`` and world size."""
    rows = []
    for n in args.classes:
        for world in args.worlds:
            ranks = measure(args, n, world)
            expected = expected_bytes(args.positions, args.dim, world)
            rows.append(
                {
                    "optimizer": config,
                    "N": n,
                    "ranks": world,
                    "rows per rank": max(r["rows"] for r in ranks),
                    "table GiB per rank": max(r["table_bytes"] for r in ranks) / GIB,
                    "optimizer state GiB per rank": max(r["state_bytes"] for r in ranks) / GIB,
                    "peak GiB per rank": max(r["peak_bytes"] for r in ranks) / GIB,
                    "step ms": 1000 * ranks[0]["step_s"],
                    "bytes sent per step": ranks[0]["bytes_per_step"],
                    "formula": expected,
                }
            )
            print(rows[-1], flush=True)
    return rows


def targets(rows: list[dict], baseline: str) -> list[str]:
    """The issue's targets: bytes per step independent of ``N``; row-wise state at most 0.1x
    of the table; a bf16 table with row-wise state at most 0.6x the memory of the fp32 table
    with Adam's state (``baseline``), per rank at the largest ``N``."""
    lines = []
    for world in sorted({r["ranks"] for r in rows if r["ranks"] > 1}):
        sent = {r["N"]: r["bytes sent per step"] for r in rows if r["ranks"] == world}
        formula = {r["N"]: r["formula"] for r in rows if r["ranks"] == world}
        same = len({r["bytes sent per step"] for r in rows if r["ranks"] == world}) == 1
        same = same and sent == formula
        values = ", ".join(f"{v:,} at N = {n:,}" for n, v in sent.items())
        lines.append(
            f"- bytes sent per step independent of N ({world} ranks, every optimizer): {values}; "
            f"the formula gives {next(iter(formula.values())):,}: {'met' if same else 'NOT met'}"
        )
    largest = max(r["N"] for r in rows)
    at = {
        (r["optimizer"], r["ranks"]): r
        for r in rows
        if r["N"] == largest and r["ranks"] == max(x["ranks"] for x in rows)
    }
    for (config, _), row in sorted(at.items()):
        if config.startswith("row_wise"):
            ratio = row["optimizer state GiB per rank"] / row["table GiB per rank"]
            lines.append(
                f"- row-wise state <= 0.1x of the table ({config}, N = {largest:,}): "
                f"{ratio:.3f}x: {'met' if ratio <= 0.1 else 'NOT met'}"
            )
    base = next((row for (config, _), row in at.items() if config == baseline), None)
    for (config, _), row in sorted(at.items()):
        if base is not None and config.startswith("row_wise") and config.endswith(":bfloat16"):
            lean = row["table GiB per rank"] + row["optimizer state GiB per rank"]
            full = base["table GiB per rank"] + base["optimizer state GiB per rank"]
            lines.append(
                f"- a bf16 table with row-wise state <= 0.6x the memory of the fp32 table + "
                f"LazyAdam ({config} against {baseline}, N = {largest:,}): {lean / full:.3f}x "
                f"({lean:.3f} against {full:.3f} GiB per rank): "
                f"{'met' if lean <= 0.6 * full else 'NOT met'}"
            )
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = make_parser(__doc__)
    parser.add_argument("--classes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--worlds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--positions", type=int, default=2048, help="T, per rank")
    parser.add_argument("--negatives", type=int, default=100, help="M, per query in all")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--optimizers",
        nargs="+",
        default=list(OPTIMIZERS),
        help="TABLE_STATE:STATE_DTYPE:TABLE_DTYPE (LazyAdam's table_state and state_dtype, the "
        "table's dtype); the first is the baseline",
    )
    parser.add_argument("--name", default="sharded")
    add_background_argument(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with measured_load(args.background) as load:
        rows = table_rows(args)
    notes = "\n".join(
        [
            "## Targets",
            "",
            *targets(rows, args.optimizers[0]),
            "",
            f"Setup: SampledSoftmaxHead(N, D={args.dim}, UniformSampler, M={args.negatives} per "
            f"query, sparse_grad=True, sharded=True, in_batch_negatives=False) and LazyAdam in "
            f"each optimizer "
            f"configuration (table_state:state_dtype:table dtype); T = "
            f"{args.positions} scored positions per rank, a Linear encoder; median of "
            f"{args.steps} steps after {args.warmup}; one thread per process, gloo. Peak memory "
            f"is the resident set beyond the process' before the head was built: with a bf16 "
            f"table it includes the fp32 table the head is built with before the cast, so the "
            f"targets compare the tables' and states' own bytes. Each rank of a split table "
            f"scores the queries of every rank against its rows (the same multiply-adds as one "
            f"process over all rows), so a two-rank step is no faster here; step times are "
            f"those of two CPU processes sharing the machine with whatever ran beside them. "
            f"Run: `python "
            f"-m benchmarks.sharded --classes {' '.join(map(str, args.classes))} --positions "
            f"{args.positions} --optimizers {' '.join(args.optimizers)}`.",
        ]
    )
    path = write_results(
        args.name, rows, title="Class tables split across ranks", notes=notes, header=load.header
    )
    print(path.read_text())


if __name__ == "__main__":
    main()
