"""Sweeps in W&B sweep format, run by ``wandb agent`` or offline.

A sweep file (``recipes/sweeps/*.yaml``) has the parameters ``base`` (a model config in
``recipes/configs/``), ``head`` (a head config in ``recipes/configs/heads/``), ``num_negatives``,
``codebook_size`` (MIDX samplers only), ``lr`` and ``max_epochs``. ``trial`` runs one set of them
(what ``wandb agent`` calls, logging to W&B); ``run`` expands the file itself (``grid``: every
combination; ``random``: ``--count`` draws from ``values``, ``int_uniform``, ``uniform`` or
``log_uniform_values``), fits each trial in this process and writes ``trials.csv``,
``trials.md`` and ``trials.png`` with each trial's best validation metric and run directory.

Offline, each trial runs in its own directory ``OUT/trial_<i>``: the configs' relative logger
folders (``logs``), the checkpoints and W&B's offline runs land there, never in the caller's
working directory. A parameter that a trial's head does not take (``num_negatives`` of the full
softmax, ``codebook_size`` of a non-MIDX sampler) is left out of it, and trials that come out
the same are run once; ``wandb agent`` gets W&B's own expansion, which counts them separately.

Run: ``python -m recipes.sweep run recipes/sweeps/sasrec_ml-100k.yaml [--out DIR] [--count N]``.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import random
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning as L
import yaml

from .cli import main
from .tables import cell, markdown_table, write_csv

CONFIGS = Path(__file__).parent / "configs"
PARAMETERS = ("base", "head", "num_negatives", "codebook_size", "lr", "max_epochs")


def expand(sweep: dict[str, Any], count: int | None = None, seed: int = 0) -> list[dict]:
    """The trials of a sweep: every combination (``grid``) or ``count`` random draws.

    Raises:
        ValueError: an unknown method or parameter, or a grid over a continuous distribution.
    """
    params = sweep["parameters"]
    unknown = set(params) - set(PARAMETERS)
    if unknown:
        raise ValueError(f"unknown sweep parameters {sorted(unknown)}; use {list(PARAMETERS)}")
    method = sweep.get("method")
    if method == "grid":
        choices = {}
        for name, spec in params.items():
            if "value" not in spec and "values" not in spec:
                raise ValueError(f"grid sweeps need value or values for {name!r}, got {spec}")
            choices[name] = spec["values"] if "values" in spec else [spec["value"]]
        return [
            dict(zip(choices, combo, strict=True)) for combo in itertools.product(*choices.values())
        ]
    if method == "random":
        if count is None or count < 1:
            raise ValueError(f"random sweeps need count >= 1, got {count}")
        rng = random.Random(seed)
        return [{name: draw(spec, rng) for name, spec in params.items()} for _ in range(count)]
    raise ValueError(f"method must be 'grid' or 'random', got {method!r}")


def draw(spec: dict[str, Any], rng: random.Random) -> Any:
    """One draw of a W&B parameter spec."""
    if "value" in spec:
        return spec["value"]
    if "values" in spec:
        return rng.choice(spec["values"])
    kind, low, high = spec.get("distribution", "uniform"), spec["min"], spec["max"]
    if kind == "int_uniform":
        return rng.randint(low, high)
    if kind == "uniform":
        return rng.uniform(low, high)
    if kind == "log_uniform_values":
        return math.exp(rng.uniform(math.log(low), math.log(high)))
    raise ValueError(f"unsupported distribution {kind!r}")


def head_file(params: dict[str, Any]) -> Path:
    """The head config of a trial."""
    return CONFIGS / "heads" / f"{params['head']}.yaml"


def applied_params(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` without those the trial's head config does not take: ``num_negatives`` unless
    the head's config sets it, ``codebook_size`` unless its sampler is a ``MIDXSampler``."""
    with open(head_file(params)) as f:
        model = yaml.safe_load(f)["model"]["init_args"]
    head, sampler = model["head"], model.get("sampler")
    ignored = set()
    if "num_negatives" not in head.get("init_args", {}):
        ignored.add("num_negatives")
    if not (sampler and sampler["class_path"].endswith("MIDXSampler")):
        ignored.add("codebook_size")
    return {name: value for name, value in params.items() if name not in ignored}


def unique_trials(trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The :func:`applied_params` of each trial, each distinct set once, in first-seen order
    (a grid over ``head`` x ``num_negatives`` holds the full softmax once, not once per
    ``num_negatives``)."""
    distinct: dict[frozenset, dict[str, Any]] = {}
    for params in trials:
        applied = applied_params(params)
        distinct.setdefault(frozenset(applied.items()), applied)
    return list(distinct.values())


def trial_args(params: dict[str, Any]) -> list[str]:
    """LightningCLI arguments of one trial: the model and head configs, then overrides of the
    :func:`applied_params` (``num_negatives``, ``codebook_size``, ``lr``, ``max_epochs``)."""
    params = applied_params(params)
    args = [f"--config={CONFIGS / (params['base'] + '.yaml')}", f"--config={head_file(params)}"]
    if "num_negatives" in params:
        args.append(f"--model.init_args.head.init_args.num_negatives={params['num_negatives']}")
    if "codebook_size" in params:
        args.append(f"--model.init_args.sampler.init_args.codebook_size={params['codebook_size']}")
    if "lr" in params:
        args.append(f"--model.init_args.lr={params['lr']}")
    if "max_epochs" in params:
        args.append(f"--trainer.max_epochs={params['max_epochs']}")
    return args


@contextmanager
def working_directory(path: Path) -> Iterator[None]:
    """Runs the block with ``path`` (created if missing) as the working directory."""
    path.mkdir(parents=True, exist_ok=True)
    previous = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(previous)


def fit_trial(params: dict[str, Any], extra: list[str], run_in: Path | None = None) -> L.Trainer:
    """Fits one trial in this process (``extra``: more LightningCLI arguments).

    Args:
        params: the trial's sweep parameters.
        extra: more LightningCLI arguments, parsed in the caller's working directory.
        run_in: the directory the fit runs in (its relative log, checkpoint and W&B folders
            land there), also the trainer's ``default_root_dir``; ``None``: the caller's.
    """
    root = [] if run_in is None else [f"--trainer.default_root_dir={run_in}"]
    cli = main([*trial_args(params), *root, *extra], run=False)
    with working_directory(run_in or Path.cwd()):
        cli.trainer.fit(cli.model, cli.datamodule)
    return cli.trainer


def run_dir(trainer: L.Trainer, run_in: Path) -> Path:
    """The absolute directory of a trial's run: its first logger's (relative to ``run_in``, where
    the trial ran), or ``run_in`` when the logger has none."""
    log_dir = trainer.log_dir
    return run_in if log_dir is None else (run_in / log_dir).resolve()


def best_score(trainer: L.Trainer, metric: str) -> float:
    """The checkpoint callback's best ``metric``, or its last value when there is none."""
    best = getattr(trainer.checkpoint_callback, "best_model_score", None)
    return float(best if best is not None else trainer.callback_metrics[metric])


def run_sweep(
    path: Path, out: Path, count: int | None = None, extra: list[str] | None = None
) -> list[dict]:
    """Runs every distinct trial of the sweep file offline, each in ``out/trial_<i>``, and writes
    the summary table and plot under ``out``; a row holds the trial's applied parameters, its
    best ``metric`` and ``run_dir`` (where its logs are)."""
    with open(path) as f:
        sweep = yaml.safe_load(f)
    metric = sweep["metric"]["name"]
    out = out.resolve()
    rows = []
    for i, params in enumerate(unique_trials(expand(sweep, count))):
        run_in = out / f"trial_{i}"
        trainer = fit_trial(params, extra or [], run_in)
        row = {"trial": i, **params, metric: best_score(trainer, metric)}
        rows.append({**row, "run_dir": str(run_dir(trainer, run_in))})
    write_summary(rows, metric, sweep["metric"].get("goal", "maximize"), out)
    return rows


def write_summary(rows: list[dict], metric: str, goal: str, out: Path) -> None:
    """``trials.csv``, ``trials.md`` (best first) and ``trials.png`` under ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    rows = sorted(rows, key=lambda r: r[metric], reverse=goal == "maximize")
    write_csv(rows, out / "trials.csv")
    (out / "trials.md").write_text(markdown_table(rows))
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(rows) + 1.5))
    labels = [
        f"{r['head']} M={r.get('num_negatives', '-')} lr={cell(r.get('lr', '-'))}" for r in rows
    ]
    ax.barh(labels[::-1], [r[metric] for r in rows][::-1])
    ax.set_xlabel(metric)
    fig.tight_layout()
    fig.savefig(out / "trials.png", dpi=100)
    plt.close(fig)


def cli() -> None:
    parser = argparse.ArgumentParser(description="W&B-format sweeps, with wandb or offline")
    sub = parser.add_subparsers(dest="command", required=True)
    trial = sub.add_parser("trial", help="one trial (what wandb agent calls)")
    for name in PARAMETERS:
        trial.add_argument(f"--{name}", type=float if name == "lr" else str)
    run = sub.add_parser("run", help="every trial of a sweep file, offline")
    run.add_argument("sweep", type=Path)
    run.add_argument("--out", type=Path)
    run.add_argument("--count", type=int, help="trials of a random sweep")
    args, extra = parser.parse_known_args()
    warnings.filterwarnings("ignore", "LightningCLI's args parameter")  # this script's own argv
    if args.command == "trial":
        params = {k: getattr(args, k) for k in PARAMETERS if getattr(args, k) is not None}
        for name in ("num_negatives", "codebook_size", "max_epochs"):
            if name in params:
                params[name] = int(params[name])
        wandb = f"--config={CONFIGS / 'loggers' / 'wandb.yaml'}"
        fit_trial(params, [wandb, *extra])
    else:
        out = args.out or Path("sweep_results") / args.sweep.stem
        for row in run_sweep(args.sweep, out, args.count, extra):
            print(row)
        print(f"summary: {out / 'trials.md'}")


if __name__ == "__main__":
    cli()
