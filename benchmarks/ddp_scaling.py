"""Two-process DDP on CPU (gloo) against one process: training throughput, and whether two
processes evaluate the same weights to the same metrics.

One recipe (default: SASRec on MovieLens-1M with the MIDX-rq head, one epoch, seed 0) is trained
three times from the same seed, each run in its own Python process:

- one process, one thread;
- one process, two threads (the same cores as two processes);
- two processes (``strategy=ddp``, gloo), one thread each, each process taking the recipe's batch
  size, so that a step sees twice the positions and an epoch has half the steps.

``positions/s`` is the training positions (targets that are not padding) of all ranks over the
training wall time without validation (rank 0's, ``recipes.compare.EpochRecord``). After each
fit, the final weights are validated and tested, and saved.

Equality: the final weights of the two-process run are evaluated again by one process, and those
of the one-process run by two processes; the evaluation sets are split over the ranks without
padding (``lightning_sampled.metrics.evaluation_sampler``) and the metrics' states are sums, so
the two must agree to floating-point summation order. The tables give every metric both ways and
the largest relative difference.

Run: ``python -m benchmarks.ddp_scaling [--config recipes/configs/sasrec_ml-1m.yaml]
[--head midx_rq] [--epochs 1] [--seed 0] [--background TEXT] [--name ddp_scaling]``; results in
``benchmarks/results/<name>.{csv,md}``. The processes need both cores: run it alone.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import (
    add_background_argument,
    add_threads_argument,
    make_parser,
    measured_load,
    set_threads,
    write_results,
)

#: (processes, threads per process) of the three training runs, the first the baseline
TRAINING_RUNS = ((1, 1), (1, 2), (2, 1))


def recipe_args(
    config: str, head: str, epochs: int, seed: int, devices: int, root: str
) -> list[str]:
    """The recipe CLI arguments of one run on ``devices`` CPU processes (DDP when > 1)."""
    from recipes.compare import head_config

    return [
        "--config",
        config,
        "--config",
        str(head_config(head)),
        f"--seed_everything={seed}",
        f"--trainer.max_epochs={epochs}",
        f"--trainer.devices={devices}",
        f"--trainer.strategy={'ddp' if devices > 1 else 'auto'}",
        f"--trainer.default_root_dir={root}",
        "--trainer.logger=false",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
    ]


def worker(args: argparse.Namespace) -> None:
    """One run (every rank of a DDP run executes this): trains unless ``--evaluate`` names a
    checkpoint, then validates and tests; rank 0 writes ``--result`` as JSON."""
    from recipes.cli import main
    from recipes.compare import EpochRecord

    warnings.filterwarnings("ignore", "LightningCLI's args parameter")
    set_threads(args.threads)
    root = str(Path(args.result).parent / Path(args.result).stem)
    cli = main(
        recipe_args(args.config, args.head, args.epochs, args.seed, args.devices, root), run=False
    )
    trainer, model, data = cli.trainer, cli.model, cli.datamodule
    row: dict[str, Any] = {"processes": args.devices, "threads": args.threads}
    if args.evaluate is None:
        record = EpochRecord()
        trainer.callbacks.append(record)
        trainer.fit(model, data)
        strategy = trainer.strategy
        positions = strategy.reduce(torch.tensor(float(record.positions)), reduce_op="sum")
        seconds = strategy.reduce(torch.tensor(record.train_seconds), reduce_op="max")
        row.update(
            steps=trainer.global_step,
            positions=int(positions),
            train_s=float(seconds),
            positions_per_s=float(positions) / float(seconds),
        )
        trainer.save_checkpoint(args.checkpoint)
        ckpt_path = None
    else:
        ckpt_path = args.evaluate
    (validated,) = trainer.validate(model, data, ckpt_path=ckpt_path, verbose=False)
    (tested,) = trainer.test(model, data, ckpt_path=ckpt_path, verbose=False)
    row["metrics"] = {k: float(v) for k, v in sorted({**validated, **tested}.items())}
    if trainer.is_global_zero:
        Path(args.result).write_text(json.dumps(row))


def launch(args: argparse.Namespace, devices: int, threads: int, result: Path, **extra) -> dict:
    """Runs :func:`worker` in a fresh Python process (Lightning starts the other ranks) and
    returns its JSON row."""
    command = [
        sys.executable,
        "-m",
        "benchmarks.ddp_scaling",
        "--worker",
        f"--config={args.config}",
        f"--head={args.head}",
        f"--epochs={args.epochs}",
        f"--seed={args.seed}",
        f"--devices={devices}",
        f"--threads={threads}",
        f"--result={result}",
    ]
    command += [f"--{key}={value}" for key, value in extra.items()]
    start = time.perf_counter()
    subprocess.run(command, check=True)
    what = f"evaluate {extra['evaluate']}" if "evaluate" in extra else "train"
    print(
        f"[ddp_scaling] {devices} process(es) x {threads} thread(s), {what}: "
        f"{time.perf_counter() - start:.0f} s",
        flush=True,
    )
    return json.loads(result.read_text())


def equality_rows(reference: dict, other: dict, weights: str) -> list[dict]:
    """One row per metric of ``reference`` (evaluated by its own run) beside ``other`` (the same
    weights evaluated by the other number of processes)."""
    rows = []
    for name, value in reference["metrics"].items():
        again = other["metrics"][name]
        rows.append(
            {
                "weights": weights,
                "metric": name,
                f"{reference['processes']} process(es)": value,
                f"{other['processes']} process(es)": again,
                "relative difference": abs(again - value) / max(abs(value), 1e-30),
            }
        )
    return rows


def measure(args: argparse.Namespace, scratch: Path) -> tuple[list[dict], list[dict]]:
    """The three training runs and the two cross evaluations; returns (throughput rows,
    equality rows)."""
    trained = {}
    for devices, threads in TRAINING_RUNS:
        stem = scratch / f"train_{devices}x{threads}"
        trained[devices, threads] = launch(
            args, devices, threads, stem.with_suffix(".json"), checkpoint=stem.with_suffix(".ckpt")
        )
    base = trained[TRAINING_RUNS[0]]
    throughput = []
    for (devices, threads), row in trained.items():
        metrics = row["metrics"]
        throughput.append(
            {
                "processes": devices,
                "threads / process": threads,
                "steps": row["steps"],
                "positions": row["positions"],
                "train s": row["train_s"],
                "positions/s": row["positions_per_s"],
                "vs 1 process x 1 thread": row["positions_per_s"] / base["positions_per_s"],
                **{name: value for name, value in metrics.items() if name.startswith("test/")},
            }
        )
    ddp = trained[2, 1]
    by_one = launch(args, 1, 2, scratch / "eval_ddp_by_1.json", evaluate=scratch / "train_2x1.ckpt")
    by_two = launch(args, 2, 1, scratch / "eval_1_by_2.json", evaluate=scratch / "train_1x1.ckpt")
    equality = equality_rows(ddp, by_one, "trained by 2 processes")
    equality += equality_rows(base, by_two, "trained by 1 process")
    return throughput, equality


def notes(args: argparse.Namespace, throughput: list[dict], equality: list[dict]) -> str:
    two = next(r for r in throughput if r["processes"] == 2)
    same_cores = next(r for r in throughput if r["processes"] == 1 and r["threads / process"] == 2)
    worst = max(equality, key=lambda r: r["relative difference"])
    return f"""\
Two processes train at {two["vs 1 process x 1 thread"]:.2f}x the positions per second of one
process with one thread and {two["positions/s"] / same_cores["positions/s"]:.2f}x that of one
process with two threads (the same two cores). Each process takes the recipe's batch, so the
two-process run takes half the steps per epoch with twice the positions per step; its metrics after
the same epochs differ from the one-process run's for that reason, not from DDP.

Equality of the evaluation (the same weights, evaluated by one and by two processes, every metric
in [{args.name}_equality.md]({args.name}_equality.md)): the largest relative difference is
{worst["relative difference"]:.2g} ({worst["metric"]}, weights {worst["weights"]}).

Command: `python -m benchmarks.ddp_scaling --config {args.config} --head {args.head} --epochs
{args.epochs} --seed {args.seed}`; each run is a fresh Python process, one after the other."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = make_parser(__doc__)
    parser.add_argument("--config", default="recipes/configs/sasrec_ml-1m.yaml")
    parser.add_argument("--head", default="midx_rq", help="a name in recipes/configs/heads/")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default="ddp_scaling")
    add_background_argument(parser)
    # one run, started by the parent (and by Lightning for the second rank)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--devices", type=int, default=1, help=argparse.SUPPRESS)
    add_threads_argument(parser, 1, argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", help=argparse.SUPPRESS)
    parser.add_argument("--evaluate", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.epochs < 1:
        parser.error(f"--epochs must be >= 1, got {args.epochs}")
    if not Path(args.config).is_file():
        parser.error(f"no recipe config {args.config}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return
    with measured_load(args.background) as load, tempfile.TemporaryDirectory() as scratch:
        throughput, equality = measure(args, Path(scratch))
    header = load.header
    write_results(
        f"{args.name}_equality",
        equality,
        title="DDP on CPU: the same weights evaluated by one and by two processes",
        header=header,
    )
    md = write_results(
        args.name,
        throughput,
        title="Two-process DDP on CPU (gloo) against one process",
        notes=notes(args, throughput, equality),
        header=header,
    )
    print(md.read_text())


if __name__ == "__main__":
    main()
