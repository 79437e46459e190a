"""``SamplerDiagnostics``: how far each sampler's proposal is from the softmax it stands in for.

Every ``every_n_epochs`` epochs (at the end of the training epoch), for every head in the model
that draws from a proposal (:class:`~lightning_sampled.protocols.HasProposal`: every
:class:`~lightning_sampled.heads.ProposalHead`, CANE's noise proposal included), the callback

- computes, on a fixed batch of queries, the exact softmax ``p`` of the head and the sampler's
  proposal ``q`` over all ``N`` classes, and logs ``sampler_diagnostics/<head path>/kl``, the mean
  over queries of ``KL(p || q)``;
- saves the cumulative-probability plot of the MIDX paper's Figures 4 and 5 as
  ``<log_dir>/sampler_diagnostics/<head path>_epoch<e>.png``: classes ordered by decreasing softmax
  probability (per query, then averaged over queries), the cumulative mass of the softmax and of
  the proposal in that order, and the uniform proposal for reference. A proposal close to the
  softmax follows its curve; it is handed to every logger with ``log_image`` (``WandbLogger``) or
  whose ``experiment`` has ``add_figure`` (``TensorBoardLogger``).

After every training batch it also logs ``sampler_diagnostics/<head path>/coverage`` (the epoch
mean) for every head that :class:`~lightning_sampled.protocols.ReportsCoverage` (e.g.
:class:`~lightning_sampled.heads.CaneHead`: the share of the batch's targets among the
candidates, the paper's Table 3).

Queries: the callback needs query vectors ``z`` ``[B, D]`` for the heads. Either pass
``queries=fn`` with ``fn(pl_module)`` returning them, or implement ``diagnostic_queries(self)`` on
the LightningModule (:class:`~lightning_sampled.protocols.DiagnosticQueries`). Either returns a
tensor ``[B, D]`` (used for every head) or a mapping from head path (as in ``named_modules()``)
to ``[B, D]``. It is called in eval mode under ``no_grad``; use a
fixed batch of inputs (e.g. the first validation batch, stored once) so that epochs compare. At most
``num_queries`` rows are used.

Under DDP the diagnostics run on global rank 0 only. Cost: ``O(num_queries x N x D)`` per head
and memory ``O(query_chunk x N)``: a diagnostic, not a training-time tool at very large ``N``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NamedTuple

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor

from .._validation import check_positive_int
from ..protocols import DiagnosticQueries, HasProposal, ReportsCoverage
from ..samplers import Sampler

QueryFn = Callable[[pl.LightningModule], "Tensor | Mapping[str, Tensor]"]
_QUERY_CHUNK = 8
_PLOT_POINTS = 2000


class ProposalReport(NamedTuple):
    """Divergence of a proposal from the softmax on a batch of queries.

    Attributes:
        kl: fp64 ``[B]``: ``KL(p || q)`` for every query.
        softmax_curve: fp64 ``[N]``: mean cumulative softmax mass of the top-``r`` classes.
        proposal_curve: fp64 ``[N]``: mean cumulative proposal mass of the same classes.
    """

    kl: Tensor
    softmax_curve: Tensor
    proposal_curve: Tensor


@torch.no_grad()
def proposal_report(head: HasProposal, sampler: Sampler, z: Tensor) -> ProposalReport:
    """Compares ``sampler`` with ``head``'s exact softmax on queries ``z`` ``[B, D]``.

    Works in chunks of queries: memory ``O(chunk x N)``.
    """
    ids = torch.arange(head.num_classes, device=z.device)
    kls, p_curves, q_curves = [], [], []
    for start in range(0, z.shape[0], _QUERY_CHUNK):
        chunk = z[start : start + _QUERY_CHUNK]
        log_p = torch.log_softmax(head.logits(chunk).double(), dim=-1)
        # the sampler sees the queries as the head scores them (temperature, cosine logits)
        log_q = sampler.log_prob(head.score_queries(chunk), ids).double().expand_as(log_p)
        p = log_p.exp()
        terms = torch.where(p > 0, p * (log_p - log_q), torch.zeros_like(p))
        kls.append(terms.sum(-1))
        order = torch.argsort(log_p, dim=-1, descending=True)
        p_curves.append(torch.cumsum(p.gather(1, order), dim=-1).sum(0))
        q_curves.append(torch.cumsum(log_q.exp().gather(1, order), dim=-1).sum(0))
    count = z.shape[0]
    return ProposalReport(
        torch.cat(kls), torch.stack(p_curves).sum(0) / count, torch.stack(q_curves).sum(0) / count
    )


def plot_cumulative(report: ProposalReport, title: str, path: Path):
    """Saves the cumulative-probability plot (the MIDX paper's Figures 4-5) as a PNG.

    Returns:
        The matplotlib figure (closed by the caller).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = report.softmax_curve.numel()
    ranks = torch.unique(torch.logspace(0, math.log10(n), _PLOT_POINTS).round().long().clamp(1, n))
    fig, ax = plt.subplots(figsize=(5.5, 4))
    ax.plot(ranks, report.softmax_curve[ranks - 1], label="softmax", color="black")
    ax.plot(ranks, report.proposal_curve[ranks - 1], label="proposal", color="tab:red")
    ax.plot(ranks, ranks.double() / n, label="uniform", color="gray", linestyle="--")
    ax.set_xscale("log")
    ax.set_xlabel("classes ordered by softmax probability (rank)")
    ax.set_ylabel("cumulative probability")
    ax.set_ylim(0, 1.01)
    ax.set_title(title)
    ax.legend(loc="upper left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return fig


class SamplerDiagnostics(Callback):
    """Logs ``KL(softmax || proposal)`` and saves cumulative-probability plots every n epochs.

    Args:
        every_n_epochs: run at the end of every ``every_n_epochs``-th training epoch.
        num_queries: at most this many queries are used.
        queries: ``fn(pl_module)`` returning the queries (see the module docstring); when
            ``None``, the LightningModule's ``diagnostic_queries()`` is called.
        save_plots: save and hand out the PNG plots (the KL is logged either way).
    """

    def __init__(
        self,
        every_n_epochs: int = 1,
        num_queries: int = 64,
        queries: QueryFn | None = None,
        save_plots: bool = True,
    ) -> None:
        self.every_n_epochs = check_positive_int("every_n_epochs", every_n_epochs)
        self.num_queries = check_positive_int("num_queries", num_queries)
        if queries is not None and not callable(queries):
            raise ValueError(f"queries must be a callable or None, got {type(queries).__name__}")
        self.queries = queries
        self.save_plots = bool(save_plots)
        self.last_kl: dict[str, float] = {}

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if (trainer.current_epoch + 1) % self.every_n_epochs or not trainer.is_global_zero:
            return
        heads = [
            (name, module)
            for name, module in pl_module.named_modules()
            if isinstance(module, HasProposal) and isinstance(module.sampler, Sampler)
        ]
        if not heads:
            return
        queries = self._queries(pl_module)
        for name, head in heads:
            z = queries[name] if isinstance(queries, Mapping) else queries
            report = proposal_report(head, head.sampler, z[: self.num_queries].float())
            kl = float(report.kl.mean())
            self.last_kl[name] = kl
            pl_module.log(
                f"sampler_diagnostics/{name}/kl",
                kl,
                on_step=False,
                on_epoch=True,
                rank_zero_only=True,
            )
            if self.save_plots:
                self._plot(trainer, name, type(head.sampler).__name__, report, kl)

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: object,
        batch: object,
        batch_idx: int,
    ) -> None:
        for name, module in pl_module.named_modules():
            if isinstance(module, ReportsCoverage) and module.last_coverage is not None:
                pl_module.log(
                    f"sampler_diagnostics/{name or 'head'}/coverage",
                    module.last_coverage,
                    on_step=False,
                    on_epoch=True,
                    batch_size=1,
                )

    def _queries(self, pl_module: pl.LightningModule) -> Tensor | Mapping[str, Tensor]:
        if self.queries is None and not isinstance(pl_module, DiagnosticQueries):
            raise RuntimeError(
                "SamplerDiagnostics needs queries: pass queries=fn(pl_module) or implement "
                "diagnostic_queries(self) on the LightningModule, returning [B, D] query "
                "vectors of a fixed batch (or a {head path: [B, D]} mapping)"
            )
        was_training = pl_module.training
        pl_module.eval()
        try:
            with torch.no_grad():
                if self.queries is None:
                    return pl_module.diagnostic_queries()
                return self.queries(pl_module)
        finally:
            pl_module.train(was_training)

    def _plot(
        self, trainer: pl.Trainer, name: str, sampler_name: str, report: ProposalReport, kl: float
    ) -> None:
        import matplotlib.pyplot as plt

        epoch = trainer.current_epoch
        log_dir = Path(trainer.log_dir or trainer.default_root_dir)
        path = log_dir / "sampler_diagnostics" / f"{name or 'head'}_epoch{epoch:03d}.png"
        title = f"{name or 'head'}: {sampler_name}, epoch {epoch}, KL = {kl:.3g}"
        fig = plot_cumulative(report, title, path)
        key = f"sampler_diagnostics/{name or 'head'}"
        for logger in trainer.loggers:
            if callable(getattr(logger, "log_image", None)):
                logger.log_image(key=key, images=[str(path)], step=trainer.global_step)
            elif callable(getattr(getattr(logger, "experiment", None), "add_figure", None)):
                logger.experiment.add_figure(key, fig, global_step=trainer.global_step)
        plt.close(fig)
