"""Train one recipe with several heads side by side and tabulate their exact metrics.

Each head config of ``recipes/configs/heads/`` is combined with the same model config and seed; the
run trains for ``--epochs`` epochs (early stopping may end it sooner), restores the best validation
checkpoint, evaluates it on the test split, and records the best validation score, the test
metrics and the wall time per epoch (training plus validation).

With a budget instead, ``--max-steps`` (optimizer steps) or ``--max-time`` (minutes, Lightning's
``Trainer(max_time=...)``, which counts validation too), training may end mid-epoch; the final
weights are then validated and tested (no checkpoint is restored). ``--val-every`` validates every
that many steps (across epoch boundaries). Early stopping still acts on the validations that ran,
but a budget that ends before the first one is not an error (``EarlyStopping(strict=False)``).

Every row also records the training positions (targets that are not ``ignore_index`` or
padding: tokens for a language model), the training wall time without validation, positions per
second, the seconds spent refreshing indexes (``IndexRefresh``) and the process' peak resident
memory during that head's run. The table is printed and, with ``--out``, written as Markdown, CSV
and JSON (the JSON also holds every validation run's metrics), with a plot of the validation
metric over epochs (over training positions with a budget), one curve per head.

Run: ``python -m recipes.compare --config recipes/configs/sasrec_ml-1m.yaml --heads full uniform
midx_rq --epochs 10 --out results/sasrec_ml-1m``, or with a budget: ``python -m recipes.compare
--config recipes/configs/lstm_gcide.yaml --heads full sparse_midx_rq --max-time 10 --out
recipes/results/gcide_time``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

from .cli import main
from .memory import peak_rss_bytes, reset_peak_rss
from .tables import markdown_table, write_csv

CONFIGS = Path(__file__).parent / "configs"
#: prefix of the training-epoch metrics that ``EpochRecord`` keeps (``SamplerDiagnostics``')
DIAGNOSTICS = "sampler_diagnostics/"
#: per-epoch lists in a row, kept in the JSON and left out of the Markdown and CSV tables
PER_EPOCH = ("validation", "training")


class EpochRecord(L.Callback):
    """Records each training epoch's wall time (its validation included), the validation metrics
    at the end of each validation run (sanity checks skipped), each training epoch's
    ``sampler_diagnostics/*`` metrics (e.g. CANE's candidate coverage, logged by
    ``SamplerDiagnostics``), the training positions, the training wall time without validation,
    and the seconds spent in ``IndexRefresh``."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.validation: list[dict[str, float]] = []
        self.training: list[dict[str, float]] = []
        self.positions = 0
        self.train_seconds = 0.0
        self.validation_seconds = 0.0
        self.refresh_seconds = 0.0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for callback in trainer.callbacks:  # time every index refresh
            refresh = getattr(callback, "refresh", None)
            if callable(refresh) and hasattr(callback, "num_refreshes"):
                callback.refresh = self._timed(refresh)
        self._fit_start = time.perf_counter()
        self.validation_seconds = 0.0

    def _timed(self, refresh: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            result = refresh(*args, **kwargs)
            self.refresh_seconds += time.perf_counter() - start
            return result

        return timed

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        elapsed = time.perf_counter() - self._fit_start
        self.train_seconds = elapsed - self.validation_seconds

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, i: int
    ) -> None:
        target = batch["target"] if isinstance(batch, dict) and "target" in batch else None
        if target is not None:
            keep = target != getattr(getattr(pl_module, "head", None), "ignore_index", -100)
            padding = getattr(pl_module, "padding_idx", None)
            if padding is not None:
                keep &= target != padding
            self.positions += int(keep.sum())

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._validation_start = time.perf_counter()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.training or trainer.state.fn == "fit":
            self.validation_seconds += time.perf_counter() - self._validation_start
        if not trainer.sanity_checking:
            metrics = trainer.callback_metrics
            row = {k: float(v) for k, v in sorted(metrics.items()) if k.startswith("val/")}
            where = {"epoch": trainer.current_epoch, "step": trainer.global_step}
            self.validation.append({**where, "positions": self.positions, **row})

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.seconds.append(time.perf_counter() - self._start)
        metrics = trainer.callback_metrics
        row = {k: float(v) for k, v in sorted(metrics.items()) if k.startswith(DIAGNOSTICS)}
        if row:
            self.training.append({"epoch": trainer.current_epoch, **row})


def head_config(head: str) -> Path:
    """The config file of a head given by name (``midx_rq``) or path; a clear error if missing."""
    path = Path(head) if head.endswith(".yaml") else CONFIGS / "heads" / f"{head}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in (CONFIGS / "heads").glob("*.yaml"))
        raise FileNotFoundError(f"no head config {path}; known heads: {', '.join(known)}")
    return path


def max_time_arg(minutes: float) -> str:
    """``--max-time`` minutes as Lightning's ``"DD:HH:MM:SS"`` (whole seconds, at least 1)."""
    seconds = max(1, round(minutes * 60))
    days, rest = divmod(seconds, 86400)
    return f"{days:02d}:{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"


def run(
    config: Path,
    head: str,
    epochs: int | None,
    seed: int,
    root: str,
    extra: Sequence[str] = (),
    *,
    max_steps: int | None = None,
    max_time: float | None = None,
    val_every: int | None = None,
) -> dict[str, Any]:
    """Fits ``config`` with one head and tests it; returns the row of the table.

    Without a budget (``max_steps``, ``max_time`` in minutes) the best validation checkpoint is
    tested; with one, the final weights are validated and tested. ``epochs=None`` means 10
    epochs without a budget, no epoch limit with one.

    The row has ``head``, ``epochs`` (started), ``steps``, ``seconds/epoch``, ``train
    positions``, ``train s`` (training wall time without validation), ``positions/s``,
    ``refresh s`` (index refreshes, part of ``train s``), ``peak RSS MB``, then ``best
    <monitor>`` (checkpoint) or the final validation metrics, the test metrics under their logged
    names (``test/ndcg@10``, ``test/ppl``, ...), ``validation``, the list of every validation
    run's metrics, and ``training``, each training epoch's ``sampler_diagnostics/*`` metrics
    (both lists left out of the Markdown and CSV tables).
    """
    budget = max_steps is not None or max_time is not None
    args = [
        "--config",
        str(config),
        "--config",
        str(head_config(head)),
        f"--seed_everything={seed}",
        f"--trainer.max_epochs={epochs if epochs is not None else -1 if budget else 10}",
        f"--trainer.default_root_dir={root}",
        "--trainer.logger=false",
        "--trainer.enable_model_summary=false",
    ]
    if max_steps is not None:
        args.append(f"--trainer.max_steps={max_steps}")
    if max_time is not None:
        args.append(f"--trainer.max_time={max_time_arg(max_time)}")
    if val_every is not None:
        args += [
            f"--trainer.val_check_interval={val_every}",
            "--trainer.check_val_every_n_epoch=null",
        ]
    cli = main([*args, *extra], run=False)
    if budget:  # a budget may end training before any validation: nothing to stop on yet
        for callback in cli.trainer.callbacks:
            if isinstance(callback, EarlyStopping):
                callback.strict = False
    record = EpochRecord()
    cli.trainer.callbacks.append(record)
    reset_peak_rss()
    cli.trainer.fit(cli.model, cli.datamodule)
    row: dict[str, Any] = {
        "head": Path(head).stem,
        "epochs": len(record.seconds),
        "steps": cli.trainer.global_step,
        "seconds/epoch": sum(record.seconds) / max(1, len(record.seconds)),
        "train positions": record.positions,
        "train s": record.train_seconds,
        "positions/s": record.positions / max(record.train_seconds, 1e-9),
        "refresh s": record.refresh_seconds,
    }
    if budget:  # training may have stopped mid-epoch: evaluate the final weights
        last = record.validation[-1] if record.validation else {}
        if last.get("step") == cli.trainer.global_step:  # Lightning validated when it stopped
            validated = {k: v for k, v in last.items() if k not in ("epoch", "step", "positions")}
        else:
            (validated,) = cli.trainer.validate(cli.model, cli.datamodule, verbose=False)
        (tested,) = cli.trainer.test(cli.model, cli.datamodule, verbose=False)
    else:
        (tested,) = cli.trainer.test(cli.model, cli.datamodule, ckpt_path="best", verbose=False)
    row["peak RSS MB"] = peak_rss_bytes() / 2**20
    if budget:
        row.update({name: float(value) for name, value in sorted(validated.items())})
    else:
        checkpoint = cli.trainer.checkpoint_callback
        if isinstance(checkpoint, ModelCheckpoint) and checkpoint.best_model_score is not None:
            row[f"best {checkpoint.monitor}"] = float(checkpoint.best_model_score)
    row.update({name: float(value) for name, value in sorted(tested.items())})
    row["validation"] = record.validation
    row["training"] = record.training
    return row


ROUNDED = {"seconds/epoch": 1, "train s": 1, "positions/s": 0, "refresh s": 1, "peak RSS MB": 0}


def table_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows without their ``validation`` lists, times and rates rounded, for the tables."""
    return [{k: _rounded(k, v) for k, v in r.items() if k not in PER_EPOCH} for r in rows]


def _rounded(key: str, value: Any) -> Any:
    if key not in ROUNDED:
        return value
    return round(value, ROUNDED[key]) if ROUNDED[key] else round(value)


def plot_curves(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    """Each head's validation metric (the checkpoint's monitor, else the first) over epochs, or
    over training positions when a row has validation runs within an epoch, saved to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    monitors = [k.removeprefix("best ") for r in rows for k in r if k.startswith("best ")]
    runs = [v for r in rows for v in r["validation"]]
    names = sorted({k for v in runs for k in v} - {"epoch", "step", "positions"})
    metric = monitors[0] if monitors else names[0] if names else "validation"
    by_epoch = all(r["epochs"] == len(r["validation"]) for r in rows)
    fig, ax = plt.subplots(figsize=(6, 4))
    for row in rows:
        x = [v["epoch"] + 1 if by_epoch else v["positions"] for v in row["validation"]]
        y = [v.get(metric, float("nan")) for v in row["validation"]]
        ax.plot(x, y, marker="o", label=row["head"])
    ax.set_xlabel("epoch" if by_epoch else "training positions")
    if by_epoch:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(f"{metric} (exact)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write(rows: list[dict[str, Any]], out: Path, header: str) -> None:
    """Writes ``out.md`` (``header`` then the table), ``out.csv``, ``out.json`` (the rows with
    their validation runs' metrics) and ``out.png`` (:func:`plot_curves`)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(f"{header}\n\n{markdown_table(table_rows(rows))}")
    write_csv(table_rows(rows), out.with_suffix(".csv"))
    out.with_suffix(".json").write_text(json.dumps(rows, indent=2) + "\n")
    plot_curves(rows, out.with_suffix(".png"), out.stem)


def budget_text(
    epochs: int | None, max_steps: int | None, max_time: float | None, val_every: int | None
) -> str:
    """The budget in words, for the table's header."""
    parts = [f"{max_steps} steps"] if max_steps is not None else []
    parts += [f"{max_time:g} min"] if max_time is not None else []
    if not parts:
        return f"up to {epochs or 10} epochs, best checkpoint"
    if epochs is not None:
        parts.append(f"{epochs} epochs")
    validate = f", validation every {val_every} steps" if val_every else ""
    first = " (whichever ends first)" if len(parts) > 1 else ""
    return f"budget {' or '.join(parts)}{first}{validate}, final weights"


def compare(
    config: Path,
    heads: list[str],
    epochs: int | None,
    seed: int,
    extra: Sequence[str] = (),
    out: Path | None = None,
    *,
    max_steps: int | None = None,
    max_time: float | None = None,
    val_every: int | None = None,
) -> list[dict[str, Any]]:
    """Runs every head in turn in a temporary root; prints the table and writes it to ``out``.

    ``epochs``, ``max_steps``, ``max_time`` (minutes) and ``val_every`` as in :func:`run`.
    """
    for head in heads:  # fail before training anything if one name is wrong
        head_config(head)
    warnings.filterwarnings("ignore", "LightningCLI's args parameter")  # this script's own argv
    budget = dict(max_steps=max_steps, max_time=max_time, val_every=val_every)
    header = f"`{config.name}`, seed {seed}, {budget_text(epochs, **budget)}, exact metrics"
    rows = []
    with tempfile.TemporaryDirectory() as root:
        for head in heads:
            path = str(Path(root) / Path(head).stem)
            rows.append(run(config, head, epochs, seed, path, extra, **budget))
            if out is not None:  # after every head, so a long comparison leaves partial results
                write(rows, out, header)
    print(f"\n{header}")
    print(markdown_table(table_rows(rows)))
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True, help="model config YAML")
    parser.add_argument("--heads", nargs="+", required=True, help="names in configs/heads/")
    parser.add_argument(
        "--epochs", type=int, help="at most this many epochs (default 10 without a budget)"
    )
    parser.add_argument("--max-steps", type=int, help="budget: optimizer steps per head")
    parser.add_argument(
        "--max-time", type=float, help="budget: minutes per head (validation included)"
    )
    parser.add_argument("--val-every", type=int, help="validate every this many steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--out", type=Path, help="write OUT.md, OUT.csv, OUT.json and OUT.png")
    parser.add_argument(
        "extra",
        nargs="*",
        help="further CLI overrides after --, e.g. -- --data.init_args.split=ratio",
    )
    return parser.parse_args(argv)


def cli_main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    for name in ("epochs", "max_steps", "val_every"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise SystemExit(f"error: --{name.replace('_', '-')} must be >= 1, got {value}")
    if args.max_time is not None and not args.max_time > 0:
        raise SystemExit(f"error: --max-time must be > 0 minutes, got {args.max_time}")
    if not args.config.is_file():
        raise SystemExit(f"error: no model config {args.config}")
    torch.set_num_threads(args.threads)
    budget = dict(max_steps=args.max_steps, max_time=args.max_time, val_every=args.val_every)
    try:
        compare(args.config, args.heads, args.epochs, args.seed, args.extra, args.out, **budget)
    except FileNotFoundError as err:
        raise SystemExit(f"error: {err}") from None


if __name__ == "__main__":
    cli_main()
