"""LightningModules that pair an encoder with any head, trained sampled and evaluated exactly.

A model subclass builds its encoder, then calls :meth:`SampledModule.build_head` with the width of
its outputs and, to tie the output layer, its embedding table (or, for a head whose config asks
for ``sharded: true``, looks its inputs up through the head, :meth:`SampledModule.shards_table`).
The head and the sampler are factories (``class_path`` / ``init_args`` in a config, see
:mod:`recipes.specs`) that the model calls with what a config cannot hold; ``num_classes`` and
``class_counts`` are linked from the data module by the CLI (:mod:`recipes.cli`).
"""

from __future__ import annotations

from typing import Any, Literal

import lightning as L
import torch
from torch import Tensor, nn
from torchmetrics import Metric

from lightning_sampled.callbacks import ShardedTables
from lightning_sampled.heads import FullSoftmaxHead, OutputHead
from lightning_sampled.metrics import (
    NDCG,
    AveragePopularity,
    GiniIndex,
    ItemCoverage,
    Perplexity,
    RankingMetric,
    Recall,
)
from lightning_sampled.optim import LazyAdam, SparseGradientClipping
from lightning_sampled.sharding.collectives import gathered_sizes

from .callbacks import FitLogInterval
from .specs import HeadFactory, SamplerFactory, build_head, build_sampler, factory_option


class SampledModule(SparseGradientClipping, L.LightningModule):
    """Base: an encoder ``encode(inputs) -> z [B, L, D]`` and a head; the training loss is the
    head's (sampled) objective. ``--trainer.gradient_clip_val`` clips by norm or by value
    (``--trainer.gradient_clip_algorithm``), row-sparse gradients included
    (:class:`~lightning_sampled.optim.SparseGradientClipping`).

    Args:
        num_classes: ``N``, linked from the data module.
        head: the head class (in a config ``class_path`` and ``init_args``), called with
            ``num_classes``, ``dim``, the tied ``weight``, ``padding_idx`` and the sampler;
            full softmax by default.
        sampler: the sampler class of a sampled head (uniform when omitted), called with those
            of ``num_classes``, ``padding_idx``, ``dim`` and ``counts`` (``class_counts``) it
            takes.
        class_counts: ``[N]`` training counts, linked from the data module (unigram proposals).
        lr: learning rate of :class:`~lightning_sampled.optim.LazyAdam` (Adam for dense
            gradients, SparseAdam's lazy update for a ``sparse_grad=True`` head's table).
        weight_decay: decoupled weight decay (AdamW's; on sparse rows only when touched).
        table_state: how ``LazyAdam`` updates a row-sparse class table (``sparse_grad=True``):
            ``"adam"`` (two ``[N, D]`` moments) or ``"row_wise_adagrad"`` (FBGEMM's exact
            row-wise Adagrad, one ``[N]`` accumulator); dense parameters get Adam either way.
        table_lr: the learning rate of ``"row_wise_adagrad"`` (unused by ``"adam"``).
        state_dtype: ``"float32"`` or ``"bfloat16"``: the dtype the row-sparse table's optimizer
            state is stored in (computed in fp32).
    """

    padding_idx: int | None = None
    head: OutputHead

    def __init__(
        self,
        num_classes: int,
        head: HeadFactory = FullSoftmaxHead,
        sampler: SamplerFactory | None = None,
        class_counts: list[int] | None = None,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        table_state: Literal["adam", "row_wise_adagrad"] = "adam",
        table_lr: float = 1e-2,
        state_dtype: Literal["float32", "bfloat16"] = "float32",
    ) -> None:
        super().__init__()
        if num_classes < 2:
            raise ValueError(f"num_classes must be >= 2, got {num_classes}")
        self.save_hyperparameters(ignore=["class_counts"])
        self.num_classes = num_classes
        self.head_factory = head
        self.sampler_factory = sampler
        self.class_counts = None if class_counts is None else torch.as_tensor(class_counts)
        self.lr = lr
        self.weight_decay = weight_decay
        self.optimizer_options = dict(
            table_state=table_state, table_lr=table_lr, state_dtype=state_dtype
        )
        self._diagnostic_batch: dict[str, Tensor] | None = None

    def shards_table(self) -> bool:
        """Whether the head's config asks for ``sharded=True``: the head then owns the class
        table, split across the ranks by :class:`~lightning_sampled.callbacks.ShardedTables`
        (added by :meth:`configure_callbacks`), and a tied model looks its inputs up with
        ``head.embed`` instead of an ``nn.Embedding``."""
        return bool(factory_option(self.head_factory, "sharded", False))

    def build_head(
        self, dim: int, weight: nn.Parameter | None = None, **options: Any
    ) -> OutputHead:
        """The configured head over ``num_classes`` classes of width ``dim``, tied to ``weight``,
        with the head's keyword ``options`` (e.g. ``init_std``) added to its config's."""
        sampler = None
        if self.sampler_factory is not None:
            sampler = build_sampler(
                self.sampler_factory, self.num_classes, dim, self.padding_idx, self.class_counts
            )
        return build_head(
            self.head_factory,
            self.num_classes,
            dim,
            weight=weight,
            padding_idx=self.padding_idx,
            sampler=sampler,
            class_counts=self.class_counts,
            **options,
        )

    def encode(self, inputs: Tensor) -> Tensor:
        """``[B, L]`` ids to ``[B, L, D]`` queries for the head."""
        raise NotImplementedError

    def eval_queries(self, batch: dict[str, Tensor]) -> Tensor:
        """The queries ``[..., D]`` an evaluation batch scores."""
        raise NotImplementedError

    def diagnostic_queries(self) -> Tensor:
        """Queries ``[Q, D]`` of the first validation batch (kept for the whole run), for
        :class:`~lightning_sampled.callbacks.SamplerDiagnostics`."""
        if self._diagnostic_batch is None:
            self._diagnostic_batch = next(iter(self.trainer.datamodule.val_dataloader()))
        batch = {k: v.to(self.device) for k, v in self._diagnostic_batch.items()}
        return self.eval_queries(batch).flatten(0, -2)

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss = self.head(self.encode(batch["input"]), batch["target"])
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def configure_callbacks(self) -> list[L.Callback]:
        """:class:`~recipes.callbacks.FitLogInterval`: the train loss is logged on short epochs;
        :class:`~lightning_sampled.callbacks.ShardedTables` for a sharded head."""
        return [FitLogInterval()] + ([ShardedTables()] if self.shards_table() else [])

    # -- evaluation over a split table ---------------------------------------------------------
    # Each evaluation batch of a split head is a collective (the queries are gathered, each rank
    # scores its rows), so every rank must evaluate as many batches. The evaluation samplers
    # split the rows without padding (lightning_sampled.metrics.evaluation_sampler), which can
    # leave a rank one batch short: at the epoch's start the ranks exchange their batch counts,
    # and after its last batch (before Lightning reduces the metrics) a short rank repeats the
    # collectives of that batch's first row as many times as it lacks batches, results unused.

    def evaluation_collectives(self, batch: dict[str, Tensor]) -> Tensor:
        """What an evaluation batch asks of the head (its collectives on a split table)."""
        raise NotImplementedError

    def _count_batches(self, batches: list[int]) -> None:
        self._eval_batches, self._missing_batches = sum(batches), 0
        if self.head.is_split:
            counts = gathered_sizes(sum(batches), self.device, self.head.process_group)
            self._missing_batches = max(counts) - sum(batches)

    def _catch_up(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        if self._missing_batches and batch_idx + 1 == self._eval_batches:
            first_row = {key: value[:1] for key, value in batch.items()}
            for _ in range(self._missing_batches):
                self.evaluation_collectives(first_row)

    def on_validation_epoch_start(self) -> None:
        trainer = self.trainer
        counts = trainer.num_sanity_val_batches if trainer.sanity_checking else None
        self._count_batches(counts or trainer.num_val_batches)

    def on_validation_batch_end(self, outputs, batch, batch_idx: int, dataloader_idx=0) -> None:
        self._catch_up(batch, batch_idx)

    def on_test_epoch_start(self) -> None:
        self._count_batches(self.trainer.num_test_batches)

    def on_test_batch_end(self, outputs, batch, batch_idx: int, dataloader_idx=0) -> None:
        self._catch_up(batch, batch_idx)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return LazyAdam(
            self.parameters(), lr=self.lr, weight_decay=self.weight_decay, **self.optimizer_options
        )

    def sparse_lookup(self, embedding: nn.Embedding) -> None:
        """Makes ``embedding``'s lookup row-sparse when it is the class table of a
        ``sparse_grad=True`` head, so no path gives the table a dense ``[N, D]`` gradient."""
        embedding.sparse = embedding.weight is self.head.weight and self.head.sparse_grad


class SequentialRecommender(SampledModule):
    """Next-item recommendation, evaluated by exact full ranking of all items at the last position
    (NDCG@k, Recall@k), skipping the items of ``batch["exclude"]`` when the data module sends it,
    and by what the top-``k`` lists recommend: item coverage, Gini index and, when
    ``class_counts`` is known, average training popularity at ``k`` (RecBole's definitions, see
    :mod:`lightning_sampled.metrics.beyond_accuracy`).

    Args:
        top_k: the ``k`` of the metrics, or several (``[10, 50]``): every metric is logged at
            each, as ``<stage>/<name>@<k>``; the items are ranked once, to the largest.
        **kwargs: of :class:`SampledModule`.
    """

    padding_idx = 0

    def __init__(self, *args: Any, top_k: int | list[int] = 10, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cutoffs = list(top_k) if isinstance(top_k, (list, tuple)) else [top_k]
        if not cutoffs or any(isinstance(k, bool) or not isinstance(k, int) for k in cutoffs):
            raise ValueError(f"top_k must be an int or a non-empty list of ints, got {top_k!r}")
        if min(cutoffs) < 1 or max(cutoffs) > self.num_classes:
            raise ValueError(f"every top_k must be in [1, {self.num_classes}], got {top_k!r}")
        #: the cutoffs, ascending and distinct; the first one's metrics show in the progress bar
        self.cutoffs = sorted(set(cutoffs))
        self.top_k = self.cutoffs[-1]
        self.metrics = nn.ModuleDict(
            {
                f"{stage}_{name}": metric
                for stage in ("val", "test")
                for k in self.cutoffs
                for name, metric in self.evaluation_metrics(k).items()
            }
        )

    def evaluation_metrics(self, k: int) -> dict[str, Metric]:
        """One stage's metrics at cutoff ``k`` by logged name: ``ndcg@k``, ``recall@k``,
        ``item_coverage@k``, ``gini_index@k`` and ``average_popularity@k`` (with
        ``class_counts`` only)."""
        n = self.num_classes
        metrics = [NDCG(k), Recall(k), ItemCoverage(k, num_classes=n), GiniIndex(k, num_classes=n)]
        if self.class_counts is not None:
            metrics.append(AveragePopularity(k, class_counts=self.class_counts))
        return {f"{metric.short_name}@{k}": metric for metric in metrics}

    def eval_queries(self, batch: dict[str, Tensor]) -> Tensor:
        """The state at the last history position, ``[B, D]``."""
        return self.encode(batch["history"])[:, -1]

    def evaluation_collectives(self, batch: dict[str, Tensor]) -> Tensor:
        """The top-``k`` item ids ``[B, k]`` of the batch's queries."""
        return self.head.topk(self.eval_queries(batch), self.top_k, exclude=batch.get("exclude"))[1]

    def _evaluate(self, batch: dict[str, Tensor], stage: str) -> None:
        top = self.evaluation_collectives(batch)
        for key, metric in self.metrics.items():
            metric_stage, _, name = key.partition("_")
            if metric_stage == stage:
                metric.update(top, batch["target"])
                show = stage == "val" and isinstance(metric, RankingMetric)
                show &= metric.k == self.cutoffs[0]
                self.log(f"{stage}/{name}", metric, prog_bar=show)

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "test")


class LanguageModel(SampledModule):
    """Next-token language modelling, evaluated by exact perplexity over the whole vocabulary."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.val_ppl = Perplexity()
        self.test_ppl = Perplexity()

    def eval_queries(self, batch: dict[str, Tensor]) -> Tensor:
        """The state at every position of the window, ``[B, T, D]``."""
        return self.encode(batch["input"])

    def evaluation_collectives(self, batch: dict[str, Tensor]) -> Tensor:
        """The exact ``log p(target)`` of every position of the batch."""
        return self.head.log_prob(self.eval_queries(batch), batch["target"])

    def _evaluate(self, batch: dict[str, Tensor], metric: Perplexity, name: str) -> None:
        target = batch["target"]
        log_prob = self.evaluation_collectives(batch)
        metric.update_from_log_prob(log_prob, target != self.head.ignore_index)
        self.log(name, metric, prog_bar=name.startswith("val"))

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._evaluate(batch, self.val_ppl, "val/ppl")

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._evaluate(batch, self.test_ppl, "test/ppl")
