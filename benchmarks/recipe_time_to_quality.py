"""Time to quality per recipe: recorded validation curves on a time axis measured side by side.

Issue 31, item 3. For each recipe (SASRec and GRU4Rec on MovieLens-1M, the PTB LSTM, the GCIDE
LSTM and SASRec over the synthetic 1M items) and each of the issue's heads (full, uniform,
unigram, log-uniform, MIDX-rq, MIDX-Learn, in-batch, mixed, TAPAS, CANE), validation quality
against training time, and the time each head takes to reach 95% and 99% of the full softmax's
best validation quality.

Method. Retraining every head of every recipe on this CPU is out of reach, so the two axes come
from two places:

- **Quality against optimizer steps** comes from the runs recorded in ``recipes/results/*.json``
  (``recipes.compare``: a row per head, each with its ``validation`` list). Quality as a function
  of the step does not depend on how loaded the machine was. :data:`RECIPES` names, for every
  recipe and head, the file(s) of its curve, its estimator convention and its provenance (the
  command, commit and seed that ``recipes/RESULTS.md`` states), or, where no run was recorded,
  the ``recipes.compare`` command that would make one. Where runs under both conventions exist
  the library's current default, ``corrected_all``, is preferred.
- **Seconds per step are measured now, side by side, in one benchmark run** (the wall clock of
  the recorded runs varied 3.6x with the machine's load). For each recipe every head's
  LightningModule is built exactly as ``recipes.compare`` builds it (``recipes.cli.main`` with the
  recipe's config, the head's config and the overrides of the recorded run), with the optimizer
  of its ``configure_optimizers`` (``LazyAdam``, row-sparse where the head has
  ``sparse_grad=True``) and the Trainer's gradient clipping; all heads train on the same real
  training batches of the recipe's data module. Heads are timed **round-robin**: in round ``r``
  each head in turn takes one block of ``--steps`` full training steps (zero_grad, the recipe's
  ``training_step``, backward, clipping, optimizer step), for ``--rounds`` rounds after one
  untimed warm-up step, and each head's **median** step time is kept. A head with an index
  (``IndexRefresh`` in its config: MIDX, MIDX-Learn, CANE) also has one ``IndexRefresh.refresh``
  timed per round (median kept; where the first build took over :data:`LONG_REFRESH_S` seconds,
that build's time is used instead).

The time axis of a curve is then ``step x median step time + refreshes before that step x
refresh time``, the refreshes counted by the head's own ``IndexRefresh`` schedule (before the
first batch, at steps 50, 100, 200, ... and every epoch by default; every step for MIDX-Learn).
Validation and diagnostics (``SamplerDiagnostics``) are excluded: training time only. A head
reaches a quality at the **first recorded validation** at least that good, without
interpolation between validations (so the times are upper bounds at the resolution of the
recorded validations); for NDCG@10 that is ``value >= q x best_full``, for perplexity ``ppl <=
best_full / q`` (q = 0.95, 0.99).

Outputs in ``--out`` (default ``benchmarks/results/recipe_time_to_quality/``): ``step_time.csv``
(one row per recipe and head: the median, spread and count of its timed steps, its refresh time
and schedule, the load at the start and end; machine, torch version and commit on every row),
``curves.csv`` (every recorded validation with its step, refreshes and training seconds),
``recipe_time_to_quality.md`` (method, provenance, load, the time-to-95% / 99% table per recipe,
the sources) and one ``<recipe>.png`` per recipe (quality against training seconds, log x).

Run (one core, the other left to other work)::

    OMP_NUM_THREADS=1 python -m benchmarks.recipe_time_to_quality --rounds 5 --threads 1 \\
        --budget-s 1380 --background "what else ran"    # 13.4 minutes here
    python -m benchmarks.recipe_time_to_quality --report     # md, curves.csv and PNGs from CSV

``--recipes`` picks recipes, ``--heads`` heads, ``--steps`` overrides each recipe's steps per
block, ``--budget-s`` bounds the timing run (no round starts once a recipe's share is spent;
every head gets at least one round), ``--tiny`` is a dry run (one round of one step, no warm-up,
results in a temporary folder unless ``--out`` is given).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import statistics
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from itertools import islice
from pathlib import Path
from typing import Any

import torch

from lightning_sampled.callbacks import IndexRefresh
from lightning_sampled.optim import clip_grad_norm_, clip_grad_value_
from recipes.tables import write_csv

from . import common
from .report.common import head_label, markdown_table, read_csv

ROOT = Path(__file__).resolve().parents[1]
RECIPE_RESULTS = ROOT / "recipes" / "results"
OUT = common.RESULTS_DIR / "recipe_time_to_quality"
NAME = "recipe_time_to_quality"
QUALITIES = (0.95, 0.99)
#: a first index build longer than this (CANE's tree over 1M items) is not repeated every round:
#: its time stands for every refresh
LONG_REFRESH_S = 20.0
HEAD_OPTION = "--model.init_args.head.init_args"
NEG20 = (f"{HEAD_OPTION}.num_negatives=20",)
SPARSE = (f"{HEAD_OPTION}.sparse_grad=true",)
CANE_4_16 = (f"{HEAD_OPTION}.num_candidates=4", f"{HEAD_OPTION}.num_noise=16")


@dataclass(frozen=True)
class Recorded:
    """Where a head's recorded validation curve is: ``files`` (stems under ``recipes/results``,
    merged in step order: a step-budget run and a longer run of the same seed and code), the
    row's ``head`` name in them, the estimator ``convention`` it trained under, and its
    ``provenance`` (commit, seed, the paragraph of ``recipes/RESULTS.md`` with its command)."""

    files: tuple[str, ...]
    head: str
    convention: str
    provenance: str


@dataclass(frozen=True)
class HeadSpec:
    """One head of a recipe: the issue's ``key``, its ``config`` under
    ``recipes/configs/heads/``, the CLI ``overrides`` of its recorded run (also used to time
    it), its recorded curve (``None``: no recorded run), and why the head does not suit the
    recipe (``unsuited``; its step is still timed, no run is proposed)."""

    key: str
    config: str
    overrides: tuple[str, ...] = ()
    recorded: Recorded | None = None
    unsuited: str | None = None


@dataclass(frozen=True)
class Recipe:
    """A recipe: its model config, validation metric, ``recipes.compare`` budget arguments (for
    the commands of missing runs), steps per timed block, the heads timed one step per block
    (seconds or more a step), and its heads."""

    name: str
    config: str
    metric: str
    budget: str
    steps: int
    slow: tuple[str, ...]
    heads: tuple[HeadSpec, ...]

    @property
    def higher_is_better(self) -> bool:
        return self.metric != "val/ppl"


#: why log-uniform does not suit a catalog whose ids are not sorted by frequency
UNSORTED_IDS = "not applicable: its Zipfian proposal needs frequency-sorted ids, these are not"


def _ml(extra: dict[str, Recorded]) -> tuple[HeadSpec, ...]:
    return tuple(
        HeadSpec(
            key,
            key,
            recorded=extra.get(key),
            unsuited=UNSORTED_IDS if key == "log_uniform" else None,
        )
        for key in (
            "full",
            "uniform",
            "unigram",
            "log_uniform",
            "midx_rq",
            "midx_learn",
            "in_batch",
            "mixed",
            "tapas",
            "cane",
        )
    )


_T7 = "RESULTS.md 'The rest of Table 7' / 'MIDX-Learn with the sampler's own codes'"
SASREC = {
    "full": Recorded(
        ("sasrec_ml-1m_table7_full",),
        "full",
        "n/a",
        "commits 699d3e3-ed730c5, seed 0, 10 epochs (RESULTS.md 'SASRec, unigram and MIDX-pq')",
    ),
    "uniform": Recorded(
        ("sasrec_ml-1m_table7_uniform",),
        "uniform",
        "exact_positive",
        "library code 3c271d5, seed 0, 10 epochs (RESULTS.md 'The rest of Table 7')",
    ),
    "unigram": Recorded(
        ("sasrec_ml-1m_table7_unigram",),
        "unigram",
        "exact_positive",
        "commits 699d3e3-ed730c5, seed 0, 10 epochs (RESULTS.md 'SASRec, unigram and MIDX-pq')",
    ),
    "midx_rq": Recorded(
        ("sasrec_ml-1m_table7_midx_rq",),
        "midx_rq",
        "exact_positive",
        "library code 3c271d5, seed 0, 10 epochs (RESULTS.md 'The rest of Table 7')",
    ),
    "midx_learn": Recorded(
        ("sasrec_ml-1m_table7_midx_learn",),
        "midx_learn",
        "exact_positive",
        f"code face80d (hard encoder, reassigned every step), seed 0, 10 epochs ({_T7})",
    ),
    "in_batch": Recorded(
        ("sasrec_ml-1m_in_batch",),
        "in_batch",
        "exact_positive",
        "commit ce5b199, seed 0, 10 epochs (RESULTS.md 'SASRec, 10 epochs: in-batch and mixed')",
    ),
    "mixed": Recorded(
        ("sasrec_ml-1m_in_batch",),
        "mixed",
        "exact_positive",
        "commit ce5b199, seed 0, 10 epochs (RESULTS.md 'SASRec, 10 epochs: in-batch and mixed')",
    ),
    "tapas": Recorded(
        ("sasrec_ml-1m_table7_tapas",),
        "tapas",
        "n/a (TAPAS: uncorrected)",
        f"code e13dbab, seed 0, 10 epochs ({_T7})",
    ),
    "cane": Recorded(
        ("sasrec_ml-1m_table7_cane",),
        "cane",
        "n/a (CANE)",
        f"code 8f187c4 / 6e3b0cf, seed 0, 10 epochs ({_T7})",
    ),
}
_G7 = "RESULTS.md 'GRU4Rec, the paper's Table 7 heads'"
GRU4REC = {
    "full": Recorded(
        ("gru4rec_ml-1m_table7",), "full", "n/a", f"commit 699d3e3, seed 0, 10 epochs ({_G7})"
    ),
    "uniform": Recorded(
        ("gru4rec_ml-1m_convention_corrected_all",),
        "uniform",
        "corrected_all",
        "library code 3c271d5, seed 0, 10 epochs (RESULTS.md 'The third convention, "
        "corrected_all'; the exact_positive run is gru4rec_ml-1m_table7)",
    ),
    "unigram": Recorded(
        ("gru4rec_ml-1m_table7",),
        "unigram",
        "exact_positive",
        f"commit 699d3e3, seed 0, 10 epochs ({_G7})",
    ),
    "midx_rq": Recorded(
        ("gru4rec_ml-1m_table7_midx",),
        "midx_rq",
        "exact_positive",
        f"commit 699d3e3, seed 0, 10 epochs ({_G7})",
    ),
    "midx_learn": Recorded(
        ("gru4rec_ml-1m_table7_midx_learn",),
        "midx_learn",
        "exact_positive",
        f"code 29313af (hard encoder, reassigned every step), seed 0, 10 epochs ({_T7})",
    ),
    "tapas": Recorded(
        ("gru4rec_ml-1m_table7_tapas_ove_cane",),
        "tapas",
        "n/a (TAPAS: uncorrected)",
        "library code 3c271d5, seed 0, 10 epochs (RESULTS.md 'The rest of Table 7')",
    ),
    "cane": Recorded(
        ("gru4rec_ml-1m_table7_tapas_ove_cane",),
        "cane",
        "n/a (CANE)",
        "library code 3c271d5, seed 0, 10 epochs (RESULTS.md 'The rest of Table 7')",
    ),
    **{
        key: Recorded(
            (f"gru4rec_ml-1m_{key}",),
            key,
            "corrected_all",
            "library code d95650b, seed 0, 10 epochs (RESULTS.md 'GRU4Rec: the in-batch and "
            "mixed curves the time-to-quality table lacked')",
        )
        for key in ("in_batch", "mixed")
    },
}
_P4 = "seed 0, 3 epochs, 20 negatives (RESULTS.md 'PTB in the MIDX paper's setting (Table 4)')"
_PT = "library code d95650b (aa0e0de + the CANE edits, committed before the runs), seed 0, 3 epochs"
_PL = "RESULTS.md 'PTB: the heads the time-to-quality table lacked'"
PTB = (
    HeadSpec(
        "full",
        "full",
        recorded=Recorded(("lstm_ptb_table4_full",), "full", "n/a", f"library 3864127, {_P4}"),
    ),
    *(
        HeadSpec(
            key,
            key,
            NEG20,
            Recorded(
                ("lstm_ptb_table4_corrected_all",), key, "corrected_all", f"library 3864127, {_P4}"
            ),
        )
        for key in ("uniform", "unigram")
    ),
    HeadSpec(
        "log_uniform",
        "log_uniform",
        NEG20,
        Recorded(
            ("lstm_ptb_log_uniform",),
            "log_uniform",
            "corrected_all",
            f"{_PT}, 20 negatives ({_PL})",
        ),
    ),
    HeadSpec(
        "midx_rq",
        "midx_rq",
        NEG20,
        Recorded(
            ("lstm_ptb_table4_corrected_all",),
            "midx_rq",
            "corrected_all",
            f"library 3864127, {_P4}",
        ),
    ),
    HeadSpec(
        "midx_learn",
        "midx_learn",
        NEG20,
        Recorded(
            ("lstm_ptb_table4_corrected_learn",),
            "midx_learn",
            "corrected_all",
            "code 29313af (hard encoder, reassigned every step), seed 0, 3 epochs, 20 negatives "
            "(RESULTS.md 'MIDX-Learn with the sampler's own codes')",
        ),
    ),
    HeadSpec(
        "in_batch",
        "in_batch",
        recorded=Recorded(
            ("lstm_ptb_in_batch",),
            "in_batch",
            "corrected_all",
            f"{_PT}, the batch's other 699 targets, no draws ({_PL})",
        ),
    ),
    HeadSpec(
        "mixed",
        "mixed",
        NEG20,
        Recorded(
            ("lstm_ptb_mixed",),
            "mixed",
            "corrected_all",
            f"{_PT}, the batch's other 699 targets + 20 uniform draws ({_PL})",
        ),
    ),
    HeadSpec(
        "tapas",
        "tapas",
        NEG20,
        Recorded(
            ("lstm_ptb_table4_static",),
            "tapas",
            "n/a (TAPAS: uncorrected)",
            f"library 3864127, {_P4}; 20 shared of 40 presampled",
        ),
    ),
    HeadSpec(
        "cane",
        "cane",
        CANE_4_16,
        Recorded(
            ("lstm_ptb_table4_cane",),
            "cane",
            "n/a (CANE)",
            f"library 3864127, {_P4}; 4 candidates + 16 noises",
        ),
    ),
)
_GC = (
    "seed 0, a 30-step run and an 8-minute run merged (same seed and code: the first is a prefix "
    "of the second), validation at the end of each (recipes/results/gcide.md"
)


def _gcide(stems: tuple[str, str], head: str, code: str, section: str) -> Recorded:
    return Recorded(stems, head, "exact_positive", f"code {code}, {_GC} '{section}')")


def _session1(key: str) -> HeadSpec:
    """A head of the first GCIDE session: its ``sparse_`` config, sections (a) and (b)."""
    config = f"sparse_{key}"
    stems = ("gcide_tokens", "gcide_time")
    return HeadSpec(key, config, recorded=_gcide(stems, config, "of session 1", "(a)/(b)"))


_MORE = "The issue's other heads"
_LEARN = "MIDX-Learn with the sampler's own codes"
GCIDE = (
    HeadSpec(
        "full",
        "full",
        recorded=Recorded(
            ("gcide_full_rerun", "gcide_time_full_rerun"),
            "full",
            "n/a",
            f"library 3c271d5, {_GC} '{_MORE}': the full softmax re-run of that session)",
        ),
    ),
    _session1("uniform"),
    HeadSpec(
        "unigram",
        "unigram",
        SPARSE + NEG20,
        _gcide(("gcide_tokens_more", "gcide_time_more"), "unigram", "3c271d5", _MORE),
    ),
    _session1("log_uniform"),
    _session1("midx_rq"),
    HeadSpec(
        "midx_learn",
        "midx_learn",
        SPARSE + NEG20,
        _gcide(("gcide_tokens_learn", "gcide_time_learn"), "midx_learn", "face80d", _LEARN),
    ),
    *(
        HeadSpec(
            key,
            key,
            overrides,
            Recorded(
                (f"lstm_gcide_{key}",),
                key,
                "corrected_all",
                "library code d95650b, seed 0, 8 minutes, validation at the end (RESULTS.md "
                "'GCIDE: the in-batch and mixed curves the time-to-quality table lacked')",
            ),
        )
        for key, overrides in (("in_batch", SPARSE), ("mixed", SPARSE + NEG20))
    ),
    HeadSpec(
        "tapas",
        "tapas",
        SPARSE + NEG20,
        _gcide(("gcide_tokens_more", "gcide_time_more"), "tapas", "3c271d5", _MORE),
    ),
    HeadSpec(
        "cane",
        "cane",
        SPARSE + CANE_4_16,
        _gcide(("gcide_tokens_cane", "gcide_time_cane"), "cane", "3c271d5", _MORE),
    ),
)
_S1M = (
    "seed 0, 12 minutes, validation every 250 steps; commit not recorded (after the doubling "
    "refresh default, before 6e8fbb7 made corrected_all the default): recipes/results/"
    "synthetic_1m.md, 'Re-run with the current defaults'"
)


def _current_1m(key: str) -> HeadSpec:
    """A head of the 1M-item re-run: its ``sparse_`` config, ``synthetic_1m_current_*``."""
    config = f"sparse_{key}"
    stems = (f"synthetic_1m_current_{config}",)
    return HeadSpec(key, config, recorded=Recorded(stems, config, "exact_positive", _S1M))


SYNTHETIC = (
    HeadSpec(
        "full",
        "full",
        recorded=Recorded(
            ("synthetic_1m",),
            "full",
            "n/a",
            "seed 0, 12 minutes: 5 steps (RESULTS.md 'SASRec over 1,000,000 synthetic items')",
        ),
    ),
    _current_1m("uniform"),
    HeadSpec("unigram", "unigram", SPARSE + NEG20),
    HeadSpec("log_uniform", "sparse_log_uniform", unsuited=UNSORTED_IDS),
    _current_1m("midx_rq"),
    HeadSpec("midx_learn", "midx_learn", SPARSE + NEG20),
    HeadSpec("in_batch", "in_batch", SPARSE),
    HeadSpec("mixed", "mixed", SPARSE + NEG20),
    HeadSpec("tapas", "tapas", SPARSE + NEG20),
    HeadSpec("cane", "cane", SPARSE + CANE_4_16),
)
_EPOCHS10 = "--epochs 10"
RECIPES = {
    r.name: r
    for r in (
        Recipe("sasrec_ml-1m", "sasrec_ml-1m.yaml", "val/ndcg@10", _EPOCHS10, 2, (), _ml(SASREC)),
        Recipe(
            "gru4rec_ml-1m",
            "gru4rec_ml-1m.yaml",
            "val/ndcg@10",
            _EPOCHS10,
            2,
            (),
            _ml(GRU4REC),
        ),
        Recipe("lstm_ptb", "lstm_ptb.yaml", "val/ppl", "--epochs 3", 8, (), PTB),
        Recipe(
            "lstm_gcide",
            "lstm_gcide.yaml",
            "val/ppl",
            "--max-time 8 --val-every 5000",
            3,
            ("full",),
            GCIDE,
        ),
        Recipe(
            "sasrec_synthetic-1m",
            "sasrec_synthetic-1m.yaml",
            "val/ndcg@10",
            "--max-time 12 --val-every 250",
            2,
            ("full",),
            SYNTHETIC,
        ),
    )
}


def compare_command(recipe: Recipe, head: HeadSpec) -> str:
    """The ``recipes.compare`` command that records ``head``'s curve on ``recipe``."""
    extra = f" -- {' '.join(head.overrides)}" if head.overrides else ""
    return (
        f"python -m recipes.compare --config recipes/configs/{recipe.config} --heads "
        f"{head.config} {recipe.budget} --seed 0 --threads 1 --out "
        f"recipes/results/{recipe.name}_{head.key}{extra}"
    )


# ------------------------------------------------------------------------------ quality curves
def recorded_curve(recorded: Recorded, metric: str, folder: Path = RECIPE_RESULTS) -> list[dict]:
    """The recorded validations of a head: ``[{"step", "epoch", "value", "file"}]`` in step
    order, one per step (a budget run validates its final weights twice at the same step).

    Raises:
        ValueError: a file has no row, or several rows, for the head, or no validation with
            ``metric``.
    """
    points: dict[int, dict] = {}
    for stem in recorded.files:
        rows = [r for r in json.loads((folder / f"{stem}.json").read_text())]
        mine = [r for r in rows if r["head"] == recorded.head]
        if len(mine) != 1:
            raise ValueError(f"{stem}.json has {len(mine)} rows of head {recorded.head!r}")
        for v in mine[0]["validation"]:
            if metric in v and "step" in v:
                points.setdefault(
                    int(v["step"]),
                    {"step": int(v["step"]), "epoch": v.get("epoch"), "value": float(v[metric])},
                )
                points[int(v["step"])].setdefault("file", stem)
    if not points:
        raise ValueError(f"no {metric} validation of {recorded.head!r} in {recorded.files}")
    return [points[s] for s in sorted(points)]


def best(values: Sequence[float], higher_is_better: bool) -> float:
    """The best of ``values``."""
    return max(values) if higher_is_better else min(values)


def threshold(best_full: float, quality: float, higher_is_better: bool) -> float | None:
    """The value that reaches ``quality`` (0.95) of the full softmax's best: ``quality x best``
    for a metric to maximise, ``best / quality`` for perplexity; ``None`` where the best is not
    positive (``quality x 0`` would be reached by anything)."""
    if best_full <= 0:
        return None
    return quality * best_full if higher_is_better else best_full / quality


def first_reaching(curve: Sequence[dict], target: float | None, higher_is_better: bool):
    """The first point of ``curve`` at least as good as ``target`` (``>=`` / ``<=``: a value
    equal to it reaches it), no interpolation; ``None`` if none does or there is no target."""
    if target is None:
        return None
    for point in curve:
        value = point["value"]
        if (value >= target) if higher_is_better else (value <= target):
            return point
    return None


# ------------------------------------------------------------------------------------ time axis
def refresh_schedule(callback: IndexRefresh | None) -> dict[str, int | None] | None:
    """An ``IndexRefresh``'s schedule arguments, ``None`` without one."""
    if callback is None:
        return None
    return {
        "every_n_epochs": callback.every_n_epochs,
        "every_n_train_steps": callback.every_n_train_steps,
        "doubling_steps": callback.doubling_steps,
    }


def refreshes_before(step: int, steps_per_epoch: int, schedule: dict | None) -> int:
    """How many refreshes ``IndexRefresh(**schedule)`` makes before the batches of the first
    ``step`` optimizer steps (global steps ``0 .. step - 1``), epochs of ``steps_per_epoch``."""
    if schedule is None:
        return 0
    callback = IndexRefresh(**schedule)
    return sum(callback.take_due(s // steps_per_epoch, s) for s in range(step))


def training_seconds(step: int, step_s: float, refreshes: int, refresh_s: float) -> float:
    """The time axis: ``step`` steps of ``step_s`` seconds and ``refreshes`` of ``refresh_s``."""
    return step * step_s + refreshes * refresh_s


# ---------------------------------------------------------------------------------- measurement
@dataclass
class Timed:
    """A head built for timing: its model, optimizer, clipping and index refresh."""

    spec: HeadSpec
    model: Any
    optimizer: torch.optim.Optimizer
    clip_val: float | None
    clip_algorithm: str
    refresh: IndexRefresh | None
    steps: list[float]
    refreshes: list[float]
    first_refresh_s: float = float("nan")


def build(recipe: Recipe, spec: HeadSpec, root: str, seed: int) -> tuple[Timed, Any]:
    """The head's model as ``recipes.compare`` builds it (LightningCLI, ``run=False``), its
    optimizer, and the CLI's data module."""
    from recipes.cli import main
    from recipes.compare import head_config

    args = [
        "--config",
        str(ROOT / "recipes" / "configs" / recipe.config),
        "--config",
        str(head_config(spec.config)),
        f"--seed_everything={seed}",
        f"--trainer.default_root_dir={root}",
        "--trainer.logger=false",
        "--trainer.enable_model_summary=false",
        *spec.overrides,
    ]
    cli = main(args, run=False)
    model = cli.model.train()
    optimizer = model.configure_optimizers()
    refresh = next((c for c in cli.trainer.callbacks if isinstance(c, IndexRefresh)), None)
    algorithm = getattr(cli.trainer.gradient_clip_algorithm, "value", "norm") or "norm"
    timed = Timed(spec, model, optimizer, cli.trainer.gradient_clip_val, algorithm, refresh, [], [])
    return timed, cli.datamodule


def train_step(timed: Timed, batch: dict, index: int) -> float:
    """One training step as Lightning's automatic optimisation runs it; its seconds."""
    start = time.perf_counter()
    timed.optimizer.zero_grad(set_to_none=True)
    loss = timed.model.training_step(batch, index)
    loss.backward()
    if timed.clip_val:
        clip = clip_grad_norm_ if timed.clip_algorithm == "norm" else clip_grad_value_
        clip([p for g in timed.optimizer.param_groups for p in g["params"]], timed.clip_val)
    timed.optimizer.step()
    return time.perf_counter() - start


def time_recipe(
    recipe: Recipe,
    heads: Sequence[str] | None,
    rounds: int,
    steps: int | None,
    deadline: float,
    seed: int = 0,
    warmup: bool = True,
) -> list[dict[str, Any]]:
    """Times every head of ``recipe`` round-robin; one row per head (median step and refresh
    seconds, their spread, the refresh schedule and the epoch length). No round starts after
    ``deadline`` (``time.perf_counter()``), but the first."""
    specs = [h for h in recipe.heads if heads is None or h.key in heads]
    block = {h.key: 1 if h.key in recipe.slow else (steps or recipe.steps) for h in specs}
    timed: list[Timed] = []
    with tempfile.TemporaryDirectory() as root:
        batches: list[dict] = []
        steps_per_epoch = 0
        for spec in specs:
            print(f"[{recipe.name}] building {spec.key}", flush=True)
            head, datamodule = build(recipe, spec, root, seed)
            if not batches:
                loader = datamodule.train_dataloader()
                steps_per_epoch = len(loader)
                wanted = 1 + rounds * max(block.values())
                batches = list(islice(iter(loader), wanted))
            del datamodule
            if head.refresh is not None:  # the index is built before the first batch
                head.first_refresh_s = head.refresh.refresh(head.model)[0]
            if warmup:
                train_step(head, batches[0], 0)  # not timed
            timed.append(head)
        done = 0
        for r in range(rounds):
            if r and time.perf_counter() > deadline:
                break
            for head in timed:
                for i in range(block[head.spec.key]):
                    index = 1 + r * block[head.spec.key] + i
                    head.steps.append(train_step(head, batches[index % len(batches)], index))
                if head.refresh is not None and head.first_refresh_s <= LONG_REFRESH_S:
                    head.refreshes.append(head.refresh.refresh(head.model)[0])
            done += 1
            print(f"[{recipe.name}] round {done}/{rounds} done", flush=True)
    rows = []
    for head in timed:
        rows.append(
            {
                "recipe": recipe.name,
                "head": head.spec.key,
                "config": head.spec.config,
                "overrides": " ".join(head.spec.overrides),
                "rounds": done,
                "steps_per_block": block[head.spec.key],
                "steps_timed": len(head.steps),
                "median_step_s": statistics.median(head.steps),
                "min_step_s": min(head.steps),
                "max_step_s": max(head.steps),
                "refresh_s": statistics.median(head.refreshes)
                if head.refreshes
                else (head.first_refresh_s if head.refresh else 0.0),
                "refreshes_timed": len(head.refreshes),
                "first_refresh_s": head.first_refresh_s if head.refresh else 0.0,
                "schedule": json.dumps(refresh_schedule(head.refresh)),
                "steps_per_epoch": steps_per_epoch,
            }
        )
    del timed
    gc.collect()
    return rows


# ---------------------------------------------------------------------------------- the results
def curve_rows(step_rows: Sequence[dict], folder: Path = RECIPE_RESULTS) -> list[dict]:
    """Every recorded validation of every timed head, with its step, refreshes and training
    seconds on the measured time axis."""
    out = []
    for row in step_rows:
        recipe = RECIPES[row["recipe"]]
        spec = next(h for h in recipe.heads if h.key == row["head"])
        if spec.recorded is None:
            continue
        schedule = json.loads(row["schedule"]) if isinstance(row["schedule"], str) else None
        for point in recorded_curve(spec.recorded, recipe.metric, folder):
            n = refreshes_before(point["step"], int(row["steps_per_epoch"]), schedule)
            seconds = training_seconds(
                point["step"], float(row["median_step_s"]), n, float(row["refresh_s"])
            )
            out.append(
                {
                    "recipe": recipe.name,
                    "head": spec.key,
                    "file": point["file"],
                    "convention": spec.recorded.convention,
                    "metric": recipe.metric,
                    "step": point["step"],
                    "epoch": point["epoch"],
                    "value": point["value"],
                    "refreshes": n,
                    "train_s": seconds,
                }
            )
    return out


def reach_table(recipe: Recipe, steps: Sequence[dict], curves: Sequence[dict]) -> list[str]:
    """The Markdown of one recipe: the full softmax's best, and every head's time to 95% and
    99% of it, with its step time and source."""
    higher = recipe.higher_is_better
    mine = [c for c in curves if c["recipe"] == recipe.name]
    full = [c for c in mine if c["head"] == "full"]
    lines = [f"## {recipe.name} (`recipes/configs/{recipe.config}`, {recipe.metric})", ""]
    if not full:
        return [*lines, "No recorded full-softmax curve: nothing to compare with.", ""]
    best_full = best([c["value"] for c in full], higher)
    at = next(c for c in full if c["value"] == best_full)
    targets = {q: threshold(best_full, q, higher) for q in QUALITIES}
    lines.append(
        f"The full softmax's best validation {recipe.metric}: {best_full:.4g} at step "
        f"{at['step']} ({at['file']}.json); thresholds "
        + ", ".join(
            f"{q:.0%}: {'undefined (the best is 0)' if t is None else format(t, '.4g')}"
            for q, t in targets.items()
        )
        + "."
    )
    if None in targets.values():
        spec = next(h for h in recipe.heads if h.key == "full")
        command = compare_command(recipe, spec)
        command = command.replace(recipe.budget, "--max-steps 200 --val-every 50")
        lines.append(
            f"A full-softmax curve that scores above 0 needs a longer run, e.g. `{command}` "
            "(200 steps at the full softmax's step time below)."
        )
    lines.append("")
    columns = ["head", "convention", "s / step", "refresh s", "time to 95%", "vs full"]
    columns += ["time to 99%", "vs full", "best recorded", "source"]
    full_times = {q: reach_seconds(full, targets[q], higher) for q in QUALITIES}
    table = []
    for row in steps:
        if row["recipe"] != recipe.name:
            continue
        spec = next(h for h in recipe.heads if h.key == row["head"])
        cells = [head_label(spec.key), "—", _num(row["median_step_s"]), _refresh(row)]
        if spec.unsuited is not None:
            cells += [spec.unsuited, "", "", "", "", ""]
        elif spec.recorded is None:
            missing = ["no recorded run", ""]
            cells += [*missing, *missing, "", f"`{compare_command(recipe, spec)}`"]
        else:
            cells[1] = spec.recorded.convention
            curve = [c for c in mine if c["head"] == spec.key]
            for q in QUALITIES:
                cells += _reach_cells(curve, targets[q], higher, full_times[q])
            top = best([c["value"] for c in curve], higher)
            top_at = next(c for c in curve if c["value"] == top)
            cells += [
                f"{top:.4g} (step {top_at['step']}; validations: {len(curve)})",
                ", ".join(dict.fromkeys(f"{c['file']}.json" for c in curve)),
            ]
        table.append(cells)
    summary = fastest(recipe, mine, targets)
    return [
        *lines,
        *markdown_table(columns, table),
        *summary,
        f"![{recipe.name}]({recipe.name}.png)",
        "",
    ]


def fastest(recipe: Recipe, curves: Sequence[dict], targets: dict) -> list[str]:
    """A line per quality: which recorded heads reach it, the fastest first."""
    lines = []
    for q, target in targets.items():
        if target is None:
            continue
        times = {}
        for head in dict.fromkeys(c["head"] for c in curves):
            seconds = reach_seconds(
                [c for c in curves if c["head"] == head], target, recipe.higher_is_better
            )
            if seconds is not None:
                times[head] = seconds
        ranked = sorted(times, key=times.get)
        never = [head_label(h) for h in dict.fromkeys(c["head"] for c in curves) if h not in times]
        text = ", ".join(f"{head_label(h)} {times[h]:,.0f} s" for h in ranked)
        lines.append(
            f"- {q:.0%} of the full softmax's best, fastest first: {text}"
            + (f"; never within the recorded runs: {', '.join(never)}" if never else "")
            + "."
        )
    return [*lines, ""] if lines else []


def reach_seconds(curve: Sequence[dict], target: float | None, higher: bool) -> float | None:
    """The training seconds of the first point reaching ``target``, ``None`` if none does."""
    point = first_reaching(curve, target, higher)
    return None if point is None else point["train_s"]


def _reach_cells(curve, target, higher, full_s) -> list[str]:
    if target is None:
        return ["undefined", ""]
    point = first_reaching(curve, target, higher)
    if point is None:
        return ["not reached", ""]
    seconds = point["train_s"]
    ratio = f"{seconds / full_s:.2f}x" if full_s else ""
    return [f"{seconds:,.0f} s (step {point['step']})", ratio]


def _num(value: Any) -> str:
    return f"{float(value):.3g}"


def _refresh(row: dict) -> str:
    schedule = json.loads(row["schedule"]) if isinstance(row["schedule"], str) else None
    if not schedule:
        return "—"
    if schedule.get("every_n_train_steps") == 1:
        return f"{float(row['refresh_s']):.3g} every step"
    return f"{float(row['refresh_s']):.3g}"


def manifest_lines() -> list[str]:
    """The sources of every curve: files, convention and provenance, per recipe and head."""
    rows = []
    for recipe in RECIPES.values():
        for spec in recipe.heads:
            rec = spec.recorded
            if rec is None:
                why = spec.unsuited or "no recorded run"
                rows.append([recipe.name, head_label(spec.key), why, "", ""])
                continue
            files = ", ".join(f"`{f}.json` (head `{rec.head}`)" for f in rec.files)
            rows.append([recipe.name, head_label(spec.key), files, rec.convention, rec.provenance])
    columns = ["recipe", "head", "files (`recipes/results/`)", "convention", "provenance"]
    return ["## Sources of the curves", "", *markdown_table(columns, rows)]


def write_report(out: Path, steps: Sequence[dict], folder: Path = RECIPE_RESULTS) -> Path:
    """``curves.csv``, ``recipe_time_to_quality.md`` and a PNG per recipe from the step times
    (rows of ``step_time.csv``)."""
    curves = curve_rows(steps, folder)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(curves, out / "curves.csv")
    first = steps[0]
    recipes = [r for r in RECIPES.values() if any(s["recipe"] == r.name for s in steps)]
    lines = [
        "# Time to quality per recipe: recorded validation curves on a time axis measured side "
        "by side (issue 31, item 3)",
        "",
        common.load_header(first["load_start"], first["load_end"], first["background"]),
        "",
        f"Timed {first['started']} (UTC) to {first['ended']}, "
        f"`OMP_NUM_THREADS={first['threads']}`, torch threads {first['threads']}, seed 0. "
        f"Machine: {first['machine']}; torch {first['torch']}; commit {first['commit']}.",
        "",
        "**Method.** Quality against optimizer steps comes from the recorded `recipes.compare` "
        "runs (`recipes/results/*.json`, sources below): it does not depend on the machine's "
        "load, whereas their own wall clocks do (up to 3.6x between runs of the same head on "
        "this machine), so those are not used. The seconds per step were measured in one "
        "benchmark run (`python -m benchmarks.recipe_time_to_quality`), all heads of a "
        "recipe built as `recipes.compare` builds them (the recipe's config, the head's "
        "config and the recorded run's overrides, `LazyAdam`, the recipe's gradient "
        "clipping) and trained on the same real batches of the recipe's data module, "
        "**round-robin**: each round gives every head one block of full training steps "
        "(forward, backward, clipping, optimizer step) in turn, after one untimed warm-up "
        "step; the median step of each head is kept, and for heads with an index the median "
        "of one `IndexRefresh.refresh` per round (the first build's time where that took over "
        f"{LONG_REFRESH_S:g} s). The time of a recorded validation at step s is `s x median "
        "step + (refreshes before step s, by the head's IndexRefresh schedule) x refresh "
        "time`: training time only, validation and `SamplerDiagnostics` excluded. The "
        "schedule is today's (doubling steps 50, 100, 200, ... and every epoch; every step "
        "for MIDX-Learn), also for runs recorded under an older schedule.",
        "",
        "**Reaching a quality.** NDCG@10: the first recorded validation with value >= q x the "
        "full softmax's best validation NDCG@10; perplexity: the first with ppl <= best full "
        "ppl / q; q = 0.95 and 0.99. No interpolation between validations, so a time is an "
        "upper bound at the resolution of the recorded validations (every epoch on MovieLens "
        "and PTB; GCIDE: after 30 steps and at the end of 8 minutes; synthetic 1M: every 250 "
        "steps). 'vs full' divides by the full softmax's own time to the same threshold. The "
        "full softmax's best is the best of its recorded curve (10 epochs on MovieLens, still "
        "climbing on SASRec; 3 epochs on PTB; 109 steps on GCIDE): a head that beats it after "
        "it stopped is compared with an unconverged reference.",
        "",
        "Heads scored by the recorded runs: MovieLens 100 negatives per query (TAPAS 100 "
        "shared among 200 presampled, CANE 20 candidates + 80 noises); PTB, GCIDE and 1M items "
        "20 (CANE 4 + 16); GCIDE and 1M items on the row-sparse path. The timing used the same "
        "overrides (`overrides` in `step_time.csv`); heads without a recorded run were timed "
        "with the settings their command below would use.",
        "",
    ]
    for recipe in recipes:
        lines += reach_table(recipe, steps, curves)
        plot(out / f"{recipe.name}.png", recipe, curves)
    lines += step_table(steps)
    lines += manifest_lines()
    md = out / f"{NAME}.md"
    md.write_text("\n".join(lines))
    return md


def step_table(steps: Sequence[dict]) -> list[str]:
    """The measured step and refresh times of every head."""
    columns = ["recipe", "head", "config", "overrides", "rounds x steps", "median s", "min s"]
    columns += ["max s", "refresh s (median)", "first refresh s", "steps / epoch"]
    rows = [
        [
            r["recipe"],
            head_label(r["head"]),
            r["config"],
            r["overrides"] or "—",
            f"{r['rounds']} x {r['steps_per_block']}",
            *(_num(r[k]) for k in ("median_step_s", "min_step_s", "max_step_s", "refresh_s")),
            _num(r["first_refresh_s"]),
            r["steps_per_epoch"],
        ]
        for r in steps
    ]
    return ["## Measured step times (`step_time.csv`)", "", *markdown_table(columns, rows)]


def plot(path: Path, recipe: Recipe, curves: Sequence[dict]) -> None:
    """Validation quality against training seconds (log x), a line per head, the 95% and 99%
    thresholds dashed."""
    plt = common.pyplot()
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    mine = [c for c in curves if c["recipe"] == recipe.name]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for head in dict.fromkeys(c["head"] for c in mine):
        points = [c for c in mine if c["head"] == head]
        x, y = [max(p["train_s"], 1e-3) for p in points], [p["value"] for p in points]
        style = {"color": "black", "linewidth": 2.5} if head == "full" else {}
        ax.plot(x, y, marker="o", label=head_label(head), **style)
    full = [c["value"] for c in mine if c["head"] == "full"]
    if full:
        top = best(full, recipe.higher_is_better)
        for q, dash in zip(QUALITIES, ("--", ":"), strict=True):
            t = threshold(top, q, recipe.higher_is_better)
            if t is not None:
                ax.axhline(t, color="grey", linestyle=dash, linewidth=1, label=f"{q:.0%} of full")
    ax.set_xscale("log")
    if not recipe.higher_is_better:
        ax.set_yscale("log")
    for axis, limits, log in (
        (ax.xaxis, ax.get_xlim(), True),
        (ax.yaxis, ax.get_ylim(), not recipe.higher_is_better),
    ):
        if log:  # plain labels, at 1, 2 and 5 x 10^k over at most 3 decades
            few = math.log10(limits[1] / limits[0]) <= 3
            axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if few else (1.0,)))
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            axis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("training seconds (measured median step x steps + index refreshes)")
    ax.set_ylabel(f"{recipe.metric} (exact, recorded)")
    ax.set_title(recipe.name)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    common.save_figure(fig, path, dpi=100)


# ------------------------------------------------------------------------------------------ main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = common.make_parser(__doc__)
    parser.add_argument("--recipes", nargs="+", choices=list(RECIPES), default=list(RECIPES))
    parser.add_argument("--heads", nargs="+", help="only these heads (issue names)")
    parser.add_argument("--rounds", type=int, default=3, help="round-robin rounds")
    parser.add_argument("--steps", type=int, help="steps per block (default: each recipe's)")
    common.add_threads_argument(parser)
    parser.add_argument("--budget-s", type=float, default=1500.0, help="timing budget, seconds")
    parser.add_argument("--out", type=Path, help=f"output folder (default {OUT})")
    common.add_background_argument(parser)
    parser.add_argument("--report", action="store_true", help="rebuild md/png from step_time.csv")
    parser.add_argument("--tiny", action="store_true", help="dry run: 1 round of 1 step")
    args = parser.parse_args(argv)
    for name in ("rounds", "steps", "threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name} must be >= 1, got {value}")
    return args


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    out = args.out or (Path(tempfile.mkdtemp(prefix="ttq_")) if args.tiny else OUT)
    if args.report:
        steps = read_csv(out / "step_time.csv")
        if steps is None:
            raise SystemExit(f"error: no {out / 'step_time.csv'}: run the timing first")
        md = write_report(out, steps)
        print(f"wrote {md}")
        return md
    if args.tiny:
        args.rounds, args.steps = 1, 1
    common.set_threads(args.threads)
    warnings.filterwarnings("ignore", ".*self.log.*")  # training_step logs; no Trainer here
    warnings.filterwarnings("ignore", "LightningCLI's args parameter")
    started = datetime.now(timezone.utc)
    begin = time.perf_counter()
    rows: list[dict] = []
    with common.measured_load(args.background) as load:
        for n, name in enumerate(args.recipes):
            share = (args.budget_s - (time.perf_counter() - begin)) / (len(args.recipes) - n)
            deadline = time.perf_counter() + max(share, 0.0)
            rows += time_recipe(
                RECIPES[name], args.heads, args.rounds, args.steps, deadline, warmup=not args.tiny
            )
    ended = datetime.now(timezone.utc)
    stamp = {
        "threads": args.threads,
        "started": started.strftime("%Y-%m-%d %H:%M"),
        "ended": ended.strftime("%H:%M"),
        "load_start": load.start,
        "load_end": load.end,
        "background": load.background,
        **common.provenance(),
    }
    rows = [{**row, **stamp} for row in rows]
    out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out / "step_time.csv")
    md = write_report(out, rows)
    print(f"wrote {md} ({math.ceil(time.perf_counter() - begin)} s)")
    return md


if __name__ == "__main__":
    main()
