"""Quality per step and cost per step, combined into time to quality (issue 51): GCIDE and a
1M-item task (:data:`REPORTED`, one :class:`TaskReport` each).

GCIDE (``recipes/configs/lstm_gcide.yaml``: a tied LSTM LM over 108,620 words, 32 x 35 tokens a
step, whose batch covers 381.6 distinct targets on average, 0.35% of the vocabulary) trained by
``benchmarks.estimator_grid`` (its ``gcide`` task with ``--gcide-steps 0``: the whole training
split, 8,581 windows, one epoch, in the recipe's order) under each configuration of :data:`RUNS`,
20 negatives per query, seed 0 (further seeds ``k`` of a configuration in
``curves/<name>.s<k>.csv``), validated exactly (perplexity over all 108,620 words, the first
10,000 validation tokens) every ``--val-every`` steps, each mark written as it happens to
``curves/<name>.csv`` (``--curves``), the best mark's test perplexity in ``runs.csv``. The report
shows each configuration's mean over its seeds with their standard deviation, and checks issue
51's rule that every configuration within 5% of the best has 3 seeds (:func:`seed_targets`).

Two axes, measured apart:

- **quality per step** (the curves): does not depend on the machine's load, so the runs train two
  at a time beside other work;
- **cost per step** (``--measure``): every configuration's whole training step (encoder, head,
  backward, clipping, ``LazyAdam``) at GCIDE's shape, one thread, built as the training runs
  build it (:func:`benchmarks.estimator_grid.build_model`), timed **round-robin**
  (:func:`benchmarks.recipe_time_to_quality.train_step`): in each of ``--rounds`` rounds every
  configuration in turn takes ``--steps`` steps on the same real batches; the median is kept.
  A configuration with an index (MIDX) also has one ``IndexRefresh.refresh`` timed per round.

Time to a perplexity = the first mark's step that reaches it x the median step time + the index
refreshes before it (``IndexRefresh``'s schedule) x their median time: training time only,
validation excluded, an upper bound at the marks' resolution (no interpolation), on this CPU with
one thread. ``quality_per_cost.md`` is written from the CSVs by ``--report``, never by hand.

Run (``MALLOC``: the allocator settings of :data:`ALLOCATOR`)::

    python -m benchmarks.estimator_grid --prepare DATA --tasks gcide --gcide-steps 0
    OMP_NUM_THREADS=1 $MALLOC python -m benchmarks.estimator_grid --data DATA --out RUN_OUT \\
        --tasks gcide --references --cells "uniform, per query" \\
        --conventions corrected_all+batch --seeds 0 --workers 1 --val-every 1000 \\
        --curves benchmarks/results/quality_per_cost/curves/default_uniform.csv   # each of RUNS
    python -m benchmarks.quality_per_cost --collect RUN_OUT ...   # runs.csv from the runs' rows
    OMP_NUM_THREADS=1 $MALLOC python -m benchmarks.quality_per_cost --measure --data DATA
    python -m benchmarks.quality_per_cost --report

The 1M-item task (:data:`TOWER`: ``estimator_grid``'s ``tower1m``, SASRec over 1,000,000
synthetic items through a candidate tower, higher NDCG@10 is better) is run the same way with
``--tasks tower1m`` (no allocator settings: its tower has no dense ``[N, D]`` gradient), curves
in ``quality_per_cost/tower1m/curves/``, and ``--task tower1m`` for ``--collect`` and
``--measure``; its Targets add issue 51's separation criteria (:func:`separation_targets`).
The small-catalog control, MovieLens-1M SASRec (:data:`SASREC`), is the estimator grid's own
runs: ``--from-grid --task sasrec --data DATA`` writes their curves (each epoch's validation at
the step that ends it) into ``quality_per_cost/sasrec/``.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_sampled.callbacks import IndexRefresh

from . import common
from .estimator_grid import (
    TASKS,
    Run,
    build_model,
    candidates_per_position,
    load_task,
    method_of,
    read_rows,
    write_rows,
)
from .recipe_time_to_quality import (
    HeadSpec,
    Timed,
    first_reaching,
    refresh_schedule,
    refreshes_before,
    train_step,
    training_seconds,
)
from .time_to_quality import recipe

#: the configurations of issue 51 on GCIDE (and issue 52's bounded default), in priority order:
#: name -> the grid's run
RUNS: dict[str, Run] = {
    "default_uniform": Run("gcide", "uniform", 0, False, "corrected_all+batch"),
    "default_midx": Run("gcide", "midx_rq", 0, False, "corrected_all+batch"),
    "plain_uniform": Run("gcide", "uniform", 0, False, "corrected_all"),
    "plain_midx": Run("gcide", "midx_rq", 0, False, "corrected_all"),
    "matched_shared": Run("gcide", "uniform", 0, True, "corrected_all@400"),
    "exact_positive_batch": Run("gcide", "uniform", 0, False, "exact_positive+batch"),
    "batch_only": Run("gcide", "uniform", 0, False, "batch_only"),
    "grouped_uniform": Run("gcide", "uniform", 0, False, "corrected_all+rows256g32"),
    "cane_reference": Run("gcide", "cane", 0),
}
#: what each configuration is, in words
LABELS = {
    "default_uniform": "default (corrected_all + in-batch), uniform per query",
    "default_midx": "default (corrected_all + in-batch), MIDX-rq per query",
    "plain_uniform": "corrected_all, uniform per query",
    "plain_midx": "corrected_all, MIDX-rq per query",
    "matched_shared": "matched control: corrected_all, 400 shared uniform draws",
    "exact_positive_batch": "exact_positive + in-batch, uniform per query",
    "batch_only": "in-batch negatives alone (no draws)",
    "grouped_uniform": "bounded default: 256 in-batch draws per 32 rows, uniform per query",
    "cane_reference": "CANE (4 beam-search candidates + 16 uniform noises per query)",
}
#: GCIDE's training steps in one epoch (the whole split as 32 rows of 35-token windows)
EPOCH_STEPS = 8581
#: the perplexities whose time to reach the report tabulates
PPL_TARGETS = (60.0, 40.0, 30.0, 25.0, 22.0, 20.0)
OUT = common.RESULTS_DIR / "quality_per_cost"
REPORT = common.RESULTS_DIR / "quality_per_cost.md"
GRID_CSV = common.RESULTS_DIR / "estimator_grid" / "estimator_grid.csv"
#: the only GCIDE full-softmax run recorded (no converged reference exists)
FULL_REFERENCE = (
    "`recipes/results/gcide.md` (`gcide_full.*`): the full softmax trained 30 steps "
    "(what 8 minutes afforded on this CPU), val ppl 451.8, test ppl 606.1. The estimator grid "
    "(`benchmarks/results/estimator_grid/estimator_grid.csv`) has no GCIDE full-softmax row "
    "(its GCIDE task ran with `--references` empty: about 3-4 s a step here)"
)
#: the glibc malloc settings of the runs and the timing (numerics unchanged)
ALLOCATOR = (
    "`MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=100000000000 MALLOC_TOP_PAD_=1000000000`: "
    "without them the table's dense 108,620 x 256 gradient (111 MB) is mmapped and "
    "page-faulted afresh every step (the default's step took 2.18 s against 1.49 s with them, "
    "median of 15 steps each, back to back under the same load of about 4.7)"
)
NOT_SHOWN = (
    "no converged full-softmax reference on GCIDE (the only full-softmax run is 30 steps, "
    "val ppl 451.8); every ratio to the best here is between sampled heads",
    "no GPU column: the step costs are one CPU thread; a GPU's ranking of step costs can invert "
    "(the default's `[T, U]` product is cheap there)",
    "one learning rate (the recipe's, 0.002) for every head: no equal tuning budget yet",
    "MovieLens-1M SASRec, PTB and the crossover in N of issue 51: not yet",
    "TAPAS, CANE and One-vs-Each on GCIDE: not run here",
)


@dataclass(frozen=True)
class TaskReport:
    """One task's part of the report: its configurations (name -> the grid's run, and in words),
    where its CSVs live under ``OUT`` (``folder``), and how its metric reads.

    Attributes:
        targets: the metric values whose time to reach the report tabulates.
        digits: decimals of the metric in the tables.
    """

    key: str
    title: str
    runs: dict[str, Run]
    labels: dict[str, str]
    epoch_steps: int
    higher_is_better: bool
    metric: str
    targets: tuple[float, ...]
    digits: int
    folder: str
    plot_name: str
    lines: tuple[str, ...]
    reference: str
    not_shown: tuple[str, ...]
    separation: bool = False


GCIDE = TaskReport(
    key="gcide",
    title="GCIDE",
    runs=RUNS,
    labels=LABELS,
    epoch_steps=EPOCH_STEPS,
    higher_is_better=False,
    metric="ppl",
    targets=PPL_TARGETS,
    digits=2,
    folder="",
    plot_name="gcide_val_ppl.png",
    lines=(
        "task: GCIDE, `recipes/configs/lstm_gcide.yaml` (tied LSTM LM, D = 256, LazyAdam lr "
        "0.002, clip 0.25), 108,620 words, 32 x 35 = 1,120 tokens a step; the whole training "
        f"split in the recipe's order, {EPOCH_STEPS:,} steps = one epoch; validation: exact "
        "perplexity over all 108,620 words on the first 10,000 validation tokens at every mark",
        "allocator: runs and step costs under " + ALLOCATOR,
    ),
    reference=FULL_REFERENCE,
    not_shown=NOT_SHOWN,
)


def same_runs(task: str, *names: str) -> dict[str, Run]:
    """GCIDE's configurations ``names`` (:data:`RUNS`) on the grid's ``task``."""
    return {n: Run(task, RUNS[n].method, 0, RUNS[n].shared, RUNS[n].convention) for n in names}


#: the grid's configurations of MovieLens-1M SASRec that the report shows (and its full softmax)
SASREC_NAMES = ("default_uniform", "default_midx", "plain_uniform", "plain_midx", "grouped_uniform")
#: the configurations trained on tower1m
TOWER_NAMES = ("default_uniform", "plain_uniform", "plain_midx", "grouped_uniform")
#: tower1m's training steps in one epoch (50,000 users' windows, 390 whole batches of 128)
TOWER_EPOCH_STEPS = 390
#: the most-popular ranking's NDCG@10 on tower1m's data (the same 2,000 users and items as
#: ``sasrec_synthetic-1m.yaml``'s: ``recipes/results/synthetic_1m.md``), validation and test
POPULARITY_NDCG = {"val": 0.0315, "test": 0.0395}
TOWER = TaskReport(
    key="tower1m",
    title="1M items through a candidate tower",
    runs=same_runs("tower1m", *TOWER_NAMES),
    labels={n: LABELS[n] for n in TOWER_NAMES},
    epoch_steps=TOWER_EPOCH_STEPS,
    higher_is_better=True,
    metric="NDCG@10",
    targets=(0.04, 0.06, 0.08, 0.10, 0.12),
    digits=4,
    folder="tower1m",
    plot_name="tower1m_val_ndcg.png",
    lines=(
        "task: `tower1m` of `benchmarks.estimator_grid`: "
        "`recipes/configs/sasrec_synthetic-1m-tower.yaml`, SASRec (D = 64, 2 blocks, LazyAdam "
        "lr 0.001) over 1,000,000 synthetic items whose vectors, the inputs' and the "
        "candidates', come from a candidate tower (`recipes.towers.ItemTower`: each item's "
        "noisy latent vector, its cluster and its training-count bucket); 50,000 users, "
        f"batches of 128 users, 47 targets each (6,016 positions, about 4,555 distinct), "
        f"{TOWER_EPOCH_STEPS} steps = one epoch, 3 epochs; validation: exact NDCG@10 over all "
        "1M items (each user's history excluded) for the first 2,000 users, every 195 steps",
        "popularity ranking (most popular unseen items, `recipes/results/synthetic_1m.md`): "
        f"val NDCG@10 {POPULARITY_NDCG['val']}, test {POPULARITY_NDCG['test']}; the "
        "generator's own next-item distribution: val 0.1585, test 0.1591",
    ),
    reference=(
        "no full-softmax run: its step scores 6,016 x 1M products (about 156 s a step on this "
        "CPU with the table model, `recipes/results/synthetic_1m.md`)"
    ),
    not_shown=(
        "no GPU column: the step costs are one CPU thread",
        "one learning rate (the recipe's, 0.001) for every head: no equal tuning budget yet",
        "no full-softmax reference (the exact head is about 200x a sampled step here)",
    ),
    separation=True,
)
#: MovieLens-1M SASRec as the grid trained it (67 steps an epoch, 10 epochs), from its CSV
SASREC = TaskReport(
    key="sasrec",
    title="MovieLens-1M SASRec (small-catalog control)",
    runs=same_runs("sasrec", *SASREC_NAMES) | {"full": Run("sasrec", "full", 0)},
    labels={n: LABELS[n] for n in SASREC_NAMES} | {"full": "full softmax (exact, chunked)"},
    epoch_steps=67,
    higher_is_better=True,
    metric="NDCG@10",
    targets=(0.06, 0.08, 0.10, 0.11),
    digits=4,
    folder="sasrec",
    plot_name="sasrec_val_ndcg.png",
    lines=(
        "task: `sasrec` of `benchmarks.estimator_grid`: `recipes/configs/sasrec_ml-1m.yaml`, "
        "SASRec over MovieLens-1M's 3,706 items (a batch's targets cover most of them), 100 "
        "negatives per query, 10 epochs of 67 steps, validated exactly after every epoch",
        "marks: the grid's own runs (`benchmarks/results/estimator_grid/estimator_grid.csv`, "
        "each epoch's validation in `val_by_epoch`), converted by `--from-grid`: the plain "
        "conventions and the full softmax ran on an H200, the default and its bounded form on "
        "this CPU (quality per step does not depend on the machine; the seconds do, and are "
        "not used here)",
    ),
    reference=(
        "the full softmax's own curve above (the grid's, 10 epochs; sampled heads end above "
        "it, so it is not a converged reference)"
    ),
    not_shown=(
        "one learning rate (the recipe's) for every head",
        "no GPU column of step costs",
    ),
)
#: every task of the report, in its order
REPORTED = {task.key: task for task in (GCIDE, TOWER, SASREC)}


# ------------------------------------------------------------------------------------ the runs
def collect(run_dirs: Sequence[Path], out: Path = OUT) -> list[dict]:
    """``out/runs.csv``: the ``estimator_grid.csv`` rows of the runs in ``run_dirs``, each named
    after its folder (a name of :data:`RUNS`)."""
    rows = []
    for folder in run_dirs:
        for row in read_rows(folder / "estimator_grid.csv"):
            rows.append({"name": folder.name, **row})
    out.mkdir(parents=True, exist_ok=True)
    write_rows(rows, out / "runs.csv")
    return rows


def curves_from_grid(
    task: TaskReport, data_dir: str, grid_csv: Path = GRID_CSV, out: Path = OUT
) -> list[Path]:
    """Curves of ``task``'s configurations from the grid's finished runs (each epoch's
    validation, ``val_by_epoch``, at the step that ends the epoch), and their test values in
    ``runs.csv``, under ``out/<task.folder>``: seed ``k > 0`` as ``<name>.s<k>.csv``. The
    candidates per position come from one epoch of the task's training batches (``data_dir``,
    as ``estimator_grid --prepare`` writes it)."""
    data = load_task(data_dir, task.key, "cpu", False)
    batches = list(data.train(0))
    distinct = statistics.fmean(
        float(b["target"][b["target"] > 0].unique().numel()) for b in batches
    )
    wanted = {
        (r.method, r.cell if r.convention else "", r.convention or ""): n
        for n, r in task.runs.items()
    }
    folder = out / task.folder
    (folder / "curves").mkdir(parents=True, exist_ok=True)
    written, runs = [], []
    for row in read_csv(grid_csv):
        key = (row["method"], row["cell"] if row["convention"] else "", row["convention"])
        name = wanted.get(key)
        if row["task"] != task.key or row["status"] != "ok" or name is None:
            continue
        run = task.runs[name]
        values = json.loads(row["val_by_epoch"])
        every = int(row["steps"]) // len(values)
        candidates = round(candidates_per_position(run, distinct, data.num_classes), 1)
        points = [
            {
                "task": task.key,
                "configuration": run.convention or run.method,
                "proposal": run.cell,
                "seed": row["seed"],
                "step": every * (i + 1),
                "val": value,
                "metric": row["metric"],
                "wall_s": "nan",
                "candidates": candidates,
                "distinct_targets": round(distinct, 1),
                **{key: row.get(key, "?") for key in ("machine", "torch", "driver", "commit")},
            }
            for i, value in enumerate(values)
        ]
        suffix = "" if row["seed"] == "0" else f".s{row['seed']}"
        path = folder / "curves" / f"{name}{suffix}.csv"
        write_rows(points, path)
        written.append(path)
        runs.append({"name": f"{name}{suffix}", **row})
    write_rows(runs, folder / "runs.csv")
    return written


def read_csv(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    with path.open() as f:
        return list(csv.DictReader(f))


# ---------------------------------------------------------------------------------- step costs
def measure(
    names: Sequence[str],
    data_dir: str,
    rounds: int,
    steps: int,
    threads: int = 1,
    task: TaskReport = GCIDE,
) -> list[dict[str, Any]]:
    """Every configuration's median training step (and index refresh), round-robin, at
    ``task``'s shape."""
    common.set_threads(threads)
    data = load_task(data_dir, task.key, "cpu", False)
    loader = iter(data.train(0))
    batches = [next(loader) for _ in range(1 + rounds * steps)]
    distinct = statistics.fmean(float(b["target"].unique().numel()) for b in batches)
    clip = recipe(TASKS[task.key]["config"])["trainer"].get("gradient_clip_val")  # by norm
    with common.measured_load() as load:
        timed: dict[str, Timed] = {}
        for name in names:
            run = task.runs[name]
            m = method_of(run)
            model = build_model(run, data, m).train()
            refresh = next((c for c in m.make_callbacks() if isinstance(c, IndexRefresh)), None)
            item = Timed(
                HeadSpec(name, run.convention or ""),
                model,
                model.configure_optimizers(),
                clip,
                "norm",
                refresh,
                [],
                [],
            )
            if refresh is not None:
                item.first_refresh_s = refresh.refresh(model)[0]
            train_step(item, batches[0], 0)  # warm-up, not timed
            timed[name] = item
            print(f"built {name}", flush=True)
        for r in range(rounds):
            for item in timed.values():
                for i in range(steps):
                    index = 1 + r * steps + i
                    item.steps.append(train_step(item, batches[index], index))
                if item.refresh is not None:
                    item.refreshes.append(item.refresh.refresh(item.model)[0])
            print(f"round {r + 1}/{rounds} done", flush=True)
    return [
        {
            "name": name,
            "configuration": task.runs[name].convention,
            "proposal": task.runs[name].cell,
            "candidates": round(
                candidates_per_position(task.runs[name], distinct, data.num_classes), 1
            ),
            "median_step_s": statistics.median(item.steps),
            "min_step_s": min(item.steps),
            "max_step_s": max(item.steps),
            "steps_timed": len(item.steps),
            "rounds": rounds,
            "refresh_s": statistics.median(item.refreshes) if item.refreshes else 0.0,
            "schedule": json.dumps(refresh_schedule(item.refresh)),
            "threads": threads,
            "load_start": load.start,
            "load_end": load.end,
        }
        for name, item in timed.items()
    ]


def write_step_costs(rows: Sequence[dict], out: Path = OUT, commit: str | None = None) -> Path:
    """``out/step_cost.csv`` with the machine, torch version and commit on every row."""
    stamp = common.provenance()
    if commit:
        stamp["commit"] = commit
    out.mkdir(parents=True, exist_ok=True)
    path = out / "step_cost.csv"
    write_rows([{**r, **stamp} for r in rows], path)
    return path


# ------------------------------------------------------------------------------------ the report
def seeds_by_name(out: Path, task: TaskReport = GCIDE) -> dict[str, dict[str, list[dict]]]:
    """Each configuration's runs by seed: ``out/curves/<name>.csv`` and ``<name>.s<k>.csv``
    (another seed of the same configuration; a file may also hold several seeds, as one
    ``estimator_grid --seeds`` call writes them), each run's marks in step order, values as
    numbers, in ``task``'s order of configurations."""
    runs: dict[str, dict[str, list[dict]]] = {}
    for path in sorted((out / "curves").glob("*.csv")):
        name = path.stem.split(".")[0]
        for r in read_csv(path):
            point = {
                **r,
                "step": int(r["step"]),
                "value": float(r["val"]),
                "wall_s": float(r["wall_s"]),
            }
            runs.setdefault(name, {}).setdefault(r["seed"], []).append(point)
    for seeds in runs.values():
        for curve in seeds.values():
            curve.sort(key=lambda p: p["step"])
    order = list(task.runs)
    return dict(sorted(runs.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else 99))


def mean_curve(seeds: dict[str, list[dict]]) -> list[dict]:
    """One configuration's marks over its seeds: at each step any seed reached, ``value`` the
    mean over the seeds that reached it, ``sd`` their sample standard deviation (0 for one) and
    ``seeds`` how many; the other fields from the first seed's mark."""
    at: dict[int, list[dict]] = {}
    for curve in seeds.values():
        for point in curve:
            at.setdefault(point["step"], []).append(point)
    marks = []
    for _, points in sorted(at.items()):
        values = [p["value"] for p in points]
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        marks.append(
            {**points[0], "value": statistics.fmean(values), "sd": spread, "seeds": len(values)}
        )
    return marks


def shortfall(value: float, best: float, task: TaskReport) -> float:
    """How much worse ``value`` is than ``best``, relative (0 for the best itself)."""
    return 1.0 - value / best if task.higher_is_better else value / best - 1.0


def seed_targets(
    curves: dict[str, list[dict]], lead: float = 0.05, wanted: int = 3, task: TaskReport = GCIDE
) -> list[str]:
    """Issue 51's seed rule at the last mark two configurations share: every configuration
    within ``lead`` of the best mean there has ``wanted`` seeds; one line each, "met" or "NOT
    met"."""
    steps = [p["step"] for c in curves.values() for p in c]
    shared = [s for s in set(steps) if steps.count(s) >= 2]
    if not shared:
        return ["- seeds: no mark two configurations share"]
    mark = max(shared)
    values = {n: p for n, c in curves.items() for p in c if p["step"] == mark}
    best = (max if task.higher_is_better else min)(p["value"] for p in values.values())
    lines = []
    for name, point in values.items():
        gap = shortfall(point["value"], best, task)
        if gap <= lead:
            verdict = "met" if point["seeds"] >= wanted else "NOT met"
            word = "below" if task.higher_is_better else "above"
            lines.append(
                f"- step {mark:,}: {task.labels.get(name, name)} is {100 * gap:.1f}% {word} the "
                f"best mean ({point['value']:.{task.digits}f} vs {best:.{task.digits}f}): "
                f"{point['seeds']} of {wanted} seeds: " + verdict
            )
    return lines


def separation_targets(
    curves: dict[str, list[dict]], task: TaskReport = TOWER, sds: float = 5.0
) -> list[str]:
    """Issue 51's two criteria for a 1M-item task that separates the heads: the best mean at
    least twice the popularity ranking's validation NDCG@10, and the best ahead of the plain
    uniform head by more than ``sds`` seed standard deviations (the larger of the two
    configurations'; unknown with one seed). Judged at the last mark that every configuration
    with several seeds reached with all of them (the last mark of all where none has several),
    among the configurations that reached it."""
    if not curves:
        return ["- separation: no runs yet"]
    seeded = [c for c in curves.values() if max(p["seeds"] for p in c) > 1]
    if seeded:
        mark = min(
            max(p["step"] for p in c if p["seeds"] == max(q["seeds"] for q in c)) for c in seeded
        )
    else:
        mark = min(c[-1]["step"] for c in curves.values())
    at = {n: next((p for p in c if p["step"] == mark), None) for n, c in curves.items()}
    at = {n: p for n, p in at.items() if p is not None}
    name, best = max(at.items(), key=lambda kv: kv[1]["value"])
    digits, label = task.digits, task.labels.get(name, name)
    floor = 2 * POPULARITY_NDCG["val"]
    verdict = "met" if best["value"] >= floor else "NOT met"
    lines = [
        f"- step {mark:,}: the best, {label}, has val NDCG@10 {best['value']:.{digits}f} "
        f"against twice the popularity ranking's {floor:.{digits}f}: {verdict}"
    ]
    uniform = at.get("plain_uniform")
    if uniform is None or name == "plain_uniform":
        return [*lines, "- the best ahead of plain uniform by 5 seed sds: not measurable yet"]
    gap = best["value"] - uniform["value"]
    known = [p["sd"] for p in (best, uniform) if p["seeds"] > 1]
    if not known:
        return [*lines, f"- the best ahead of plain uniform by {gap:.{digits}f}: one seed each"]
    sd = max(known)
    verdict = "met" if gap > sds * sd else "NOT met"
    if len(known) < 2:
        verdict += " (one side has one seed: its sd is unknown)"
    return [
        *lines,
        f"- the best ahead of plain uniform ({uniform['value']:.{digits}f}, "
        f"{uniform['seeds']} seeds) by {gap:.{digits}f} = {gap / sd:.1f} seed sds "
        f"(sd {sd:.{digits}f}), against {sds:g}: {verdict}",
    ]


def reach_s(
    curve: Sequence[dict], target: float, cost: dict | None, task: TaskReport = GCIDE
) -> tuple[int, float] | None:
    """``(step, seconds)``: the first mark at least as good as ``target`` and its training time
    from the step cost (``None``: not reached, or no step cost)."""
    point = first_reaching(curve, target, higher_is_better=task.higher_is_better)
    if point is None or cost is None:
        return None
    schedule = json.loads(cost["schedule"]) if cost.get("schedule") else None
    refreshes = refreshes_before(point["step"], task.epoch_steps, schedule)
    seconds = training_seconds(
        point["step"], float(cost["median_step_s"]), refreshes, float(cost["refresh_s"])
    )
    return point["step"], seconds


def grid_at_2000(grid_csv: Path = GRID_CSV) -> dict[tuple[str, str], float]:
    """The estimator grid's GCIDE seed-0 runs (2,000-step prefix): the last validation (step
    2,000), by (cell, convention)."""
    found = {}
    for r in read_csv(grid_csv):
        if r["task"] == "gcide" and r["seed"] == "0" and r["status"] == "ok" and r["convention"]:
            found[(r["cell"], r["convention"])] = json.loads(r["val_by_epoch"])[-1]
    return found


def report(out: Path = OUT, path: Path = REPORT, grid_csv: Path = GRID_CSV) -> Path:
    """``quality_per_cost.md`` and a plot per task from ``out``'s CSVs (GCIDE's in ``out``,
    each other task's in ``out/<folder>``)."""
    lines = ["# Quality per step and cost per step (issue 51)", ""]
    lines += [
        "Generated by `python -m benchmarks.quality_per_cost --report` from the CSVs in "
        "`benchmarks/results/quality_per_cost/`; do not edit. Method and commands: the module "
        "docstring of `benchmarks/quality_per_cost.py`. Tasks: "
        + ", ".join(task.title for task in REPORTED.values())
        + ".",
        "",
    ]
    for task in REPORTED.values():
        folder = out / task.folder
        if not seeds_by_name(folder, task):
            lines += [f"## {task.title}", "", "No runs yet.", ""]
            continue
        lines += task_section(task, folder, out.name, grid_csv if task is GCIDE else None)
    path.write_text("\n".join(lines).rstrip() + "\n")
    return path


def task_section(task: TaskReport, out: Path, root: str, grid_csv: Path | None) -> list[str]:
    """One task's part of the report (and its plot, ``out/<plot_name>``)."""
    seeds = seeds_by_name(out, task)
    curves = {name: mean_curve(runs) for name, runs in seeds.items()}
    runs = read_csv(out / "runs.csv")
    costs = {r["name"]: r for r in read_csv(out / "step_cost.csv")}
    loads = read_csv(out / "load_during_runs.csv")
    grid = grid_at_2000(grid_csv) if grid_csv is not None else {}
    points = [p for runs in seeds.values() for c in runs.values() for p in c]
    marks = sorted({p["step"] for p in points})
    lines = [f"## {task.title}", ""]
    lines += [f"- {line}" for line in task.lines]
    lines += [
        "- seeds: " + ", ".join(sorted({p["seed"] for p in points})) + " (a configuration's "
        "marks are the mean over its seeds, ± their sample standard deviation where it has "
        f"several); {TASKS[task.key]['negatives']} drawn negatives per query unless named",
        "- training runs' machine: " + ", ".join(sorted({p["machine"] for p in points})),
        "- torch: " + ", ".join(sorted({p["torch"] for p in points} | _col(costs, "torch"))),
        "- commit: runs "
        + ", ".join(sorted({p["commit"] for p in points}))
        + "; step costs "
        + (", ".join(sorted(_col(costs, "commit"))) or "not measured"),
    ]
    if loads:
        load1 = [float(r["load1"]) for r in loads]
        lines.append(
            f"- load during the runs (1-minute average, {len(load1)} samples from "
            f"{loads[0]['utc']} to {loads[-1]['utc']}): median {statistics.median(load1):.2f}, "
            f"range {min(load1):.2f}-{max(load1):.2f} on 2 cores (trainings of one thread "
            "each, several at a time, beside other work)"
        )
    metric = "perplexity" if task.metric == "ppl" else task.metric
    test = f"test {task.metric} (best mark)"
    grid_column = " grid, step 2,000 (prefix) |" if grid_csv is not None else ""
    lines += ["", f"### Validation {metric} at each step mark", ""]
    lines += [
        "| configuration | seeds | candidates / position | "
        + " | ".join(f"{s:,}" for s in marks)
        + f" | best mark | {test} |{grid_column}",
        "|---|---|---|" + "---|" * len(marks) + "---|---|" + ("---|" if grid_column else ""),
    ]
    for name, curve in curves.items():
        at = {p["step"]: p for p in curve}
        best = (max if task.higher_is_better else min)(curve, key=lambda p: p["value"])
        tests = [float(r["test"]) for r in _runs_of(runs, name) if r.get("test")]
        row = (
            f"| {task.labels.get(name, name)} | {', '.join(sorted(seeds[name]))} | "
            f"{curve[-1]['candidates']} | "
            + " | ".join(_mark(at[s], task.digits) if s in at else "—" for s in marks)
            + f" | {best['step']:,} | "
            + (_values(tests, task.digits) if tests else "— (run not finished)")
            + " |"
        )
        if grid_csv is not None:
            run = task.runs.get(name)
            previous = grid.get((run.cell, run.convention)) if run else None
            row += f" {f'{previous:.2f}' if previous is not None else '—'} |"
        lines.append(row)
    lines += [
        "",
        "Candidates / position: the columns a position's softmax scores, its positive included "
        "(1 + M draws; with in-batch negatives M + the batch's distinct targets, mean over the "
        "batches trained)."
        + (
            " Grid, step 2,000: the same configuration's validation at step 2,000 in "
            "`estimator_grid.csv` (the first 2,000 windows laid out as their own 32 rows, so "
            "different batches from these runs')."
            if grid_csv is not None
            else ""
        )
        + " Reference: "
        + task.reference
        + ".",
        "",
        f"![validation {metric} against steps]({root}/{task.folder + '/' if task.folder else ''}"
        f"{task.plot_name})",
        "",
    ]
    lines += _cost_section(curves, costs, task)
    lines += ["", "### Targets (issue 51)", "", *seed_targets(curves, task=task)]
    if task.separation:
        lines += separation_targets(curves, task)
    lines += ["", "### What this does not show yet", ""]
    untrained = [task.labels[n] for n in task.runs if n not in curves]
    if untrained:
        lines.append(
            "- not trained in this round (the 2-core CPU's time ran out; their step costs are "
            "measured above where the table lists them): " + "; ".join(untrained)
        )
    total = task.epoch_steps * TASKS[task.key]["epochs"]
    short = [
        f"{task.labels.get(name, name)} seed {seed} step {curve[-1]['step']:,}"
        for name, by_seed in seeds.items()
        for seed, curve in sorted(by_seed.items())
        if curve[-1]["step"] < total - 3
    ]
    if short:
        lines.append(
            f"- the whole run ({total:,} steps): runs stopped at " + ", ".join(short) + "; a "
            "configuration's test value is each seed's at its own best mark, whatever its length"
        )
    few = {n: len(r) for n, r in seeds.items() if len(r) < 3}
    if few:
        lines.append(
            "- fewer than 3 seeds: "
            + ", ".join(f"{task.labels.get(n, n)} ({k})" for n, k in few.items())
            + "; a gap between single-seed configurations of a few percent is not a finding"
        )
    lines += [f"- {item}" for item in task.not_shown]
    plot(curves, seeds, out / task.plot_name, task)
    return [*lines, ""]


def _runs_of(runs: list[dict], name: str) -> list[dict]:
    """The finished runs of configuration ``name`` (``runs.csv`` rows named ``name`` or
    ``name.s<k>``; one folder may hold several seeds)."""
    return [r for r in runs if r["name"].split(".")[0] == name and r.get("status") == "ok"]


def _values(values: list[float], digits: int) -> str:
    """Test values: one, or the mean ± sd and the count."""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    mean, sd = statistics.fmean(values), statistics.stdev(values)
    return f"{mean:.{digits}f} ± {sd:.{digits}f} ({len(values)})"


def _mark(point: dict, digits: int = 2) -> str:
    """A mark's cell: the mean, ± the seeds' standard deviation where there are several."""
    if point["seeds"] > 1:
        return f"{point['value']:.{digits}f} ± {point['sd']:.{digits}f}"
    return f"{point['value']:.{digits}f}"


def _col(rows: dict[str, dict], key: str) -> set[str]:
    return {r[key] for r in rows.values() if r.get(key)}


def _cost_section(
    curves: dict[str, list[dict]], costs: dict[str, dict], task: TaskReport = GCIDE
) -> list[str]:
    word = "a perplexity" if task.metric == "ppl" else f"an {task.metric}"
    lines = [f"### Step cost on this CPU (one thread) and time to {word}", ""]
    if not costs:
        return [*lines, "Not measured yet.", ""]
    first = next(iter(costs.values()))
    # the candidates the training runs scored (their marks), where they exist
    columns = {name: curve[-1]["candidates"] for name, curve in curves.items()}
    lines += [
        f"Whole training step at {task.title}'s shape, medians of {first['rounds']} interleaved "
        f"rounds of steps; machine {first['machine']}, torch {first['torch']}, commit "
        f"{first['commit']}; load average (1, 5, 15 min) {first['load_start']} at the start and "
        f"{first['load_end']} at the end of the measurement. Candidates / position: the "
        "training runs' (their marks), else the timed batches'.",
        "",
        "| configuration | candidates / position | median step s | min-max s | refresh s "
        "| epoch s (steps + refreshes) |",
        "|---|---|---|---|---|---|",
    ]
    for name, cost in costs.items():
        schedule = json.loads(cost["schedule"]) if cost.get("schedule") else None
        epoch = training_seconds(
            task.epoch_steps,
            float(cost["median_step_s"]),
            refreshes_before(task.epoch_steps, task.epoch_steps, schedule),
            float(cost["refresh_s"]),
        )
        lines.append(
            f"| {task.labels.get(name, name)} | {columns.get(name, cost['candidates'])} | "
            f"{float(cost['median_step_s']):.3f} | {float(cost['min_step_s']):.3f}-"
            f"{float(cost['max_step_s']):.3f} | {float(cost['refresh_s']):.2f} | {epoch:,.0f} |"
        )
    at_or = "at or above" if task.higher_is_better else "at or below"
    sign = ">=" if task.higher_is_better else "<="
    lines += [
        "",
        f"Time to reach a validation {task.metric if task.metric != 'ppl' else 'perplexity'}: "
        f"the first mark's step {at_or} it x the median step + the index refreshes before it x "
        "their median; training only (validation excluded), an upper bound at the marks' "
        "resolution, one CPU thread. `—`: not reached by the last mark.",
        "",
        "| configuration | "
        + " | ".join(f"{task.metric} {sign} {t:g}" for t in task.targets)
        + " |",
        "|---|" + "---|" * len(task.targets),
    ]
    for name, curve in curves.items():
        cells = []
        for target in task.targets:
            found = reach_s(curve, target, costs.get(name), task)
            cells.append("—" if found is None else f"{found[1] / 60:.1f} min ({found[0]:,} steps)")
        lines.append(f"| {task.labels.get(name, name)} | " + " | ".join(cells) + " |")
    return lines


def plot(
    curves: dict[str, list[dict]],
    seeds: dict[str, dict[str, list[dict]]],
    path: Path,
    task: TaskReport = GCIDE,
) -> None:
    """Validation metric against steps (perplexity on a log scale): per configuration its mean
    over the seeds (``curves``, :func:`mean_curve`) as a line, each seed's marks (``seeds``) as
    faint points."""
    plt = common.pyplot()

    fig, ax = plt.subplots(figsize=(8, 5))
    for i, (name, runs) in enumerate(seeds.items()):
        curve = curves[name]
        ax.plot(
            [p["step"] for p in curve],
            [p["value"] for p in curve],
            marker="o",
            color=f"C{i}",
            label=f"{task.labels.get(name, name)} ({curve[-1]['candidates']} cand., "
            f"{len(runs)} seed{'s' if len(runs) > 1 else ''})",
        )
        if len(runs) > 1:
            marks = [p for run in runs.values() for p in run]
            ax.scatter(
                [p["step"] for p in marks],
                [p["value"] for p in marks],
                s=10,
                color=f"C{i}",
                alpha=0.4,
            )
    points = [p for runs in seeds.values() for run in runs.values() for p in run]
    last = max(p["step"] for p in points)
    names = ", ".join(sorted({p["seed"] for p in points}))
    if task is GCIDE:
        ax.set_yscale("log")
        ax.set_xlabel("training step (32 x 35 tokens)")
        ax.set_ylabel("validation perplexity (exact, 108,620 words)")
        ax.set_title(
            f"GCIDE, steps up to {last:,} of one epoch's {EPOCH_STEPS:,}; seeds {names} "
            "(lines: mean)"
        )
    else:
        ax.axhline(POPULARITY_NDCG["val"], color="grey", linestyle="--", label="popularity")
        ax.set_xlabel(f"training step ({task.epoch_steps} an epoch)")
        ax.set_ylabel(f"validation {task.metric} (exact, all items)")
        ax.set_title(f"{task.title}, steps up to {last:,}; seeds {names} (lines: mean)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    common.save_figure(fig, path, dpi=100)


# ------------------------------------------------------------------------------------------ main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = common.make_parser(__doc__)
    parser.add_argument("--collect", nargs="+", type=Path, help="runs' --out folders -> runs.csv")
    parser.add_argument(
        "--from-grid",
        action="store_true",
        help="the task's curves and runs.csv from the estimator grid's CSV (needs --data)",
    )
    parser.add_argument("--measure", action="store_true", help="time every configuration's step")
    parser.add_argument("--report", action="store_true", help="write the report from the CSVs")
    parser.add_argument("--data", help="the prepared data (estimator_grid --prepare)")
    parser.add_argument(
        "--task",
        default="gcide",
        choices=list(REPORTED),
        help="the task whose runs --collect and --measure take (its CSVs in OUT/<folder>)",
    )
    parser.add_argument(
        "--names",
        nargs="+",
        choices=sorted({n for t in REPORTED.values() for n in t.runs}),
        help="the configurations to --measure (default: all of the task's)",
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3, help="steps per block")
    common.add_threads_argument(parser)
    parser.add_argument("--commit", help="the commit, where git cannot tell")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if (args.measure or args.from_grid) and not args.data:
        parser.error("--measure and --from-grid need --data")
    task = REPORTED[args.task]
    args.names = args.names or list(task.runs)
    unknown = [n for n in args.names if n not in task.runs]
    if unknown:
        parser.error(f"{args.task} has no configuration {', '.join(unknown)}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    task = REPORTED[args.task]
    folder = args.out / task.folder
    if args.collect:
        print(f"collected {len(collect(args.collect, folder))} rows")
    if args.from_grid:
        print(f"curves: {len(curves_from_grid(task, args.data, out=args.out))} runs")
    if args.measure:
        start = time.perf_counter()
        rows = measure(args.names, args.data, args.rounds, args.steps, args.threads, task)
        path = write_step_costs(rows, folder, args.commit)
        print(f"step costs in {path} ({time.perf_counter() - start:.0f} s)")
    if args.report or not (args.collect or args.measure or args.from_grid):
        print(f"report: {report(args.out, args.out.parent / 'quality_per_cost.md')}")


if __name__ == "__main__":
    main()
