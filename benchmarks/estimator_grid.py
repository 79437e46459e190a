"""Which estimator convention to default to: every cell of issue 31's grid, several seeds, on a GPU.

A cell is a task and a proposal: ``ptb`` (the LSTM of ``recipes/configs/lstm_ptb.yaml`` in the
MIDX paper's Table 4 setting: 20 negatives per query, MIDX K = 32, 3 epochs), ``sasrec`` and
``gru4rec`` (``recipes/configs/<model>_ml-1m.yaml``: 100 negatives per query, 10 epochs) and
``gcide`` (``recipes/configs/lstm_gcide.yaml``, 108,620 words: 20 negatives, as the recipe's
large-catalog heads, one epoch over the first :data:`GCIDE_STEPS` training windows) crossed
with the proposals ``uniform``, ``unigram`` and ``midx_rq`` (``recipes/configs/heads/<name>.yaml``)
drawn per query, and ``uniform`` and ``unigram`` shared by the batch (``shared_negatives=True``;
MIDX's proposal depends on the query, so it has no shared form). Every sampled cell trains under
each of ``--conventions`` (:data:`CONFIGURATIONS`: ``SampledSoftmaxHead(convention=...)``,
``corrected_all+batch``, the same with ``in_batch_negatives=True``, and ``corrected_all+rowsK``,
that with ``max_in_batch_draws=K``: each row the targets of ``K`` other positions drawn for it;
the grid's ``corrected_all+batchK`` rows measured the limit's first form, ``K`` positions shared
by every row, removed since: :data:`RETIRED`); each task also trains the full
softmax and CANE (``cane.yaml``; on the language models 4 beam candidates and 16 noises, as
Table 4's row), for reference. Each run validates exactly after every epoch (GCIDE: every 500
steps, on the recipe's first 10,000 validation tokens; perplexity over the whole vocabulary,
NDCG@10 over all 3,706 items with the user's history excluded) and tests the best validation's
checkpoint, as ``recipes.compare`` does.

Outside the grid (``--tasks tower1m``, issue 51): ``tower1m``, SASRec over 1,000,000 synthetic
items whose vectors come from a candidate tower over the items' features
(``recipes/configs/sasrec_synthetic-1m-tower.yaml``, :mod:`recipes.towers`), 3 epochs of 390
steps validated every 195 steps over all 1M items (the first 2,000 users), 20 negatives.

The recipes' models, heads, samplers, callbacks (``IndexRefresh``) and optimizer are used as they
are; the Trainer is a bare one (no logger, progress bar or early stopping) in fp32. Two
departures from the recipes' data modules, which need Hugging Face ``datasets`` (absent on the
GPU machine): the data are prepared on the CPU (``--prepare DIR``: ``ptb.pt`` and ``ml-1m.pt``,
int16 tensors, and ``gcide.pt``, int32) and batched here, the MovieLens training windows in a
new seeded order every epoch with the last incomplete batch dropped (the recipes keep it), and
the excluded histories right-padded with ``-1`` (the recipes left-pad them; the set excluded is
the same).

Runs go to ``--workers`` processes at once (one GPU serves them all: these models are small and
a step is bound by its launches), ordered seed by seed, so that a ``--deadline-s`` (no run
starts after it) leaves whole seeds. Outputs in ``--out DIR``, rewritten after every run:
``estimator_grid.csv`` (one row per run: best validation, its epoch, test, every epoch's
validation, seconds) and, from it (also ``--report``), ``estimator_grid.md``: per task, each
cell's test metric for each convention (mean and standard deviation over seeds), each
convention's ratio to the cell's best, and whether it is *within*: no more than 3% worse than the
best, or no further from it than the best's seed-to-seed range (max - min), and
``estimator_grid.png``, the same as bars relative to the full softmax.

Run: ``python -m benchmarks.estimator_grid --prepare .gpu_data`` (CPU, once), then ``python -m
benchmarks.estimator_grid --data .gpu_data --out OUT --workers 14 --deadline-s 420``; with
``--resume`` the runs already in ``OUT/estimator_grid.csv`` are kept and not run again (a machine
lent for minutes at a time finishes the grid over several calls); ``--tiny`` (a few batches of
one epoch, on the CPU) is the dry run.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import statistics
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass
from functools import cache, partial
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import Tensor
from torch.utils.data import DataLoader

from benchmarks.common import make_parser, pyplot, save_figure, set_threads
from lightning_sampled.callbacks import SamplerDiagnostics

from .time_to_quality import (
    Method,
    ShuffledBatches,
    class_from,
    head_config,
    recipe,
    versions,
    windows,
)

TASKS = {
    "ptb": {"config": "lstm_ptb.yaml", "epochs": 3, "negatives": 20, "metric": "ppl"},
    "sasrec": {"config": "sasrec_ml-1m.yaml", "epochs": 10, "negatives": 100, "metric": "ndcg@10"},
    "gru4rec": {
        "config": "gru4rec_ml-1m.yaml",
        "epochs": 10,
        "negatives": 100,
        "metric": "ndcg@10",
    },
    # one epoch over the first GCIDE_STEPS training windows, validated every 500 steps
    "gcide": {
        "config": "lstm_gcide.yaml",
        "epochs": 1,
        "negatives": 20,
        "metric": "ppl",
        "val_every": 500,
    },
    # issue 51's 1M-item task: SASRec whose item vectors come from a candidate tower over the
    # synthetic items' features; not in the grid (GRID_TASKS), trained with --tasks tower1m
    "tower1m": {
        "config": "sasrec_synthetic-1m-tower.yaml",
        "epochs": 3,
        "negatives": 20,
        "metric": "ndcg@10",
        # half an epoch of 390 steps (the last short batch dropped): marks at 195, ..., 1,170
        "val_every": 195,
    },
}
#: the tasks of issue 31's grid: the default of --tasks
GRID_TASKS = ("ptb", "sasrec", "gru4rec", "gcide")
#: the prepared file of each recommender task (:func:`prepare`)
SEQUENCE_FILES = {"sasrec": "ml-1m.pt", "gru4rec": "ml-1m.pt", "tower1m": "tower1m.pt"}
#: GCIDE's training prefix, in steps of the recipe's 32 x 35 tokens
GCIDE_STEPS = 2000
#: shared uniform draws that match the default's candidates per position on GCIDE: its 20 draws
#: per query plus the batch's distinct targets, 381.6 on average over the training split's 8,581
#: windows (the positive one of them), against 1 + 400 for the control
GCIDE_MATCHED = 400
#: (proposal, shared): the sampled cells of every task
CELLS = (
    ("uniform", False),
    ("unigram", False),
    ("midx_rq", False),
    ("uniform", True),
    ("unigram", True),
)
#: the bounded forms of the default the grid trains: ``(K, g)``, ``K`` in-batch draws for each
#: group of ``g`` consecutive rows (``max_in_batch_draws``, ``in_batch_group_size``)
BOUNDED = ((256, 1), (1024, 1), (256, 32))


def bounded_name(limit: int, group_size: int) -> str:
    """The configuration name of a bounded form: ``corrected_all+rows{K}``, with ``g{g}``
    where groups of ``g`` rows share their draws."""
    return f"corrected_all+rows{limit}" + (f"g{group_size}" if group_size > 1 else "")


#: the head configurations a sampled cell can train (``--conventions``): a convention, or
#: ``corrected_all`` with the batch's other targets as further negatives (mixed negatives,
#: ``in_batch_negatives=True``), the library's default configuration since issue 31, and that
#: bounded (:data:`BOUNDED`)
CONFIGURATIONS = {
    "exact_positive": {"convention": "exact_positive", "in_batch_negatives": False},
    "corrected_all": {"convention": "corrected_all", "in_batch_negatives": False},
    "corrected_all+batch": {"convention": "corrected_all", "in_batch_negatives": True},
    **{
        bounded_name(k, g): {
            "convention": "corrected_all",
            "in_batch_negatives": True,
            "max_in_batch_draws": k,
            "in_batch_group_size": g,
        }
        for k, g in BOUNDED
    },
    # issue 51: the in-batch variant of exact_positive, in-batch negatives alone (no draws) and
    # a control with about the default's candidates per position (shared draws, run with
    # shared cells)
    "exact_positive+batch": {"convention": "exact_positive", "in_batch_negatives": True},
    "batch_only": {"convention": "corrected_all", "in_batch_negatives": True, "num_negatives": 0},
    f"corrected_all@{GCIDE_MATCHED}": {
        "convention": "corrected_all",
        "in_batch_negatives": False,
        "num_negatives": GCIDE_MATCHED,
    },
}
#: configurations the grid's rows name that the library no longer has, with what they were: the
#: report shows their rows as measured, after the current ones, and says what they were
RETIRED = {
    f"corrected_all+batch{k}": (
        f"`max_in_batch_draws={k}` in its first form, the targets of {k} positions shared by "
        "every row, removed in b59f87e (issue 52: its shared noise cost the recommenders half "
        f"their NDCG@10); `corrected_all+rows{k}` is the form that replaced it"
    )
    for k in (256, 1024)
}
#: the configurations a row may name, in the report's order
EVERY_CONFIGURATION = [*CONFIGURATIONS, *RETIRED]
#: the configurations trained by default
CONVENTIONS = ("exact_positive", "corrected_all")
REFERENCES = ("full", "cane")


def cell_name(method: str, shared: bool | None) -> str:
    """A cell's name: the reference method's, or ``"<proposal>, per query | shared"``."""
    if shared is None:
        return method
    return f"{method}, {'shared' if shared else 'per query'}"


#: the cells in the order the report shows them
CELL_ORDER = (*REFERENCES, *(cell_name(p, shared) for p, shared in CELLS))
#: the provenance written on every row
STAMP = ("machine", "torch", "driver", "commit")
#: the language models' CANE as PTB's Table 4 row: 4 beam candidates and 16 uniform noises
LM_CANE = {"num_candidates": 4, "num_noise": 16}
#: the tasks whose model is a language model (token streams, perplexity: lower is better)
LANGUAGE_MODELS = ("ptb", "gcide")
#: a cell's convention is *within* when no more than this much worse than the best ...
RELATIVE_TOLERANCE = 0.03


# ----------------------------------------------------------------------------------------- data
def prepare(
    out: Path, tasks: Iterable[str] = GRID_TASKS, gcide_steps: int | None = GCIDE_STEPS
) -> dict[str, Any]:
    """Writes, for the ``tasks`` given, ``ptb.pt`` (the three token streams and the training
    counts) and ``ml-1m.pt`` (training windows, validation and test histories and targets,
    counts) as int16 tensors, ``tower1m.pt`` (the same, int32, and the items' features), and
    ``gcide.pt`` (int32: the first ``gcide_steps`` training windows' tokens, the whole training
    split when ``None``, the recipe's ``max_eval_tokens`` of validation and test, the whole
    training split's counts), from the recipes' data modules (``datasets`` needed; GCIDE
    fetched on first use)."""
    out.mkdir(parents=True, exist_ok=True)
    tasks = set(tasks)
    written = []
    if "ptb" in tasks:
        written.append(prepare_ptb(out))
    if tasks & {"sasrec", "gru4rec"}:
        written.append(prepare_movielens(out))
    if "tower1m" in tasks:
        written.append(prepare_tower(out))
    if "gcide" in tasks:
        written.append(prepare_gcide(out, gcide_steps))
    return {name: (out / name).stat().st_size for name in written}


def prepare_ptb(out: Path) -> str:
    """``ptb.pt`` (:func:`prepare`)."""
    from recipes.data.ptb import PennTreebank

    ptb = PennTreebank()
    streams = {split: ptb.stream(split).short() for split in ("train", "validation", "test")}
    counts = torch.tensor(ptb.class_counts)
    torch.save({"num_classes": ptb.num_classes, "counts": counts, **streams}, out / "ptb.pt")
    return "ptb.pt"


def prepare_movielens(out: Path) -> str:
    """``ml-1m.pt`` (:func:`prepare`)."""
    from recipes.data.movielens import MovieLens

    args = recipe("sasrec_ml-1m.yaml")["data"]["init_args"]
    ml = MovieLens(variant=args["variant"], max_len=args["max_len"])
    torch.save(sequences_of(ml, torch.int16), out / "ml-1m.pt")
    return "ml-1m.pt"


def prepare_tower(out: Path) -> str:
    """``tower1m.pt`` (:func:`prepare`): the synthetic sequences and the items' features
    (``dense``, ``category``: :class:`~recipes.towers.ItemFeatures`)."""
    from recipes.data.synthetic import SyntheticSequences

    data = SyntheticSequences(**recipe(TASKS["tower1m"]["config"])["data"]["init_args"])
    features = data.item_features
    arrays = sequences_of(data, torch.int32)
    torch.save(
        {**arrays, "dense": features.dense, "category": features.category}, out / "tower1m.pt"
    )
    return "tower1m.pt"


def sequences_of(data: Any, dtype: torch.dtype) -> dict[str, Any]:
    """A ``recipes.data.MovieLens``-like module's training windows, validation and test
    histories (concatenated, with their lengths) and targets, and training counts, ids as
    ``dtype``."""
    from recipes.data.movielens import training_windows

    inputs, targets = training_windows(data.splits["train"]["items"], data.max_len)
    arrays: dict[str, Any] = {
        "num_classes": data.num_classes,
        "counts": torch.tensor(data.class_counts),
        "train_input": inputs.to(dtype),
        "train_target": targets.to(dtype),
    }
    for split in ("validation", "test"):
        rows = data.splits[split]
        histories = [torch.tensor(h, dtype=dtype) for h in rows["history"]]
        arrays[f"{split}_history"] = torch.cat(histories)
        arrays[f"{split}_lengths"] = torch.tensor([h.numel() for h in histories])
        arrays[f"{split}_target"] = torch.tensor(rows["target"])
    return arrays


def prepare_gcide(out: Path, steps: int | None = GCIDE_STEPS) -> str:
    """``gcide.pt`` (:func:`prepare`): ``steps`` training windows, or the whole split."""
    from recipes.data.gcide import GCIDE

    gcide_args = recipe("lstm_gcide.yaml")["data"]["init_args"]
    gcide = GCIDE(min_count=gcide_args["min_count"])
    train = gcide.stream("train")
    prefix = None if steps is None else gcide_args["batch_size"] * (steps * gcide_args["bptt"] + 1)
    eval_tokens = gcide_args["max_eval_tokens"]
    torch.save(
        {
            "num_classes": gcide.num_classes,
            "counts": torch.bincount(train, minlength=gcide.num_classes),
            "train": train[:prefix].int(),
            **{s: gcide.stream(s)[:eval_tokens].int() for s in ("validation", "test")},
        },
        out / "gcide.pt",
    )
    return "gcide.pt"


def history_batches(
    flat: Tensor, lengths: Tensor, target: Tensor, max_len: int, size: int
) -> list[dict[str, Tensor]]:
    """Evaluation batches of ``size`` users from their concatenated histories.

    Args:
        flat: ``[sum(lengths)]`` every user's history in time order, one after the other.
        lengths: ``[U]`` each user's history length.
        target: ``[U]`` each user's held-out item.
        max_len: the model's input length.

    Returns:
        ``{"history"}`` long ``[B, max_len]`` (the latest items, left-padded with 0),
        ``{"target"}`` ``[B]`` and ``{"exclude"}`` ``[B, E]`` (the whole history, right-padded
        with ``-1``).
    """
    users = list(torch.split(flat.long(), lengths.tolist()))
    batches = []
    for start in range(0, len(users), size):
        chunk = users[start : start + size]
        history = torch.stack(
            [
                torch.nn.functional.pad(u[-max_len:], (max_len - min(len(u), max_len), 0))
                for u in chunk
            ]
        )
        exclude = torch.nn.utils.rnn.pad_sequence(chunk, batch_first=True, padding_value=-1)
        batches.append(
            {"history": history, "target": target[start : start + size].long(), "exclude": exclude}
        )
    return batches


@dataclass
class TaskData:
    """One task's batches on its device: ``train(seed)`` a fresh training loader per run;
    ``features`` the items' (``recipes.towers.ItemFeatures``) where the task's model has an
    item tower."""

    num_classes: int
    counts: list[int]
    train: Callable[[int], DataLoader]
    validation: list[dict[str, Tensor]]
    test: list[dict[str, Tensor]]
    features: Any = None


@cache
def load_task(data_dir: str, task: str, device_name: str, tiny: bool) -> TaskData:
    """A task's prepared data on ``device_name`` (cached per worker process)."""
    device = torch.device(device_name)
    config = recipe(TASKS[task]["config"])["data"]["init_args"]
    if task in LANGUAGE_MODELS:
        data = torch.load(Path(data_dir) / f"{task}.pt", weights_only=True)
        stream = {k: data[k].long().to(device) for k in ("train", "validation", "test")}
        train = windows(stream["train"], config["batch_size"], config["bptt"], full_only=False)
        rows = config.get("eval_batch_size", 10)  # the data modules' default
        evaluation = {
            split: windows(stream[split], rows, config["bptt"], full_only=False)
            for split in ("validation", "test")
        }

        def loader(seed: int) -> DataLoader:
            return DataLoader(train, batch_size=None)  # in order, as the recipe
    else:
        data = torch.load(Path(data_dir) / SEQUENCE_FILES[task], weights_only=True)
        table = {
            "input": data["train_input"].long().to(device),
            "target": data["train_target"].long().to(device),
        }
        evaluation = {
            split: [
                {k: v.to(device) for k, v in b.items()}
                for b in history_batches(
                    data[f"{split}_history"],
                    data[f"{split}_lengths"],
                    data[f"{split}_target"],
                    config["max_len"],
                    256,  # the recipes' eval_batch_size
                )
            ]
            for split in ("validation", "test")
        }

        def loader(seed: int) -> DataLoader:
            return DataLoader(ShuffledBatches(table, config["batch_size"], seed), batch_size=None)

    if tiny:
        evaluation = {k: v[:2] for k, v in evaluation.items()}
    features = None
    if "dense" in data:
        from recipes.towers import ItemFeatures

        features = ItemFeatures(data["dense"], data["category"])
    return TaskData(
        int(data["num_classes"]), data["counts"].tolist(), loader, **evaluation, features=features
    )


# ----------------------------------------------------------------------------------------- runs
@dataclass(frozen=True)
class Run:
    """One training run: a task, a method (``full``, ``cane`` or a proposal), for a proposal its
    mode and convention, and a seed."""

    task: str
    method: str
    seed: int
    shared: bool | None = None
    convention: str | None = None

    @property
    def cell(self) -> str:
        return cell_name(self.method, self.shared)


def runs(
    tasks: list[str],
    conventions: list[str],
    seeds: list[int],
    references: tuple[str, ...] | list[str] = REFERENCES,
    cells: tuple[tuple[str, bool], ...] = CELLS,
) -> list[Run]:
    """Every run, seed by seed, the language models (the longest runs) first within a seed;
    ``references`` are the reference methods trained beside the ``cells`` (of :data:`CELLS`)."""
    order = sorted(tasks, key=lambda t: t not in LANGUAGE_MODELS)
    plan = []
    for seed in seeds:
        for task in order:
            plan += [Run(task, method, seed) for method in references]
            plan += [
                Run(task, proposal, seed, shared, convention)
                for proposal, shared in cells
                for convention in conventions
            ]
    return plan


def method_of(run: Run) -> Method:
    """The head config of ``run`` with its task's and run's options."""
    m = head_config(run.method)
    options: dict[str, Any] = {}
    if run.convention is not None:
        options.update(
            {
                "num_negatives": TASKS[run.task]["negatives"],
                "shared_negatives": run.shared,
                **CONFIGURATIONS[run.convention],  # a configuration may set its own count
            }
        )
    elif run.method == "cane" and run.task in LANGUAGE_MODELS:
        options.update(LM_CANE)
    head = partial(m.head.func, *m.head.args, **{**m.head.keywords, **options})
    # SamplerDiagnostics reads the data module's validation batches, which a bare Trainer lacks
    callbacks = tuple(c for c in m.callbacks if c[0] is not SamplerDiagnostics)
    return Method(head, m.sampler, callbacks)


class EpochValues(L.Callback):
    """Each validation's value of ``monitor``."""

    def __init__(self, monitor: str) -> None:
        self.monitor = monitor
        self.values: list[float] = []

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self.values.append(float(trainer.callback_metrics[self.monitor]))


@dataclass(frozen=True)
class Schedule:
    """Options of a long, step-based run (issue 51); the defaults are the grid's.

    Attributes:
        val_every: validate every this many training steps (``None``: the task's own, GCIDE 500,
            the others once per epoch).
        max_steps: stop after this many steps (``None``: the task's epochs).
        curves: a CSV that gets one row per validation mark (:class:`MarkLog`).
        stamp: provenance written on each of its rows (:data:`STAMP`).
    """

    val_every: int | None = None
    max_steps: int | None = None
    curves: str | None = None
    stamp: tuple[tuple[str, str], ...] = ()


#: the columns of a ``--curves`` CSV, one row per validation mark
CURVE_COLUMNS = (
    "task",
    "configuration",
    "proposal",
    "seed",
    "step",
    "val",
    "metric",
    "wall_s",
    "candidates",
    "distinct_targets",
    *STAMP,
)


def drawn_negatives(run: Run) -> int:
    """``M``, the draws per query (or per batch when shared) of ``run``'s head."""
    options = CONFIGURATIONS.get(run.convention or "", {})
    return int(options.get("num_negatives", TASKS[run.task]["negatives"]))


def candidates_per_position(run: Run, distinct_targets: float, num_classes: int) -> float:
    """The columns a position scores: the positive and ``M`` draws, or with in-batch negatives
    the ``M`` draws and the batch's ``U`` distinct targets (the positive one of them), or
    under ``max_in_batch_draws=K`` its ``K`` draws from the batch; the full softmax every one
    of the task's ``num_classes`` but the recommenders' padding item."""
    if run.method == "full":
        return num_classes - (run.task not in LANGUAGE_MODELS)
    options = CONFIGURATIONS.get(run.convention or "", {})
    if not options.get("in_batch_negatives"):
        return 1.0 + drawn_negatives(run)
    limit = options.get("max_in_batch_draws")
    return drawn_negatives(run) + (distinct_targets if limit is None else limit)


class MarkLog(L.Callback):
    """Appends a row (:data:`CURVE_COLUMNS`) to a CSV at every validation mark, as it happens,
    so that a run cut short leaves its curve: the step, the validation value, the seconds since
    training began and the mean candidates scored per position so far (from the mean distinct
    targets of the training batches seen, :func:`candidates_per_position`)."""

    def __init__(self, path: str | Path, run: Run, monitor: str, stamp: dict[str, str]) -> None:
        self.path = Path(path)
        self.run = run
        self.monitor = monitor
        self.stamp = stamp
        self.distinct = 0
        self.batches = 0
        self.start = time.perf_counter()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.start = time.perf_counter()

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        target = batch["target"]
        self.distinct += int(torch.unique(target[target >= 0]).numel())
        self.batches += 1

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        distinct = self.distinct / max(self.batches, 1)
        row = {
            "task": self.run.task,
            "configuration": self.run.convention or self.run.method,
            "proposal": self.run.cell,
            "seed": self.run.seed,
            "step": trainer.global_step,
            "val": float(trainer.callback_metrics[self.monitor]),
            "metric": TASKS[self.run.task]["metric"],
            "wall_s": round(time.perf_counter() - self.start, 1),
            "candidates": round(
                candidates_per_position(self.run, distinct, pl_module.num_classes), 1
            ),
            "distinct_targets": round(distinct, 1),
            **{key: self.stamp.get(key, "?") for key in STAMP},
        }
        new = not self.path.is_file()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=CURVE_COLUMNS)
            if new:
                writer.writeheader()
            writer.writerow(row)


def build_model(run: Run, data: TaskData, m: Method) -> L.LightningModule:
    """``run``'s recipe model with ``m``'s head and sampler, seeded with ``run.seed``."""
    config = recipe(TASKS[run.task]["config"])
    L.seed_everything(run.seed, verbose=False)
    model_args = {k: v for k, v in config["model"]["init_args"].items() if k != "head"}
    if "item_tower" in model_args:
        from recipes.towers import TowerSpec

        model_args["item_tower"] = TowerSpec(**model_args["item_tower"])
    model = class_from(config["model"]["class_path"])(
        data.num_classes, head=m.head, sampler=m.sampler, class_counts=data.counts, **model_args
    )
    if getattr(model, "item_tower", None) is not None:  # no data module to load them at setup
        model.item_tower.load(data.features)
    return model


def train(
    run: Run, data_dir: str, device_name: str, tiny: bool, schedule: Schedule = Schedule()
) -> dict[str, Any]:
    """Trains ``run`` and tests its best epoch: the row of :func:`run_one`."""
    spec = TASKS[run.task]
    config = recipe(spec["config"])
    data = load_task(data_dir, run.task, device_name, tiny)
    m = method_of(run)
    model = build_model(run, data, m)
    monitor = f"val/{spec['metric']}"
    mode = "min" if run.task in LANGUAGE_MODELS else "max"
    values = EpochValues(monitor)
    marks = (
        []
        if schedule.curves is None
        else [MarkLog(schedule.curves, run, monitor, dict(schedule.stamp))]
    )
    val_every = schedule.val_every or spec.get("val_every")
    with tempfile.TemporaryDirectory() as root:
        best = ModelCheckpoint(dirpath=root, monitor=monitor, mode=mode, save_top_k=1)
        trainer = L.Trainer(
            accelerator=torch.device(device_name).type,
            devices=1,
            max_epochs=1 if tiny else spec["epochs"],
            max_steps=-1 if schedule.max_steps is None else schedule.max_steps,
            limit_train_batches=4 if tiny else None,
            val_check_interval=None if tiny else val_every,
            # marks every val_every steps of the whole run, not of each epoch
            check_val_every_n_epoch=None if val_every and not tiny else 1,
            gradient_clip_val=config["trainer"].get("gradient_clip_val"),
            callbacks=[best, values, *marks, *m.make_callbacks()],
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            default_root_dir=root,
        )
        start = time.perf_counter()
        trainer.fit(model, data.train(run.seed), DataLoader(data.validation, batch_size=None))
        fit_s = time.perf_counter() - start
        tested = trainer.test(
            model,
            DataLoader(data.test, batch_size=None),
            ckpt_path="best",
            verbose=False,
            weights_only=False,
        )[0]
        best_val = (min if mode == "min" else max)(values.values)
    return {
        "val": best_val,
        "best_epoch": values.values.index(best_val) + 1,
        "test": float(tested[f"test/{spec['metric']}"]),
        "steps": trainer.global_step,
        "fit_s": round(fit_s, 1),
        "val_by_epoch": json.dumps([round(v, 5) for v in values.values]),
        "head": " ".join(str(model.head).split())[:300],
    }


def run_one(
    run: Run, data_dir: str, device_name: str, tiny: bool, schedule: Schedule = Schedule()
) -> dict[str, Any]:
    """One run in a worker process: its row (``status`` ``"ok"`` or the error's first line)."""
    set_threads(1)
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    warnings.filterwarnings("ignore", ".*IterableDataset.*has .__len__. defined.*")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    row: dict[str, Any] = {**asdict(run), "cell": run.cell, "metric": TASKS[run.task]["metric"]}
    start = time.perf_counter()
    try:
        row.update(train(run, data_dir, device_name, tiny, schedule), status="ok")
    except Exception as err:  # one failed run must not lose the others' numbers
        traceback.print_exc()
        row["status"] = f"error: {type(err).__name__}: {str(err).splitlines()[0][:200]}"
    row["wall_s"] = round(time.perf_counter() - start, 1)
    return row


# -------------------------------------------------------------------------------------- report
def summarize(rows: list[dict]) -> Iterator[dict[str, Any]]:
    """Per task, cell and convention (or reference method): the seeds' test values, their mean
    and standard deviation, the ratio to the cell's best mean and whether it is *within*."""
    ok = [r for r in rows if r["status"] == "ok"]
    for task in dict.fromkeys(r["task"] for r in ok):
        lower = task in LANGUAGE_MODELS
        present = {r["cell"] for r in ok if r["task"] == task}
        for cell in [c for c in CELL_ORDER if c in present]:
            groups: dict[str, list[float]] = {}
            for r in ok:
                if (r["task"], r["cell"]) == (task, cell):
                    groups.setdefault(r["convention"] or "-", []).append(float(r["test"]))
            means = {c: statistics.fmean(v) for c, v in groups.items()}
            best = (min if lower else max)(means, key=means.get)
            spread = max(groups[best]) - min(groups[best])
            for convention, values in groups.items():
                mean = means[convention]
                ratio = mean / means[best]
                gap = abs(mean - means[best])
                worse = ratio - 1 if lower else 1 - ratio
                yield {
                    "task": task,
                    "cell": cell,
                    "convention": convention,
                    "seeds": len(values),
                    "mean": mean,
                    "sd": statistics.stdev(values) if len(values) > 1 else math.nan,
                    "ratio_to_best": ratio,
                    "best": convention == best,
                    "within": worse <= RELATIVE_TOLERANCE or gap <= spread,
                }


def length(task: str) -> str:
    """How long a task trains, in words."""
    if task == "gcide":
        return f"{GCIDE_STEPS:,} steps, validated every {TASKS[task]['val_every']}"
    every = TASKS[task].get("val_every")
    return f"{TASKS[task]['epochs']} epochs" + (f", validated every {every} steps" if every else "")


def header(rows: list[dict], tiny: bool) -> list[str]:
    """The report's title and provenance, from the rows' stamps (:data:`STAMP`)."""
    ok = [r for r in rows if r["status"] == "ok"]
    lines = ["# Estimator conventions, cell by cell (issue 31)", ""]
    for key in STAMP:
        lines.append(f"- {key}: " + ", ".join(sorted({str(r.get(key, "?")) for r in ok})))
    finished = sorted(r["finished"] for r in ok if r.get("finished"))
    if finished:
        lines.append(
            f"- {len(finished)} of {len(ok)} runs record when they finished: between "
            f"{finished[0]} and {finished[-1]}"
        )
    tasks = dict.fromkeys(r["task"] for r in ok)
    lines += [
        "- tasks: "
        + "; ".join(
            f"`{t}` (`recipes/configs/{TASKS[t]['config']}`, {length(t)}, "
            f"{TASKS[t]['negatives']} negatives per query or per batch, seeds "
            + ", ".join(sorted({str(r["seed"]) for r in ok if r["task"] == t}))
            + "; on "
            + ", ".join(sorted({str(r.get("machine", "?")) for r in ok if r["task"] == t}))
            + ")"
            for t in tasks
        ),
        "- each value: the test metric of the best-validation epoch, mean ± sd over seeds "
        "(count); `Nx`: ratio to the cell's best mean; **out**: more than 3% worse than the best "
        "and further from it than the best's seed range (max - min)",
    ]
    if tiny:
        lines.append("- dry run (--tiny): 4 batches of one epoch, 2 evaluation batches")
    return lines


def report(rows: list[dict], out: Path, tiny: bool = False) -> None:
    """``estimator_grid.md`` and ``estimator_grid.png`` from the runs' rows."""
    summary = list(summarize(rows))
    lines = [*header(rows, tiny), ""]
    conventions = in_order(s["convention"] for s in summary if s["convention"] != "-")
    for task in dict.fromkeys(s["task"] for s in summary):
        metric = TASKS[task]["metric"]
        lines += [f"### {task}: test {metric} of the best-validation epoch", ""]
        lines += ["| cell | " + " | ".join(conventions) + " |", "|---|" + "---|" * len(conventions)]
        for cell in dict.fromkeys(s["cell"] for s in summary if s["task"] == task):
            found = {s["convention"]: s for s in summary if (s["task"], s["cell"]) == (task, cell)}
            if "-" in found:
                s = found["-"]
                lines.append(
                    f"| {cell} (reference) | {describe(s, False)} |" + " |" * (len(conventions) - 1)
                )
                continue
            lines.append(
                f"| {cell} | "
                + " | ".join(describe(found[c], True) if c in found else "—" for c in conventions)
                + " |"
            )
        lines.append("")
    lines += ["### Cells within 3% of the best (or its seed range), by convention", ""]
    for convention in conventions:
        mine = [s for s in summary if s["convention"] == convention]
        misses = [
            f"{s['task']} {s['cell']} ({s['ratio_to_best']:.3f})" for s in mine if not s["within"]
        ]
        lines.append(
            f"- `{convention}`: {sum(s['within'] for s in mine)} of {len(mine)}"
            + (f"; not: {', '.join(misses)}" if misses else "")
        )
    retired = [c for c in conventions if c in RETIRED]
    if retired:
        lines += ["", "### Retired configurations", ""]
        lines += [f"- `{c}`: {RETIRED[c]}" for c in retired]
    (out / "estimator_grid.md").write_text("\n".join(lines) + "\n")
    plot(summary, out / "estimator_grid.png")


def in_order(conventions: Iterable[str]) -> list[str]:
    """The distinct ``conventions`` in the order of :data:`CONFIGURATIONS`, then
    :data:`RETIRED`."""
    return sorted(set(conventions), key=EVERY_CONFIGURATION.index)


def run_label(task: str, cell: str, convention: str | None, seed: int) -> str:
    """How the log names a run: ``"sasrec uniform, per query corrected_all seed 0"``."""
    return f"{task} {cell} {convention or ''} seed {seed}".replace("  ", " ")


def describe(s: dict[str, Any], ranked: bool) -> str:
    """``mean ± sd (n)``, with the ratio to the cell's best and a mark when not within."""
    text = f"{s['mean']:.4g} ± {s['sd']:.2g} ({s['seeds']})"
    if ranked:
        text += f", {s['ratio_to_best']:.3f}x" + ("" if s["within"] else " **out**")
    return text


def plot(summary: list[dict], path: Path) -> None:
    """Per task, each cell's conventions as bars relative to the full softmax's mean (lower is
    better for perplexity), with the seeds' standard deviation."""
    plt = pyplot()

    tasks = list(dict.fromkeys(s["task"] for s in summary))
    if not tasks:
        return
    fig, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4.5), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        full = next((s["mean"] for s in summary if (s["task"], s["cell"]) == (task, "full")), None)
        cells = [c for c in dict.fromkeys(s["cell"] for s in summary if s["task"] == task)]
        cells = [c for c in cells if c not in REFERENCES]
        conventions = in_order(
            s["convention"] for s in summary if s["task"] == task and s["cell"] in cells
        )
        width = 0.8 / max(len(conventions), 1)
        for i, convention in enumerate(conventions):
            found = {
                s["cell"]: s for s in summary if (s["task"], s["convention"]) == (task, convention)
            }
            xs = [j + i * width for j, c in enumerate(cells) if c in found]
            ys = [found[c]["mean"] / (full or 1.0) for c in cells if c in found]
            es = [
                (found[c]["sd"] if found[c]["seeds"] > 1 else 0.0) / (full or 1.0)
                for c in cells
                if c in found
            ]
            color = f"C{EVERY_CONFIGURATION.index(convention)}"  # alike in every panel
            ax.bar(xs, ys, width, yerr=es, label=convention, color=color)
        ax.set_xticks(
            [j + 0.4 - width / 2 for j in range(len(cells))], cells, rotation=25, fontsize=8
        )
        metric = TASKS[task]["metric"]
        ax.set_ylabel(f"test {metric} / full softmax's" if full else f"test {metric}")
        if task in LANGUAGE_MODELS:
            ax.set_yscale("log")
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_title(task)
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=100)


def write_rows(rows: list[dict], path: Path) -> None:
    columns = list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def done_runs(rows: list[dict]) -> set[Run]:
    """The runs that rows read back from the CSV (:func:`read_rows`) finished."""
    shared = {"True": True, "False": False, "": None}
    return {
        Run(r["task"], r["method"], int(r["seed"]), shared[r["shared"]], r["convention"])
        for r in rows
        if r["status"] == "ok"
    }


def read_rows(path: Path) -> list[dict]:
    with path.open() as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r["convention"] = r["convention"] or None
    return rows


# ------------------------------------------------------------------------------------------ main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = make_parser(__doc__)
    parser.add_argument("--prepare", type=Path, help="write the carried data into DIR and exit")
    parser.add_argument("--data", type=Path, help="the prepared data (--prepare DIR)")
    parser.add_argument("--out", type=Path, help="where the results go")
    parser.add_argument(
        "--report", action="store_true", help="only rewrite the report from OUT's CSV"
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--tasks",
        nargs="+",
        default=list(GRID_TASKS),
        choices=list(TASKS),
        help="the grid's tasks by default; tower1m is issue 51's 1M-item task",
    )
    parser.add_argument(
        "--conventions", nargs="+", default=list(CONVENTIONS), choices=list(CONFIGURATIONS)
    )
    parser.add_argument(
        "--references",
        nargs="*",
        default=list(REFERENCES),
        choices=REFERENCES,
        help="the reference methods to train (none: only the sampled cells; GCIDE's full "
        "softmax takes about 4 s a step on one CPU thread)",
    )
    parser.add_argument(
        "--cells",
        nargs="+",
        default=[cell_name(*c) for c in CELLS],
        choices=[cell_name(*c) for c in CELLS],
        help='the sampled cells to train, by name (e.g. "uniform, per query"); all by default',
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--workers", type=int, default=2, help="runs at once")
    parser.add_argument("--deadline-s", type=float, help="start no run after this many seconds")
    parser.add_argument("--commit", help="the commit, where git cannot tell")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep OUT's finished runs (estimator_grid.csv) and run only the others",
    )
    parser.add_argument("--tiny", action="store_true", help="4 batches of one epoch: a dry run")
    parser.add_argument(
        "--gcide-steps",
        type=int,
        default=GCIDE_STEPS,
        help="with --prepare: GCIDE's training prefix in windows (0: the whole split, 8,581)",
    )
    parser.add_argument(
        "--val-every", type=int, help="validate every this many steps (default: the task's)"
    )
    parser.add_argument("--max-steps", type=int, help="stop each run after this many steps")
    parser.add_argument(
        "--curves", type=Path, help="append a row per validation mark to this CSV (issue 51)"
    )
    args = parser.parse_args(argv)
    if args.prepare is None and args.out is None:
        parser.error("give --prepare DIR, or --out DIR (with --data DIR unless --report)")
    if args.prepare is None and not args.report and args.data is None:
        parser.error("--data DIR is needed to train")
    return args


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    if args.prepare is not None:
        written = prepare(args.prepare, args.tasks, args.gcide_steps or None)
        print(f"prepared {args.prepare}: {written}")
        return []
    args.out.mkdir(parents=True, exist_ok=True)
    csv_path = args.out / "estimator_grid.csv"
    if args.report:
        rows = read_rows(csv_path)
        report(rows, args.out, args.tiny)
        return rows
    info = versions(args.commit)
    stamp = {key: info[key] for key in STAMP}
    schedule = Schedule(
        args.val_every,
        args.max_steps,
        None if args.curves is None else str(args.curves),
        tuple(stamp.items()),
    )
    rows: list[dict] = []
    if args.resume and csv_path.is_file():
        rows = [r for r in read_rows(csv_path) if r["status"] == "ok"]
    done = done_runs(rows)
    cells = tuple(c for c in CELLS if cell_name(*c) in args.cells)
    plan = runs(args.tasks, args.conventions, args.seeds, args.references, cells)
    plan = [run for run in plan if run not in done]
    print(f"estimator_grid: {len(plan)} runs to do, {len(done)} done before", flush=True)
    for run in plan:  # the references (--references) come first: say so before hours go there
        print(f"  to do: {run_label(run.task, run.cell, run.convention, run.seed)}", flush=True)
    begin = time.perf_counter()
    pending: set[Future] = set()
    context = get_context("spawn")
    with ProcessPoolExecutor(args.workers, mp_context=context) as pool:
        queue = list(plan)
        while queue or pending:
            late = args.deadline_s is not None and time.perf_counter() - begin > args.deadline_s
            while queue and len(pending) < args.workers and not late:
                run = queue.pop(0)
                pending.add(
                    pool.submit(run_one, run, str(args.data), args.device, args.tiny, schedule)
                )
            if late and queue:
                print(f"deadline: {len(queue)} runs not started", flush=True)
                rows += [{**asdict(r), "cell": r.cell, "status": "not started"} for r in queue]
                queue = []
            if not pending:
                break
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                row = {
                    **future.result(),
                    **stamp,
                    "finished": time.strftime("%FT%TZ", time.gmtime()),
                }
                rows.append(row)
                label = run_label(row["task"], row["cell"], row["convention"], row["seed"])
                print(
                    f"[{time.perf_counter() - begin:6.1f} s] {label}: {row['status']} "
                    f"val {row.get('val', '')} test {row.get('test', '')} ({row['wall_s']} s)",
                    flush=True,
                )
                write_rows(rows, csv_path)
    report(rows, args.out, args.tiny)
    print(f"estimator_grid: {time.perf_counter() - begin:.0f} s; results in {args.out}")
    return rows


if __name__ == "__main__":
    main()
