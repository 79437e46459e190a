"""Train one recipe with several heads side by side and tabulate their exact metrics.

Each head config of ``recipes/configs/heads/`` is combined with the same model config and seed; the
run trains for ``--epochs`` epochs (early stopping may end it sooner), restores the best validation
checkpoint, evaluates it on the test split, and records the best validation score, the test
metrics and the wall time per epoch (training plus validation). The table is printed and, with
``--out``, written as Markdown, CSV and JSON.

Run: ``python -m recipes.compare --config recipes/configs/sasrec_ml-1m.yaml --heads full uniform
midx_rq --epochs 10 --out results/sasrec_ml-1m``.
"""

from __future__ import annotations

import argparse
import csv
import json
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from .cli import main

CONFIGS = Path(__file__).parent / "configs"


class EpochTimer(L.Callback):
    """Records the wall time of each training epoch (its validation included)."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = time.perf_counter()

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
    config: Path, head: str, epochs: int, seed: int, root: str, extra: list[str] = ()
) -> dict[str, Any]:
    """Fits ``config`` with one head, tests its best checkpoint, returns the row of the table.

    The row has ``head``, ``epochs`` (run), ``seconds/epoch``, ``best val <monitor>`` and the
    test metrics under their logged names (``test/ndcg@10``, ``test/ppl``, ...).
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
    timer = EpochTimer()
    cli.trainer.callbacks.append(timer)
    cli.trainer.fit(cli.model, cli.datamodule)
    (tested,) = cli.trainer.test(cli.model, cli.datamodule, ckpt_path="best", verbose=False)
    row: dict[str, Any] = {
        "head": Path(head).stem,
        "epochs": len(timer.seconds),
        "seconds/epoch": sum(timer.seconds) / len(timer.seconds),
    }
    checkpoint = cli.trainer.checkpoint_callback
    if isinstance(checkpoint, ModelCheckpoint) and checkpoint.best_model_score is not None:
        row[f"best {checkpoint.monitor}"] = float(checkpoint.best_model_score)
    row.update({name: float(value) for name, value in sorted(tested.items())})
    return row


def markdown(rows: list[dict[str, Any]]) -> str:
    """A Markdown table with one line per row, columns in first-seen order, 4 decimals."""
    columns = list(dict.fromkeys(key for row in rows for key in row))

    def cell(value: Any) -> str:
        return f"{value:.4f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write(rows: list[dict[str, Any]], out: Path, header: str) -> None:
    """Writes ``out.md`` (``header`` then the table), ``out.csv`` and ``out.json``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(f"{header}\n\n{markdown(rows)}")
    columns = list(dict.fromkeys(key for row in rows for key in row))
    with out.with_suffix(".csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=2) + "\n")


def compare(
    config: Path,
    heads: list[str],
    epochs: int,
    seed: int,
    extra: list[str] = (),
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
    print(markdown(rows))
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True, help="model config YAML")
    parser.add_argument("--heads", nargs="+", required=True, help="names in configs/heads/")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--out", type=Path, help="write OUT.md, OUT.csv and OUT.json")
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
