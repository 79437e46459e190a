"""Time to quality on a GPU: each head trains for the same wall-clock budget, validated exactly.

Two tasks, each trained with every method for ``--budget-s`` seconds of training wall time
(validation excluded from that clock), then scored by exact validation and test quality over the
whole vocabulary / catalog:

- ``gcide``: the tied LSTM language model of ``recipes/configs/lstm_gcide.yaml`` (GCIDE, 108,620
  words) at a GPU shape where the output layer dominates the step: 256 x 35 tokens a step,
  embedding = LSTM width = D = 512 (the recipe's other settings: one layer, no dropout, lr 2e-3,
  gradient norm clipped at 0.25). Quality: exact perplexity.
- ``sasrec``: SASRec of ``recipes/configs/sasrec_synthetic-1m.yaml`` on the synthetic 1M-item
  sequences (``recipes.data.synthetic``; D = 64, 2 blocks, 128 users x 50 positions a step, lr
  1e-3). Quality: exact NDCG@10 over all 1,000,000 items, the user's history excluded. The
  generator plants item clusters (and cluster-to-cluster transitions), which MIDX's codebooks
  pick up: its numbers there favour MIDX more than real catalogs may.

Methods (``--methods``): ``exact`` (``FullSoftmaxHead(backend="auto")``, the fastest exact backend),
``cut_cross_entropy`` (``FullSoftmaxHead(backend="cut_cross_entropy")``, CUDA only), ``default``
(``SampledSoftmaxHead`` with the library's defaults: uniform proposal, 100 negatives per position,
dense table gradient, the default convention, ``"corrected_all"`` since issue 31, and the batch's
targets as further negatives, ``in_batch_negatives="auto"``, since issue 31's session 21; the GPU
results of issue 30 ran under ``"exact_positive"`` without them, the defaults then),
``midx_rq`` (the recipes' large-catalog config ``recipes/configs/heads/sparse_midx_rq.yaml``: 20
MIDX-rq negatives, row-sparse gradient, ``IndexRefresh``) and ``mixed``
(``recipes/configs/heads/mixed.yaml``: the batch's targets plus 100 uniform negatives). Every run
starts from the same seed; before its clock starts, a copy of the model takes ``--warmup-steps``
steps (CUDA context, Triton compilation and autotuning, the first index build of that copy) and is
thrown away. Training runs under ``bf16-mixed`` on CUDA, evaluation in fp32; there is no
``torch.compile``.

The GPU machine has neither the network nor Hugging Face ``datasets``, so the data are prepared on
the CPU first (``--prepare DIR``: ``gcide.pt``, the token ids as int32, the training stream cut to
a prefix; ``synthetic.pt``, the generated sequences as int32) and read with ``--data DIR``
(``recipes`` imports its data modules, which need ``datasets``, only when they are used).

Outputs in ``--out DIR``: ``curves.csv`` (task, method, training wall seconds, step, validation
metric), ``final.csv`` (one row per task and method), ``time_to_quality.md`` (provenance, shapes,
budgets, tables and the issue's targets, each "met" / "NOT met") and ``time_to_quality.png``
(validation quality against training wall time, one panel per task); the first three are
rewritten after every run and the plot after every task, so a run cut short leaves what it
finished. ``--deadline-s`` skips the runs that would end after it.

Run: ``python -m benchmarks.time_to_quality --prepare .gpu_data`` (CPU, once), then ``python -m
benchmarks.time_to_quality --data .gpu_data --out OUT --budget-s 15 --deadline-s 280 [--commit
SHA]`` (about 4.5 minutes on one H100); ``--tiny`` shrinks shapes and evaluation for a CPU dry
run.
"""

from __future__ import annotations

import argparse
import copy
import csv
import gc
import importlib
import importlib.metadata
import importlib.util
import logging
import math
import platform
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, fields
from functools import partial
from pathlib import Path
from typing import Any

import lightning as L
import torch
import yaml
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset

from lightning_sampled.heads import FullSoftmaxHead, SampledSoftmaxHead
from lightning_sampled.metrics import Perplexity, evaluate_ranking
from recipes.models import LSTMLanguageModel, SASRec

from .common import gpu_driver, make_parser, provenance, pyplot, save_figure

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "recipes" / "configs"
IGNORE = -100
TASKS = ("gcide", "sasrec")
#: in the order they run: the targets' three first, so a deadline drops the others
METHODS = ("cut_cross_entropy", "default", "mixed", "midx_rq", "exact")
LABELS = {
    "exact": "exact (backend=auto)",
    "cut_cross_entropy": "Cut Cross-Entropy",
    "default": "default sampled (uniform, 100 neg.)",
    "midx_rq": "MIDX-rq (20 neg., sparse)",
    "mixed": "mixed (in-batch + 100 uniform)",
}


# ----------------------------------------------------------------------------- configs, methods
def recipe(name: str) -> dict[str, Any]:
    """A recipe YAML under ``recipes/configs/`` as a dict."""
    return yaml.safe_load((CONFIGS / name).read_text())


def class_from(path: str) -> type:
    """The class named by a config's dotted ``class_path``."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def factory(spec: dict[str, Any] | None) -> Callable | None:
    """A config's ``{class_path, init_args}`` as a factory (``partial`` of the class)."""
    if spec is None:
        return None
    return partial(class_from(spec["class_path"]), **spec.get("init_args", {}))


@dataclass(frozen=True)
class Method:
    """A head (and sampler) factory for the recipes' models, the callbacks it trains with
    (class, kwargs), and whether it needs CUDA."""

    head: Callable
    sampler: Callable | None = None
    callbacks: tuple[tuple[type, dict[str, Any]], ...] = ()
    needs_cuda: bool = False

    def make_callbacks(self) -> list[L.Callback]:
        """Fresh callback instances (``IndexRefresh`` holds its schedule's state)."""
        return [cls(**kwargs) for cls, kwargs in self.callbacks]


def head_config(name: str) -> Method:
    """The method of a head config of ``recipes/configs/heads/`` (its head, its sampler and the
    callbacks it appends with ``trainer.callbacks+``)."""
    spec = recipe(f"heads/{name}.yaml")
    init = spec["model"]["init_args"]
    callbacks = tuple(
        (class_from(c["class_path"]), c.get("init_args", {}))
        for c in spec.get("trainer", {}).get("callbacks+", [])
    )
    return Method(factory(init["head"]), factory(init.get("sampler")), callbacks)


def cut_cross_entropy_head(
    num_classes: int, dim: int, *, padding_idx: int | None = None, **options: Any
) -> FullSoftmaxHead:
    """``FullSoftmaxHead(backend="cut_cross_entropy")`` without ``padding_idx``, which Cut
    Cross-Entropy cannot mask: SASRec's padding item 0 is then scored as an ordinary class in
    its training loss (it is never a target); evaluation never ranks it (:meth:`Task.evaluate`)."""
    return FullSoftmaxHead(num_classes, dim, backend="cut_cross_entropy", **options)


def method(name: str) -> Method:
    """The method called ``name`` (one of :data:`METHODS`)."""
    if name == "exact":
        return Method(partial(FullSoftmaxHead, backend="auto"))
    if name == "cut_cross_entropy":
        return Method(cut_cross_entropy_head, needs_cuda=True)
    if name == "default":
        return Method(SampledSoftmaxHead)
    if name == "midx_rq":
        return head_config("sparse_midx_rq")
    if name == "mixed":
        return head_config("mixed")
    raise ValueError(f"unknown method {name!r}; known: {', '.join(METHODS)}")


# ----------------------------------------------------------------------------------------- data
def prepare(
    out: Path, streams: dict[str, Tensor], num_classes: int, sequences: Tensor, spec: dict
) -> dict[str, Any]:
    """Writes the carried data: ``gcide.pt`` and ``synthetic.pt`` (int32 tensors, ``torch.save``).

    Args:
        out: the folder (created).
        streams: GCIDE token ids by split, ``{"train", "validation", "test"}`` each ``[T]``
            (the training stream already cut to the prefix to carry).
        num_classes: the vocabulary size (of the whole training split).
        sequences: ``[U, L]`` item ids (``1..num_items``) of every synthetic user, in time order.
        spec: the generator's arguments (``num_items`` at least), saved beside the sequences.

    Returns:
        what was written: file sizes in bytes and token / user counts.
    """
    out.mkdir(parents=True, exist_ok=True)
    gcide = {"num_classes": num_classes, **{k: v.to(torch.int32) for k, v in streams.items()}}
    torch.save(gcide, out / "gcide.pt")
    synthetic = {"spec": spec, "sequences": sequences.to(torch.int32)}
    torch.save(synthetic, out / "synthetic.pt")
    sizes = {p.name: p.stat().st_size for p in (out / "gcide.pt", out / "synthetic.pt")}
    tokens = {k: v.numel() for k, v in streams.items()}
    return {"bytes": sizes, "tokens": tokens, "users": sequences.shape[0]}


def prepare_from_recipes(out: Path, train_tokens: int) -> dict[str, Any]:
    """:func:`prepare` from the recipes' data: GCIDE as ``lstm_gcide.yaml`` builds it (fetched
    and tokenised on first use), cut to its first ``train_tokens`` training tokens (validation and
    test whole), and the sequences of ``sasrec_synthetic-1m.yaml``'s generator."""
    from recipes.data.gcide import GCIDE
    from recipes.data.synthetic import SyntheticSpec, generate

    data = GCIDE(min_count=recipe("lstm_gcide.yaml")["data"]["init_args"]["min_count"])
    streams = {split: data.stream(split) for split in ("train", "validation", "test")}
    full = streams["train"].numel()
    streams["train"] = streams["train"][:train_tokens]
    args = recipe("sasrec_synthetic-1m.yaml")["data"]["init_args"]
    spec = SyntheticSpec(**{f.name: args[f.name] for f in fields(SyntheticSpec) if f.name in args})
    sequences, _ = generate(spec)
    info = prepare(out, streams, data.num_classes, torch.from_numpy(sequences), asdict(spec))
    return {**info, "train_tokens_total": full}


def windows(stream: Tensor, rows: int, bptt: int, full_only: bool) -> list[dict[str, Tensor]]:
    """``stream`` ``[T]`` laid out as ``rows`` rows and cut into BPTT windows, as the recipes'
    ``batchify`` does (the remainder after ``rows`` equal rows is dropped).

    Returns:
        windows ``{"input", "target"}`` long ``[rows, <= bptt]``, target = input shifted by one;
        with ``full_only`` only windows of exactly ``bptt`` (fixed training shapes).
    """
    width = stream.numel() // rows
    if width < 2:
        raise ValueError(f"{stream.numel()} tokens are too few for {rows} rows")
    table = stream[: width * rows].view(rows, width).long()
    ends = [(s, min(s + bptt, width - 1)) for s in range(0, width - 1, bptt)]
    return [
        {"input": table[:, s:e], "target": table[:, s + 1 : e + 1]}
        for s, e in ends
        if not full_only or e - s == bptt
    ]


def left_pad(x: Tensor, length: int, value: int) -> Tensor:
    """The last ``length`` columns of ``x`` ``[U, W]``, left-padded with ``value``:
    ``[U, length]``."""
    x = x[:, -length:]
    return torch.nn.functional.pad(x, (length - x.shape[1], 0), value=value)


def leave_one_out(sequences: Tensor, max_len: int) -> dict[str, dict[str, Tensor]]:
    """SASRec's leave-one-out split of equal-length sequences in the recipes' batch format
    (``recipes.data.movielens``: ``leave_one_out``, ``training_windows``, ``collate_eval``).

    Args:
        sequences: ``[U, L]`` item ids in time order, ``L - 3 <= max_len`` (one training window
            per user).
        max_len: the model's input length.

    Returns:
        ``train``: ``{"input", "target"}`` long ``[U, max_len]`` (inputs left-padded with 0,
        targets with ``-100``); ``validation`` / ``test``: ``{"history"}`` ``[U, max_len]``,
        ``{"target"}`` ``[U]``, ``{"exclude"}`` ``[U, L - 2]`` / ``[U, L - 1]`` (the whole
        history, never recommended).
    """
    seq = sequences.long()
    if seq.shape[1] - 3 > max_len:
        raise ValueError(f"sequences of {seq.shape[1]} items need max_len >= {seq.shape[1] - 3}")
    train = seq[:, :-2]
    splits = {
        "train": {
            "input": left_pad(train[:, :-1], max_len, 0),
            "target": left_pad(train[:, 1:], max_len, IGNORE),
        }
    }
    for split, end in (("validation", -2), ("test", -1)):
        history = seq[:, :end]
        splits[split] = {
            "history": left_pad(history, max_len, 0),
            "target": seq[:, end],
            "exclude": history,
        }
    return splits


def row_batches(table: dict[str, Tensor], size: int, limit: int | None = None) -> list[dict]:
    """The first ``limit`` rows of every tensor in ``table`` in batches of ``size`` rows."""
    rows = next(iter(table.values())).shape[0] if limit is None else limit
    return [{k: v[s : min(s + size, rows)] for k, v in table.items()} for s in range(0, rows, size)]


class ShuffledBatches(IterableDataset):
    """Training batches of ``size`` rows of ``table`` (``{name: [W, ...]}``) in a new random
    order every epoch (seeded), the last incomplete batch dropped: fixed step shapes, one gather
    per batch on the tensors' device."""

    def __init__(self, table: dict[str, Tensor], size: int, seed: int) -> None:
        self.table, self.size = table, size
        self.rows = next(iter(table.values())).shape[0]
        if self.rows < size:
            raise ValueError(f"{self.rows} training rows are fewer than a batch of {size}")
        self.generator = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return self.rows // self.size

    def __iter__(self) -> Iterator[dict[str, Tensor]]:
        order = torch.randperm(self.rows, generator=self.generator)
        device = next(iter(self.table.values())).device
        for batch in order[: len(self) * self.size].view(len(self), self.size).to(device):
            yield {k: v[batch] for k, v in self.table.items()}


# ---------------------------------------------------------------------------------------- tasks
@dataclass(frozen=True)
class Shapes:
    """Step and evaluation shapes.

    ``lm_batch`` x ``lm_bptt`` tokens a language-model step at width ``lm_dim``; ``rec_batch``
    users a SASRec step at width ``rec_dim`` with ``rec_blocks`` blocks; exact evaluation on
    ``lm_eval_rows`` rows of the validation / test stream (at most ``lm_eval_tokens`` tokens,
    ``None``: all; the curves on the first ``lm_curve_tokens``) and on ``rec_eval_batch`` users
    a batch (at most ``rec_eval_users``; the curves on the first ``rec_curve_users``).
    """

    lm_batch: int = 256
    lm_bptt: int = 35
    lm_dim: int = 512
    lm_eval_rows: int = 64
    lm_eval_tokens: int | None = None
    lm_curve_tokens: int = 20_000
    rec_batch: int = 128
    rec_dim: int = 64
    rec_blocks: int = 2
    rec_eval_batch: int = 1024
    rec_eval_users: int | None = None
    rec_curve_users: int = 5000


TINY = Shapes(
    lm_batch=4,
    lm_bptt=8,
    lm_dim=16,
    lm_eval_rows=4,
    lm_eval_tokens=2000,
    lm_curve_tokens=1000,
    rec_batch=8,
    rec_dim=16,
    rec_blocks=1,
    rec_eval_batch=64,
    rec_eval_users=200,
    rec_curve_users=100,
)


@dataclass
class Task:
    """One model on one data set: builds the model for a method, gives the training batches and
    scores a model exactly on the evaluation batches.

    Attributes:
        name: ``gcide`` or ``sasrec``.
        metric: the validation quality's name; ``higher_is_better`` its direction.
        describe: the shapes and data in words.
        build: the model of a method, on the CPU.
        train_loader: a fresh loader of the training batches (same order for every run).
        evaluation: batches by ``(split, curve)``: the curves' validation subset under
            ``("validation", True)``, the whole (capped) splits under ``(split, False)``.
        score: the quality of a model on a list of batches, given the model and the head
            that scores it exactly (called in eval mode, no grad).
        gradient_clip_val: the recipe's clipping (``None``: none).
        device: where the batches are and the model is scored.
        padding_idx: the class that is never a target (SASRec's item 0).
    """

    name: str
    metric: str
    higher_is_better: bool
    describe: str
    build: Callable[[Method], L.LightningModule]
    train_loader: Callable[[], DataLoader]
    evaluation: dict[tuple[str, bool], list[dict[str, Tensor]]]
    score: Callable[[L.LightningModule, FullSoftmaxHead, list[dict[str, Tensor]]], float]
    device: torch.device
    gradient_clip_val: float | None = None
    padding_idx: int | None = None

    def evaluate(self, model: L.LightningModule, split: str, curve: bool = False) -> float:
        """Exact quality on ``split`` (the curves' subset when ``curve``), in eval mode and fp32.

        The model is moved to :attr:`device` first (Lightning moves it to the CPU when ``fit``
        ends). Every method is scored alike, whatever backend it trained with: by the chunked
        torch path of a ``FullSoftmaxHead`` tied to the model's class table, which never ranks
        :attr:`padding_idx`."""
        head = model.to(self.device).head
        scorer = FullSoftmaxHead(
            head.num_classes,
            head.dim,
            weight=head.weight,
            bias=False if head.bias is None else head.bias,
            padding_idx=self.padding_idx,
            backend="torch",
        )
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                return self.score(model, scorer, self.evaluation[split, curve])
        finally:
            model.train(was_training)


def gcide_task(data: dict[str, Any], shapes: Shapes, device: torch.device) -> Task:
    """The GCIDE LSTM LM (``lstm_gcide.yaml`` at width ``shapes.lm_dim``) on the prepared
    streams: training on full ``lm_batch x lm_bptt`` windows in order (as the recipe), exact
    perplexity over all ``num_classes`` words on windows of the recipe's ``bptt``."""
    config = recipe("lstm_gcide.yaml")
    model_args = {k: v for k, v in config["model"]["init_args"].items() if k != "head"}
    model_args.update(embedding_dim=shapes.lm_dim, hidden_dim=shapes.lm_dim)
    num_classes = int(data["num_classes"])
    bptt = config["data"]["init_args"]["bptt"]
    stream = {k: data[k].to(device) for k in ("train", "validation", "test")}
    train = windows(stream["train"], shapes.lm_batch, shapes.lm_bptt, full_only=True)
    limits = {
        ("validation", False): shapes.lm_eval_tokens,
        ("test", False): shapes.lm_eval_tokens,
        ("validation", True): min(shapes.lm_curve_tokens, shapes.lm_eval_tokens or math.inf),
    }
    evaluation = {
        (split, curve): windows(stream[split][:limit], shapes.lm_eval_rows, bptt, False)
        for (split, curve), limit in limits.items()
    }

    def build(m: Method) -> L.LightningModule:
        return LSTMLanguageModel(num_classes, head=m.head, sampler=m.sampler, **model_args)

    def score(model: L.LightningModule, head: FullSoftmaxHead, batches: list[dict]) -> float:
        metric = Perplexity().to(device)
        for batch in batches:
            z = model.eval_queries(batch)
            metric.update_from_log_prob(head.log_prob(z, batch["target"]), target=batch["target"])
        return float(metric.compute())

    scored = {key: sum(b["target"].numel() for b in evaluation[key]) for key in evaluation}
    describe = (
        f"GCIDE LSTM LM: {num_classes:,} words, {shapes.lm_batch} x {shapes.lm_bptt} tokens a "
        f"step, D = {shapes.lm_dim} (embedding = LSTM width, tied head, "
        f"{model_args['num_layers']} layer, dropout {model_args['dropout']}, lr "
        f"{model_args['lr']:g}, clip {config['trainer']['gradient_clip_val']}); trained on the "
        f"first {stream['train'].numel():,} of GCIDE's 9,609,703 training tokens ({len(train)} "
        f"windows an epoch, in order); exact perplexity over all words on "
        f"{scored['validation', False]:,} validation / {scored['test', False]:,} test tokens "
        f"(curves: the first {scored['validation', True]:,} validation tokens; "
        f"{shapes.lm_eval_rows} rows, windows of {bptt}, no state carried across windows)"
    )
    return Task(
        name="gcide",
        metric="val_ppl",
        higher_is_better=False,
        describe=describe,
        build=build,
        train_loader=lambda: DataLoader(train, batch_size=None),
        evaluation=evaluation,
        score=score,
        device=device,
        gradient_clip_val=config["trainer"]["gradient_clip_val"],
    )


def sasrec_task(data: dict[str, Any], shapes: Shapes, device: torch.device, seed: int) -> Task:
    """SASRec (``sasrec_synthetic-1m.yaml`` at width ``shapes.rec_dim``) on the prepared synthetic
    sequences, leave-one-out, users shuffled by ``seed``; exact NDCG@10 over all items, the
    user's history excluded."""
    config = recipe("sasrec_synthetic-1m.yaml")
    model_args = {k: v for k, v in config["model"]["init_args"].items() if k != "head"}
    model_args.update(dim=shapes.rec_dim, num_blocks=shapes.rec_blocks)
    num_items = int(data["spec"]["num_items"])
    splits = leave_one_out(data["sequences"].to(device), model_args["max_len"])
    users = splits["validation"]["target"].numel()
    eval_users = min(users, shapes.rec_eval_users or users)
    curve_users = min(eval_users, shapes.rec_curve_users)
    evaluation = {
        (split, curve): row_batches(
            splits[split], shapes.rec_eval_batch, curve_users if curve else eval_users
        )
        for split in ("validation", "test")
        for curve in (False, True)
    }

    def build(m: Method) -> L.LightningModule:
        return SASRec(num_items + 1, head=m.head, sampler=m.sampler, **model_args)

    def score(model: L.LightningModule, head: FullSoftmaxHead, batches: list[dict]) -> float:
        def encode(batch: dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
            return model.eval_queries(batch), batch["target"], batch["exclude"]

        return evaluate_ranking(head, batches, encode, ks=10, metrics="ndcg")["ndcg@10"]

    spec = data["spec"]
    describe = (
        f"SASRec on synthetic sequences: {num_items:,} items in {spec['num_clusters']:,} planted "
        f"clusters (zipf {spec['zipf']:g}, generator seed {spec['seed']}), {users:,} users x "
        f"{spec['seq_len']} items, leave-one-out; {shapes.rec_batch} users x "
        f"{model_args['max_len']} positions a step, D = {shapes.rec_dim}, "
        f"{shapes.rec_blocks} blocks, lr {model_args['lr']:g}, tied head; exact NDCG@10 over all "
        f"items (history excluded) on {eval_users:,} validation / test users (curves: the first "
        f"{curve_users:,})"
    )
    return Task(
        name="sasrec",
        metric="val_ndcg@10",
        higher_is_better=True,
        describe=describe,
        build=build,
        train_loader=lambda: DataLoader(
            ShuffledBatches(splits["train"], shapes.rec_batch, seed), batch_size=None
        ),
        evaluation=evaluation,
        score=score,
        device=device,
        padding_idx=0,
    )


# ------------------------------------------------------------------------------------- training
def synchronize(device: torch.device) -> None:
    """Waits for the device's queued work (CUDA), so that wall time covers it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class TrainingClock(L.Callback):
    """Training wall time without evaluation: validates at ``points`` evenly spaced times of it
    (and before the first step), stops training once it reaches ``budget_s``, and counts the
    training positions (on the device, no sync per step).

    Attributes:
        curve: ``(wall_s, step, value)`` of each validation, ``wall_s`` training seconds.
        train_s: the training seconds when training stopped.
        eval_s: seconds spent validating (not in ``train_s``).
    """

    def __init__(
        self,
        budget_s: float,
        points: int,
        validate: Callable[[L.LightningModule], float],
        device: torch.device,
        padding_idx: int | None,
    ) -> None:
        self.due = [budget_s * (i + 1) / points for i in range(points)]
        self.validate = validate
        self.device = device
        self.padding_idx = padding_idx
        self.curve: list[tuple[float, int, float]] = []
        self.train_s = 0.0
        self.eval_s = 0.0
        self.positions = torch.zeros((), dtype=torch.long, device=device)

    def _record(self, pl_module: L.LightningModule, wall_s: float, step: int) -> None:
        start = time.perf_counter()
        value = self.validate(pl_module)
        synchronize(self.device)
        self.curve.append((wall_s, step, value))
        self.eval_s += time.perf_counter() - start

    def elapsed(self) -> float:
        """Training seconds so far (queued device work not waited for)."""
        return time.perf_counter() - self._start - self.eval_s

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._record(pl_module, 0.0, 0)
        self.eval_s = 0.0
        synchronize(self.device)
        self._start = time.perf_counter()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, i: int
    ) -> None:
        target = batch["target"]
        keep = target != IGNORE
        if self.padding_idx is not None:
            keep &= target != self.padding_idx
        self.positions += keep.sum()
        if trainer.should_stop or self.elapsed() < self.due[0]:
            return
        synchronize(self.device)
        wall_s = self.elapsed()
        self.due = [t for t in self.due if t > wall_s]
        if not self.due:
            self.train_s = wall_s
            trainer.should_stop = True
        self._record(pl_module, wall_s, trainer.global_step)


def make_trainer(
    device: torch.device,
    precision: str,
    callbacks: list[L.Callback],
    gradient_clip_val: float | None,
    root: Path,
    max_steps: int = -1,
) -> L.Trainer:
    """A bare Trainer: no logger, checkpoint, progress bar or validation loop."""
    return L.Trainer(
        accelerator=device.type,
        devices=1,
        precision=precision,
        max_epochs=-1,
        max_steps=max_steps,
        callbacks=callbacks,
        gradient_clip_val=gradient_clip_val,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        default_root_dir=root,
    )


@dataclass
class RunConfig:
    """What every run shares."""

    device: torch.device
    precision: str
    budget_s: float
    points: int
    warmup_steps: int
    seed: int
    root: Path


def train_and_score(task: Task, m: Method, config: RunConfig) -> tuple[dict, list]:
    """Trains ``task``'s model with method ``m`` for the budget and scores it exactly.

    Returns:
        ``(final, curve)``: the final row's measured values and the validation curve
        ``[(wall_s, step, value)]``.
    """
    L.seed_everything(config.seed, verbose=False)
    start = time.perf_counter()
    model = task.build(m)
    if config.warmup_steps:
        warm = copy.deepcopy(model)
        trainer = make_trainer(
            config.device,
            config.precision,
            m.make_callbacks(),
            task.gradient_clip_val,
            config.root,
            max_steps=config.warmup_steps,
        )
        trainer.fit(warm, task.train_loader())
        del warm, trainer
    synchronize(config.device)
    setup_s = time.perf_counter() - start
    L.seed_everything(config.seed, verbose=False)
    clock = TrainingClock(
        config.budget_s,
        config.points,
        lambda module: task.evaluate(module, "validation", curve=True),
        config.device,
        task.padding_idx,
    )
    trainer = make_trainer(
        config.device,
        config.precision,
        [clock, *m.make_callbacks()],
        task.gradient_clip_val,
        config.root,
    )
    trainer.fit(model, task.train_loader())
    start = time.perf_counter()
    val, test = task.evaluate(model, "validation"), task.evaluate(model, "test")
    positions = int(clock.positions)
    final = {
        "steps": trainer.global_step,
        "epochs": trainer.global_step / trainer.num_training_batches,
        "train_s": clock.train_s,
        "positions": positions,
        "positions_per_s": positions / max(clock.train_s, 1e-9),
        "val": val,
        "test": test,
        "setup_s": setup_s,
        "curve_eval_s": clock.eval_s,
        "final_eval_s": time.perf_counter() - start,
        "head": " ".join(str(model.head).split()),
    }
    return final, clock.curve


# -------------------------------------------------------------------------------------- results
def reach_time(curve: list[dict], threshold: float, higher_is_better: bool) -> float | None:
    """The first training time at which a curve's value is at least as good as ``threshold``."""
    for point in curve:
        value = point["value"]
        if value >= threshold if higher_is_better else value <= threshold:
            return point["wall_s"]
    return None


def targets(finals: list[dict], curves: list[dict], budget_s: float) -> list[str]:
    """The issue's targets as Markdown list items: ``"- met: ..."``, ``"- NOT met: ..."``, or
    ``"- not measured: ..."`` where a method it compares did not run."""
    ok = {(r["task"], r["method"]): r for r in finals if r["status"] == "ok"}

    def line(task: str, other: str, text: str, holds: Callable[[dict, dict], bool]) -> str:
        mine, theirs = ok.get((task, "default")), ok.get((task, other))
        if mine is None or theirs is None:
            missing = [LABELS[m] for m in ("default", other) if (task, m) not in ok]
            return f"- not measured: {text} ({' and '.join(missing)}: did not run)"
        verdict = "met" if holds(mine, theirs) else "NOT met"
        return f"- {verdict}: {text} ({cell(mine['val'])} vs {cell(theirs['val'])})"

    def curve(task: str, name: str) -> list[dict]:
        return [p for p in curves if (p["task"], p["method"]) == (task, name)]

    goal = curve("gcide", "cut_cross_entropy")
    reach = reach_time(curve("gcide", "default"), goal[-1]["value"], False) if goal else None
    reached = ""
    if goal:
        when = "never" if reach is None else f"at {reach:.1f} s"
        reached = f" (reached {when}; the final val ppl of each)"
    return [
        line(
            "gcide",
            "cut_cross_entropy",
            "GCIDE, equal wall clock: default sampled val ppl <= Cut Cross-Entropy's",
            lambda a, b: a["val"] <= b["val"],
        ),
        line(
            "gcide",
            "mixed",
            "GCIDE, equal wall clock: default sampled val ppl <= mixed negatives'",
            lambda a, b: a["val"] <= b["val"],
        ),
        line(
            "gcide",
            "cut_cross_entropy",
            f"GCIDE: default sampled reaches Cut Cross-Entropy's final val ppl within 0.5 x "
            f"{budget_s:g} s of training{reached}",
            lambda a, b: reach is not None and reach <= 0.5 * budget_s,
        ),
        line(
            "sasrec",
            "cut_cross_entropy",
            "1M items, equal wall clock: default sampled val NDCG@10 >= Cut Cross-Entropy's "
            "(the synthetic generator plants item clusters, which MIDX exploits)",
            lambda a, b: a["val"] >= b["val"],
        ),
    ]


def versions(commit: str | None) -> dict[str, str]:
    """GPU (or CPU), driver, CUDA, torch, Triton, Lightning, Cut Cross-Entropy, Python, commit."""
    found = provenance()
    info = {"machine": found["machine"], "torch": torch.__version__}
    driver = gpu_driver() if torch.cuda.is_available() else "none"
    info.update(driver=driver, cuda=str(torch.version.cuda))
    for name, dist in (
        ("triton", "triton"),
        ("lightning", "lightning"),
        ("cut_cross_entropy", "cut-cross-entropy"),
    ):
        try:
            info[name] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            info[name] = "not installed"
    info.update(python=platform.python_version(), commit=commit or found["commit"])
    return info


def write_outputs(
    out: Path,
    finals: list[dict],
    curves: list[dict],
    header: list[str],
    budget_s: float,
    with_plot: bool,
) -> None:
    """``curves.csv``, ``final.csv``, ``time_to_quality.md`` and, ``with_plot``,
    ``time_to_quality.png`` (about a second: once per task)."""
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("curves.csv", curves), ("final.csv", finals)):
        if rows:
            columns = list(dict.fromkeys(k for r in rows for k in r))
            with (out / name).open("w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=columns)
                writer.writeheader()
                writer.writerows(rows)
    shown = ("method", "status", "steps", "epochs", "train_s", "positions_per_s", "val", "test")
    lines = [*header, ""]
    for task in dict.fromkeys(r["task"] for r in finals):
        rows = [r for r in finals if r["task"] == task]
        metric = rows[0]["metric"]
        lines += [f"### {task}: final exact {metric} and test, {budget_s:g} s of training each", ""]
        lines += ["| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
        lines += ["| " + " | ".join(cell(r.get(c, "")) for c in shown) + " |" for r in rows]
        lines += ["", *(f"- `{r['method']}`: `{r['head']}`" for r in rows if "head" in r), ""]
    lines += ["### Targets", "", *targets(finals, curves, budget_s), ""]
    (out / "time_to_quality.md").write_text("\n".join(lines))
    if with_plot:
        plot(out / "time_to_quality.png", curves)


def cell(value: Any) -> str:
    """Floats to 4 significant digits."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def plot(path: Path, curves: list[dict]) -> None:
    """One panel per task with a curve: validation quality against training wall time, a line
    per method; nothing without curves."""
    plt = pyplot()

    tasks = list(dict.fromkeys(p["task"] for p in curves))
    if not tasks:
        return
    fig, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        metric = next(p["metric"] for p in curves if p["task"] == task)
        for name in dict.fromkeys(p["method"] for p in curves if p["task"] == task):
            points = [p for p in curves if (p["task"], p["method"]) == (task, name)]
            x, y = [p["wall_s"] for p in points], [p["value"] for p in points]
            ax.plot(x, y, marker="o", label=LABELS.get(name, name))
        if metric == "val_ppl":
            ax.set_yscale("log")
        ax.set_xlabel("training wall time, s (validation excluded)")
        ax.set_ylabel(f"{metric} (exact)")
        ax.set_title(task)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=100)


# ------------------------------------------------------------------------------------------ main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = make_parser(__doc__)
    parser.add_argument("--prepare", type=Path, help="write the carried data into DIR and exit")
    parser.add_argument(
        "--train-tokens",
        type=int,
        default=3_400_000,
        help="--prepare: GCIDE training tokens to carry (a prefix of the 9.6M)",
    )
    parser.add_argument("--data", type=Path, help="the prepared data (--prepare DIR)")
    parser.add_argument("--out", type=Path, help="where the four result files go")
    parser.add_argument("--budget-s", type=float, default=15.0, help="training s per run")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--points", type=int, default=10, help="validations per run (+ t = 0)")
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--commit", help="the commit, where git cannot tell")
    parser.add_argument(
        "--deadline-s",
        type=float,
        help="skip a run that would end after this many seconds from the start of main (after "
        "the imports), judged by the previous run's duration",
    )
    parser.add_argument("--tiny", action="store_true", help="tiny shapes, for a CPU dry run")
    args = parser.parse_args(argv)
    if args.prepare is None and (args.data is None or args.out is None):
        parser.error("give --prepare DIR, or --data DIR and --out DIR")
    if args.budget_s <= 0 or args.points < 1 or args.warmup_steps < 0:
        parser.error("--budget-s must be > 0, --points >= 1, --warmup-steps >= 0")
    return args


def main(argv: list[str] | None = None) -> list[dict]:
    """Runs every task and method; returns the final rows."""
    args = parse_args(argv)
    if args.prepare is not None:
        info = prepare_from_recipes(args.prepare, args.train_tokens)
        print(f"prepared {args.prepare}: {info}")
        return []
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    warnings.filterwarnings("ignore", ".*IterableDataset.*has .__len__. defined.*")
    warnings.filterwarnings("ignore", ".*no .val_dataloader.*")
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    begin = time.perf_counter()
    device = torch.device(args.device)
    precision = "bf16-mixed" if device.type == "cuda" else "32-true"
    shapes = TINY if args.tiny else Shapes()
    builders = {"gcide": gcide_task, "sasrec": partial(sasrec_task, seed=args.seed)}
    files = {"gcide": "gcide.pt", "sasrec": "synthetic.pt"}
    tasks = [
        builders[name](torch.load(args.data / files[name], weights_only=True), shapes, device)
        for name in args.tasks
    ]
    info = versions(args.commit)
    header = [
        "# Time to quality at equal wall clock (issue 30)",
        "",
        *(f"- {k}: {v}" for k, v in info.items()),
        f"- precision: {precision} training, fp32 exact evaluation; no torch.compile; seed "
        f"{args.seed} for every run; {args.warmup_steps} warm-up steps on a thrown-away copy "
        "before each clock starts",
        f"- budget: {args.budget_s:g} s of training wall time per task and method (validation "
        f"excluded), validated at t = 0 and {args.points} evenly spaced times",
        *(f"- {task.describe}" for task in tasks),
        "- methods: " + "; ".join(f"`{m}`: {LABELS[m]}" for m in args.methods),
    ]
    if device.type != "cuda":
        header.append(f"- CPU dry run{' (--tiny shapes)' if args.tiny else ''}: not GPU numbers")
    config = RunConfig(
        device, precision, args.budget_s, args.points, args.warmup_steps, args.seed, args.out
    )
    stamp = {"machine": info["machine"], "torch": info["torch"], "commit": info["commit"]}
    finals: list[dict] = []
    curves: list[dict] = []
    durations: list[float] = []  # of the runs so far, set-up and evaluation included
    for task in tasks:
        for name in args.methods:
            row = {"task": task.name, "method": name, "metric": task.metric}
            m = method(name)
            start = time.perf_counter()
            late = args.deadline_s is not None and (
                start - begin + (durations[-1] if durations else args.budget_s) > args.deadline_s
            )
            if m.needs_cuda and device.type != "cuda":
                row["status"] = "skipped: needs CUDA"
            elif late:
                row["status"] = f"skipped: it would end after --deadline-s {args.deadline_s:g}"
            else:
                try:
                    final, curve = train_and_score(task, m, config)
                except Exception as err:  # one failed method must not lose the others' numbers
                    traceback.print_exc()
                    row["status"] = f"error: {type(err).__name__}: {str(err).splitlines()[0][:200]}"
                else:
                    curves += [
                        {**row, "wall_s": t, "step": s, "value": v, **stamp} for t, s, v in curve
                    ]
                    row.update(status="ok", **final)
                durations.append(time.perf_counter() - start)
            finals.append({**row, **stamp})
            print(
                f"[{time.perf_counter() - begin:6.1f} s] {task.name} {name}: "
                + ", ".join(
                    f"{k}={cell(v)}" for k, v in row.items() if k not in ("task", "method")
                ),
                flush=True,
            )
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            last = name == args.methods[-1]
            write_outputs(args.out, finals, curves, header, args.budget_s, with_plot=last)
    total = time.perf_counter() - begin
    print(f"time_to_quality: {total:.0f} s in all; results in {args.out}")
    for line in targets(finals, curves, args.budget_s):
        print(line)
    return finals


if __name__ == "__main__":
    main()
