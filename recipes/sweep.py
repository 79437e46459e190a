"""Sweeps in W&B sweep format, run by ``wandb agent`` or offline.

A sweep file (``recipes/sweeps/*.yaml``) has the parameters ``base`` (a model config in
``recipes/configs/``) and ``head`` (a head config in ``recipes/configs/heads/``), and sweeps any
LightningCLI option by its dotted key (``model.init_args.head.init_args.temperature``,
``model.init_args.weight_decay``, ``trainer.gradient_clip_val``, ``seed_everything``), each
trial's value passed to the CLI as ``--key=value``. Four short names stand for the options swept
most: ``num_negatives`` (``model.init_args.head.init_args.num_negatives``), ``codebook_size``
(``model.init_args.sampler.init_args.codebook_size``, MIDX samplers only), ``lr``
(``model.init_args.lr``) and ``max_epochs`` (``trainer.max_epochs``). ``trial`` runs one set of
them (what ``wandb agent`` calls, logging to W&B: W&B's ``${args}`` passes every parameter as
``--name=value``); ``run`` expands the file itself (``grid``: every combination; ``random``:
``--count`` draws from ``values``, ``int_uniform``, ``uniform`` or ``log_uniform_values``),
checks every trial against the CLI's parser before the first one fits (a key that is no option
of a trial's configs is refused, named, with the options it may have meant), fits each trial in
this process and writes ``trials.csv``, ``trials.md`` and ``trials.png`` with each trial's best
validation metric and run directory; ``run --dry-run`` checks and prints the trials' command
lines without fitting.

Offline, each trial runs in its own directory ``OUT/trial_<i>``: the configs' relative logger
folders (``logs``), the checkpoints and W&B's offline runs land there, never in the caller's
working directory. A short-named parameter that a trial's head does not take (``num_negatives``
of the full softmax, ``codebook_size`` of a non-MIDX sampler) is left out of it, and trials that
come out the same are run once; ``wandb agent`` gets W&B's own expansion, which counts them
separately. A dotted key is never left out: one that a trial's head does not take refuses the
sweep.

Run: ``python -m recipes.sweep run recipes/sweeps/sasrec_ml-100k.yaml [--out DIR] [--count N]
[--dry-run]``.
"""

from __future__ import annotations

import argparse
import difflib
import io
import itertools
import json
import math
import os
import random
import re
import shlex
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import lightning as L
import yaml

from .cli import main
from .tables import cell, markdown_table, write_csv

CONFIGS = Path(__file__).parent / "configs"
#: the named parameters: the two config files of a trial, then the short names of :data:`KEYS`
PARAMETERS = ("base", "head", "num_negatives", "codebook_size", "lr", "max_epochs")
#: the LightningCLI option each short-named parameter sets
KEYS = {
    "num_negatives": "model.init_args.head.init_args.num_negatives",
    "codebook_size": "model.init_args.sampler.init_args.codebook_size",
    "lr": "model.init_args.lr",
    "max_epochs": "trainer.max_epochs",
}
#: what a LightningCLI option looks like: dotted identifiers (``trainer.max_epochs``)
OPTION = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def check_names(names: Iterable[str]) -> None:
    """Refuses a parameter name that is neither in :data:`PARAMETERS` nor a dotted option, and
    a dotted key beside the short name that sets the same option.

    Raises:
        ValueError: naming the parameter.
    """
    names = list(names)
    malformed = [n for n in names if not (isinstance(n, str) and OPTION.fullmatch(n))]
    if malformed:
        raise ValueError(
            f"sweep parameters {malformed} are not LightningCLI options: use {list(PARAMETERS)}"
            " or dotted keys such as 'model.init_args.head.init_args.temperature'"
        )
    check_duplicates(names)


def check_duplicates(names: Iterable[str]) -> None:
    """Refuses a short name beside the dotted key of the option it sets.

    Raises:
        ValueError: naming both.
    """
    names = set(names)
    for short, key in KEYS.items():
        if short in names and key in names:
            raise ValueError(f"sweep parameters {short!r} and {key!r} set the same option")


def expand(sweep: dict[str, Any], count: int | None = None, seed: int = 0) -> list[dict]:
    """The trials of a sweep: every combination (``grid``) or ``count`` random draws.

    Raises:
        ValueError: an unknown method, a malformed parameter name (see :func:`check_names`;
            whether a dotted key is an option is :func:`check_trials`' to say), or a grid over a
            continuous distribution.
    """
    params = sweep["parameters"]
    check_names(params)
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
    distinct: dict[str, dict[str, Any]] = {}
    for params in trials:
        applied = applied_params(params)  # values may be lists or mappings: compared as JSON
        distinct.setdefault(json.dumps(applied, sort_keys=True, default=str), applied)
    return list(distinct.values())


def cli_value(value: Any) -> str:
    """A parameter value as the text of ``--key=TEXT``: a string as it is, anything else as JSON
    (``true``, ``null``, ``0.05``, ``[1, 2]``), which the CLI's YAML reading turns back."""
    return value if isinstance(value, str) else json.dumps(value)


def trial_args(params: dict[str, Any]) -> list[str]:
    """LightningCLI arguments of one trial: the model and head configs, then ``--key=value`` for
    each of the :func:`applied_params`: the short names' options (``num_negatives``,
    ``codebook_size``, ``lr``, ``max_epochs``: :data:`KEYS`) first, then the dotted keys in the
    sweep's order."""
    params = applied_params(params)
    args = [f"--config={CONFIGS / (params['base'] + '.yaml')}", f"--config={head_file(params)}"]
    names = [*(n for n in KEYS if n in params), *(n for n in params if n not in PARAMETERS)]
    return args + [f"--{KEYS.get(name, name)}={cli_value(params[name])}" for name in names]


def resolved_config(args: list[str]) -> dict[str, Any]:
    """The config LightningCLI resolves from ``args`` (its ``--print_config``): parsed and
    checked, nothing instantiated, no data read.

    Raises:
        ValueError: the parser's error, without the usage lines before it.
    """
    out, err = io.StringIO(), io.StringIO()
    try:
        with redirect_stdout(out), redirect_stderr(err):
            main([*args, "--print_config"], run=False)
    except SystemExit as exit_info:
        if exit_info.code not in (None, 0):
            message = err.getvalue()
            raise ValueError(message[message.find("error:") :].strip() or message) from None
        return yaml.safe_load(out.getvalue())
    raise RuntimeError("LightningCLI went on after --print_config")  # pragma: no cover


def option_keys(config: dict[str, Any], prefix: str = "") -> Iterator[str]:
    """Every dotted key of a resolved config, nested mappings included."""
    for name, value in config.items():
        yield prefix + name
        if isinstance(value, dict):
            yield from option_keys(value, f"{prefix}{name}.")


def close_options(name: str, options: Iterable[str]) -> list[str]:
    """Up to three options ``name`` may have meant, by their last part: the same name elsewhere
    (``dropout``: ``model.init_args.dropout``), else one spelled nearly like it
    (``...init_args.temperatur``: ``...init_args.temperature``), beside ``name`` first."""
    parent, _, last = name.rpartition(".")
    by_last: dict[str, list[str]] = {}
    for key in sorted(options):
        by_last.setdefault(key.rpartition(".")[2], []).append(key)
    names = by_last.get(last) or [
        key
        for near in difflib.get_close_matches(last, list(by_last), n=3, cutoff=0.8)
        for key in by_last[near]
    ]
    return sorted(names, key=lambda key: key.rpartition(".")[0] != parent)[:3]


def refusal(params: dict[str, Any], extra: list[str], err: ValueError) -> str:
    """Why the CLI refused a trial, naming the parameter to blame where one is: a dotted key that
    is no option of the trial's configs (with the options it may have meant), or a parameter
    whose value the parser refuses."""
    files = {name: params[name] for name in ("base", "head")}
    where = f"base {files['base']!r} with head {files['head']!r}"
    try:
        options = set(option_keys(resolved_config([*trial_args(files), *extra])))
    except ValueError as base_err:
        return f"the configs of {where} with the extra arguments {extra} are refused: {base_err}"
    for name in params:
        if name not in PARAMETERS and name not in options:
            meant = close_options(name, options)
            hint = f"; did you mean {' or '.join(map(repr, meant))}?" if meant else ""
            return f"unknown sweep parameter {name!r}: no option of {where}{hint}"
    for name, value in params.items():
        if name not in files:
            try:
                resolved_config([*trial_args({**files, name: value}), *extra])
            except ValueError as one_err:
                return f"sweep parameter {name!r} = {value!r} is refused ({where}): {one_err}"
    return f"the trial {params} is refused: {err}"


def check_files(params: dict[str, Any]) -> None:
    """Refuses a trial without ``base`` or ``head``, or whose config file is missing.

    Raises:
        ValueError: naming the parameter.
    """
    missing = [name for name in ("base", "head") if name not in params]
    if missing:
        raise ValueError(f"every trial needs the parameters 'base' and 'head'; {missing} unset")
    for name, path in (("base", CONFIGS / f"{params['base']}.yaml"), ("head", head_file(params))):
        if not path.is_file():
            raise ValueError(f"sweep parameter {name!r} = {params[name]!r}: no file {path}")


def check_trials(trials: list[dict[str, Any]], extra: list[str] | None = None) -> list[dict]:
    """Parses every trial's LightningCLI arguments (``--print_config``, nothing fitted) before
    any of them runs; returns the configs they resolve to, in order.

    Raises:
        ValueError: a trial :func:`check_files` refuses, or one that the CLI refuses, naming the
            parameter to blame (see :func:`refusal`).
    """
    extra = list(extra or [])
    configs = []
    for params in trials:
        check_files(params)
        try:
            configs.append(resolved_config([*trial_args(params), *extra]))
        except ValueError as err:
            raise ValueError(refusal(params, extra, err)) from None
    return configs


def plan(
    path: Path, count: int | None = None, extra: list[str] | None = None
) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """A sweep file, its distinct trials (:func:`unique_trials`) and the configs they resolve
    to (:func:`check_trials`), without fitting any."""
    with open(path) as f:
        sweep = yaml.safe_load(f)
    trials = expand(sweep, count)
    for params in trials:
        check_files(params)
    trials = unique_trials(trials)
    return sweep, trials, check_trials(trials, extra)


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
    """Runs every distinct trial of the sweep file offline (:func:`run_trials`), once all of them
    are checked (:func:`plan`)."""
    sweep, trials, _ = plan(path, count, extra)
    return run_trials(sweep, trials, out, extra)


def run_trials(
    sweep: dict[str, Any], trials: list[dict[str, Any]], out: Path, extra: list[str] | None = None
) -> list[dict]:
    """Fits the trials of ``sweep``, each in ``out/trial_<i>``, and writes the summary table and
    plot under ``out``; a row holds the trial's applied parameters, its best ``metric`` and
    ``run_dir`` (where its logs are)."""
    metric = sweep["metric"]["name"]
    out = out.resolve()
    rows = []
    for i, params in enumerate(trials):
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
        " ".join(
            [f"{r['head']} M={r.get('num_negatives', '-')} lr={cell(r.get('lr', '-'))}"]
            + [f"{k.rsplit('.', 1)[-1]}={cell(v)}" for k, v in r.items() if "." in k]
        )
        for r in rows
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
    run.add_argument(
        "--dry-run", action="store_true", help="check and print the trials' commands, fit none"
    )
    args, extra = parser.parse_known_args()
    warnings.filterwarnings("ignore", "LightningCLI's args parameter")  # this script's own argv
    if args.command == "trial":
        params = {k: getattr(args, k) for k in PARAMETERS if getattr(args, k) is not None}
        # W&B's ${args} passes a dotted key as --key=value: it reaches the CLI among the extra
        try:
            check_duplicates([*params, *(a[2:].split("=", 1)[0] for a in extra)])
        except ValueError as err:
            raise SystemExit(f"error: {err}") from None
        for name in ("num_negatives", "codebook_size", "max_epochs"):
            if name in params:
                params[name] = int(params[name])
        wandb = f"--config={CONFIGS / 'loggers' / 'wandb.yaml'}"
        fit_trial(params, [wandb, *extra])
        return
    try:  # a sweep the CLI refuses: one line naming the parameter, before anything fits
        sweep, trials, _ = plan(args.sweep, args.count, extra)
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    if args.dry_run:
        for i, params in enumerate(trials):
            command = ["python", "-m", "recipes", "fit", *trial_args(params), *extra]
            print(f"trial_{i}:", shlex.join(command))
        return
    out = args.out or Path("sweep_results") / args.sweep.stem
    for row in run_trials(sweep, trials, out, extra):
        print(row)
    print(f"summary: {out / 'trials.md'}")


if __name__ == "__main__":
    cli()
