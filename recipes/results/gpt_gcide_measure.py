"""Issue 50, item 3: a short run of the GPT recipe on GCIDE (``configs/gpt_gcide.yaml``) with one
head: exact validation perplexity at step marks and the median wall time of a training step
(forward, backward and optimizer step, from ``on_train_batch_start`` to ``on_train_batch_end``;
validation excluded), with the load average at each mark. One JSON file per head; ``report``
prints the Markdown table of every head's file side by side.

Run each head in its own process, side by side, so both see the same load::

    python -m recipes.results.gpt_gcide_measure run --head full --steps 300 --val-every 100
    python -m recipes.results.gpt_gcide_measure run --head mixed --steps 300 --val-every 100
    python -m recipes.results.gpt_gcide_measure run --head mixed --seed 1 --steps 400 \
        --val-every 100 --out recipes/results/gpt_gcide_seed1
    python -m recipes.results.gpt_gcide_measure report --out recipes/results/gpt_gcide*
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import lightning as L
import torch

OUT = Path(__file__).parent / "gpt_gcide"
CONFIGS = Path(__file__).parents[1] / "configs"


class StepRecord(L.Callback):
    """Each training step's wall time, and the exact validation perplexity, the step and the
    load average of each validation run."""

    def __init__(self) -> None:
        self.step_seconds: list[float] = []
        self.marks: list[dict[str, float]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.step_seconds.append(time.perf_counter() - self._start)

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self.marks.append(
                {
                    "step": trainer.global_step,
                    "val_ppl": float(trainer.callback_metrics["val/ppl"]),
                    "load_1min": os.getloadavg()[0],
                    "median_step_s_so_far": statistics.median(self.step_seconds),
                }
            )
            print(json.dumps(self.marks[-1]), flush=True)


def run(head: str, steps: int, val_every: int, seed: int, out: Path) -> dict:
    from recipes.cli import main

    torch.set_num_threads(1)
    record = StepRecord()
    with tempfile.TemporaryDirectory(prefix=f"gpt_gcide_{head}_") as root:
        cli = main(
            [
                "--config", str(CONFIGS / "gpt_gcide.yaml"),
                "--config", str(CONFIGS / "heads" / f"{head}.yaml"),
                f"--seed_everything={seed}",
                f"--trainer.max_steps={steps}",
                f"--trainer.val_check_interval={val_every}",
                "--trainer.logger=false",
                "--trainer.enable_progress_bar=false",
                f"--trainer.default_root_dir={root}",
            ],
            run=False,
        )  # fmt: skip
        cli.trainer.callbacks.append(record)
        start = time.perf_counter()
        cli.trainer.fit(cli.model, cli.datamodule)
        wall = time.perf_counter() - start
    data, model = cli.datamodule, cli.model
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    result = {
        "head": head,
        "head_class": type(model.head).__name__,
        "steps": cli.trainer.global_step,
        "seed": seed,
        "vocab": data.num_classes,
        "tokenizer_train_seconds": data.meta.get("train_seconds"),
        "batch": [data.batch_size, data.seq_len],
        "model": {k: getattr(model.transformer.config, k) for k in ("n_layer", "n_embd", "n_head")},
        "eval_tokens": int(data.stream("validation").numel()),
        "median_step_s": statistics.median(record.step_seconds),
        "marks": record.marks,
        "wall_s": round(wall, 1),
        "threads": torch.get_num_threads(),
        "commit": commit,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{head}.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def report(outs: list[Path]) -> str:
    """The Markdown table of every run's JSON in the folders ``outs``, one row per head and
    seed."""
    paths = [p for out in outs for p in sorted(out.glob("*.json"))]
    results = sorted(
        (json.loads(p.read_text()) for p in paths), key=lambda r: (r["head"], r["seed"])
    )
    marks = sorted({m["step"] for r in results for m in r["marks"]})
    head = "| head | seed | steps | median step s | " + " | ".join(f"val ppl @{s}" for s in marks)
    lines = [head + " | load (1 min) at the marks | HEAD at the end |"]
    lines.append("|" + "---|" * (6 + len(marks)))
    for r in results:
        ppl = {m["step"]: f"{m['val_ppl']:,.1f}" for m in r["marks"]}
        load = ", ".join(f"{m['load_1min']:.1f}" for m in r["marks"])
        cells = [f"`{r['head']}` ({r['head_class']})", str(r["seed"]), str(r["steps"])]
        cells.append(f"{r['median_step_s']:.2f}")
        cells += [ppl.get(s, "") for s in marks] + [load, r["commit"]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cli(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["run", "report"])
    parser.add_argument("--head", default="full", help="a name in configs/heads/")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--val-every", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, nargs="+", default=[OUT], help="run: the first")
    args = parser.parse_args(argv)
    if args.action == "run":
        print(json.dumps(run(args.head, args.steps, args.val_every, args.seed, args.out[0])))
    else:
        print(report(args.out))


if __name__ == "__main__":
    cli()
