"""Train one recipe with several heads side by side and tabulate their exact metrics.

Each head config of ``recipes/configs/heads/`` is combined with the same model config and seed; the
run trains for ``--epochs`` epochs (early stopping may end it sooner), restores the best validation
checkpoint, evaluates it on the test split, and records the best validation score, the test
metrics and the wall time per epoch (training plus validation). The table is printed and, with
``--out``, written as Markdown, CSV and JSON (the JSON also holds every epoch's validation
metrics), with a plot of the validation metric over epochs, one curve per head.

Run: ``python -m recipes.compare --config recipes/configs/sasrec_ml-1m.yaml --heads full uniform
midx_rq --epochs 10 --out results/sasrec_ml-1m``.
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
from lightning.pytorch.callbacks import ModelCheckpoint

from .cli import main
from .tables import markdown_table, write_csv

CONFIGS = Path(__file__).parent / "configs"


class EpochRecord(L.Callback):
    """Records each training epoch's wall time (its validation included) and the validation
    metrics at the end of each validation run (sanity checks skipped)."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.validation: list[dict[str, float]] = []

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = time.perf_counter()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            metrics = trainer.callback_metrics
            row = {k: float(v) for k, v in sorted(metrics.items()) if k.startswith("val/")}
            self.validation.append({"epoch": trainer.current_epoch, **row})

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.seconds.append(time.perf_counter() - self._start)


def head_config(head: str) -> Path:
    """The config file of a head given by name (``midx_rq``) or path; a clear error if missing."""
    path = Path(head) if head.endswith(".yaml") else CONFIGS / "heads" / f"{head}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in (CONFIGS / "heads").glob("*.yaml"))
        raise FileNotFoundError(f"no head config {path}; known heads: {', '.join(known)}")
    return path


def run(
    config: Path, head: str, epochs: int, seed: int, root: str, extra: Sequence[str] = ()
) -> dict[str, Any]:
    """Fits ``config`` with one head, tests its best checkpoint, returns the row of the table.

    The row has ``head``, ``epochs`` (run), ``seconds/epoch``, ``best val <monitor>``, the test
    metrics under their logged names (``test/ndcg@10``, ``test/ppl``, ...) and ``validation``,
    the list of each epoch's validation metrics (left out of the Markdown and CSV tables).
    """
    cli = main(
        [
            "--config",
            str(config),
            "--config",
            str(head_config(head)),
            f"--seed_everything={seed}",
            f"--trainer.max_epochs={epochs}",
            f"--trainer.default_root_dir={root}",
            "--trainer.logger=false",
            "--trainer.enable_model_summary=false",
            *extra,
        ],
        run=False,
    )
    record = EpochRecord()
    cli.trainer.callbacks.append(record)
    cli.trainer.fit(cli.model, cli.datamodule)
    (tested,) = cli.trainer.test(cli.model, cli.datamodule, ckpt_path="best", verbose=False)
    row: dict[str, Any] = {
        "head": Path(head).stem,
        "epochs": len(record.seconds),
        "seconds/epoch": sum(record.seconds) / len(record.seconds),
    }
    checkpoint = cli.trainer.checkpoint_callback
    if isinstance(checkpoint, ModelCheckpoint) and checkpoint.best_model_score is not None:
        row[f"best {checkpoint.monitor}"] = float(checkpoint.best_model_score)
    row.update({name: float(value) for name, value in sorted(tested.items())})
    row["validation"] = record.validation
    return row


def table_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows without their per-epoch ``validation`` lists, seconds rounded, for the tables."""
    return [
        {k: round(v, 1) if k == "seconds/epoch" else v for k, v in r.items() if k != "validation"}
        for r in rows
    ]


def plot_curves(rows: list[dict[str, Any]], path: Path, title: str) -> None:
    """Each head's validation metric over epochs (the checkpoint's monitor), saved to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    monitors = [k.removeprefix("best ") for r in rows for k in r if k.startswith("best ")]
    metric = monitors[0] if monitors else next(iter(rows[0]["validation"][0].keys() - {"epoch"}))
    fig, ax = plt.subplots(figsize=(6, 4))
    for row in rows:
        points = [(v["epoch"] + 1, v[metric]) for v in row["validation"] if metric in v]
        ax.plot(*zip(*points, strict=True), marker="o", label=row["head"])
    ax.set_xlabel("epoch")
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
    their per-epoch validation metrics) and ``out.png`` (:func:`plot_curves`)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(f"{header}\n\n{markdown_table(table_rows(rows))}")
    write_csv(table_rows(rows), out.with_suffix(".csv"))
    out.with_suffix(".json").write_text(json.dumps(rows, indent=2) + "\n")
    plot_curves(rows, out.with_suffix(".png"), out.stem)


def compare(
    config: Path,
    heads: list[str],
    epochs: int,
    seed: int,
    extra: Sequence[str] = (),
    out: Path | None = None,
) -> list[dict[str, Any]]:
    """Runs every head in turn in a temporary root; prints the table and writes it to ``out``."""
    for head in heads:  # fail before training anything if one name is wrong
        head_config(head)
    warnings.filterwarnings("ignore", "LightningCLI's args parameter")  # this script's own argv
    rows = []
    with tempfile.TemporaryDirectory() as root:
        for head in heads:
            rows.append(run(config, head, epochs, seed, str(Path(root) / Path(head).stem), extra))
            if out is not None:  # after every head, so a long comparison leaves partial results
                header = f"`{config.name}`, seed {seed}, up to {epochs} epochs, best checkpoint"
                write(rows, out, header)
    print(f"\n{config.name}, seed {seed}, best validation checkpoint, exact metrics")
    print(markdown_table(table_rows(rows)))
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True, help="model config YAML")
    parser.add_argument("--heads", nargs="+", required=True, help="names in configs/heads/")
    parser.add_argument("--epochs", type=int, default=10)
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
    if args.epochs < 1:
        raise SystemExit(f"error: --epochs must be >= 1, got {args.epochs}")
    if not args.config.is_file():
        raise SystemExit(f"error: no model config {args.config}")
    torch.set_num_threads(args.threads)
    try:
        compare(args.config, args.heads, args.epochs, args.seed, args.extra, args.out)
    except FileNotFoundError as err:
        raise SystemExit(f"error: {err}") from None


if __name__ == "__main__":
    cli_main()
