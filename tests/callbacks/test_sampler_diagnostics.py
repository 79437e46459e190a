"""SamplerDiagnostics: KL(softmax || proposal), cumulative curves, PNG plots, loggers."""

import math

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_sampled.callbacks import IndexRefresh, SamplerDiagnostics
from lightning_sampled.callbacks.diagnostics import proposal_report
from lightning_sampled.heads import SampledSoftmaxHead
from lightning_sampled.samplers import MIDXSampler, UniformSampler

N, D = 60, 8


def head_with(sampler):
    head = SampledSoftmaxHead(N, D, sampler, 5, padding_idx=sampler.padding_idx)
    with torch.no_grad():
        head.weight.normal_()
    head.refresh_index()
    return head


def test_exact_midx_has_zero_kl_and_the_softmax_curve():
    head = head_with(MIDXSampler(N, 4, mode="exact", padding_idx=0, kmeans_iters=3))
    report = proposal_report(head, head.sampler, torch.randn(11, D))
    assert report.kl.shape == (11,) and report.kl.abs().max() < 1e-5
    torch.testing.assert_close(report.proposal_curve, report.softmax_curve, atol=1e-5, rtol=0)
    assert abs(float(report.softmax_curve[-1]) - 1.0) < 1e-9


@pytest.mark.parametrize("kwargs", [{"temperature": 0.3}, {"normalize": True}])
def test_exact_midx_matches_a_head_with_temperature_or_cosine_logits(kwargs):
    """The sampler is asked about the queries as the head scores them."""
    sampler = MIDXSampler(N, 4, mode="exact", padding_idx=0, kmeans_iters=3)
    head = SampledSoftmaxHead(N, D, sampler, 5, padding_idx=0, **kwargs)
    with torch.no_grad():
        head.weight.normal_()
    head.refresh_index()
    report = proposal_report(head, head.sampler, torch.randn(11, D))
    assert report.kl.abs().max() < 1e-5


def test_uniform_kl_is_log_n_minus_entropy_and_fast_midx_is_closer():
    head = head_with(UniformSampler(N))
    z = torch.randn(5, D)
    report = proposal_report(head, head.sampler, z)
    p = torch.softmax(z.double() @ head.weight.double().T, -1)
    entropy = -(p * p.log()).sum(-1)
    torch.testing.assert_close(report.kl, math.log(N) - entropy, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(report.proposal_curve, torch.arange(1, N + 1).double() / N)
    assert (report.softmax_curve >= report.proposal_curve - 1e-9).all()
    midx = SampledSoftmaxHead(N, D, MIDXSampler(N, 6, kmeans_iters=10), 5, weight=head.weight)
    midx.refresh_index()
    assert proposal_report(midx, midx.sampler, z).kl.mean() < report.kl.mean()


class ImageLogger(CSVLogger):
    """A CSV logger that also takes images, as WandbLogger does."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.images = []

    def log_image(self, key, images, step=None):
        self.images.append((key, images, step))


class TinyModel(pl.LightningModule):
    def __init__(self, with_hook=True):
        super().__init__()
        self.encoder = nn.Embedding(16, D)
        self.head = SampledSoftmaxHead(N, D, MIDXSampler(N, 4, kmeans_iters=3), 8)
        self.fixed_inputs = torch.arange(16)
        self.with_hook = with_hook

    def diagnostic_queries(self):
        if not self.with_hook:
            raise AssertionError("the callable passed to the callback should have been used")
        return self.encoder(self.fixed_inputs)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.head(self.encoder(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        x, y = torch.randint(0, 16, (32,), generator=g), torch.randint(0, N, (32,), generator=g)
        return DataLoader(TensorDataset(x, y), batch_size=8)


def fit(model, callback, tmp_path, epochs=2):
    logger = ImageLogger(tmp_path)
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=epochs,
        callbacks=[IndexRefresh(), callback],
        logger=logger,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
    )
    trainer.fit(model)
    return trainer, logger


def test_fit_logs_kl_saves_plots_and_hands_them_to_image_loggers(tmp_path):
    callback = SamplerDiagnostics(every_n_epochs=1, num_queries=10)
    trainer, logger = fit(TinyModel(), callback, tmp_path)
    assert trainer.logged_metrics["sampler_diagnostics/head/kl"] >= 0
    assert callback.last_kl["head"] == pytest.approx(
        float(trainer.logged_metrics["sampler_diagnostics/head/kl"])
    )
    plots = sorted((tmp_path / "lightning_logs").glob("*/sampler_diagnostics/head_epoch*.png"))
    assert [p.name for p in plots] == ["head_epoch000.png", "head_epoch001.png"]
    assert plots[0].stat().st_size > 1000
    assert [(key, step) for key, _, step in logger.images] == [
        ("sampler_diagnostics/head", 4),
        ("sampler_diagnostics/head", 8),
    ]


def test_every_n_epochs_and_a_query_callable(tmp_path):
    seen = []

    def queries(module):
        seen.append(module.training)
        return {"head": module.encoder(module.fixed_inputs)}

    callback = SamplerDiagnostics(every_n_epochs=2, queries=queries, save_plots=False)
    _, logger = fit(TinyModel(with_hook=False), callback, tmp_path, epochs=3)
    assert seen == [False]  # called once (after epoch 1), in eval mode
    assert logger.images == []


def test_missing_queries_and_bad_arguments_are_clear_errors(tmp_path):
    class NoHook(TinyModel):
        diagnostic_queries = None

    with pytest.raises(RuntimeError, match="SamplerDiagnostics needs queries"):
        fit(NoHook(), SamplerDiagnostics(), tmp_path, epochs=1)
    with pytest.raises(ValueError, match="every_n_epochs must be a positive integer"):
        SamplerDiagnostics(every_n_epochs=0)
    with pytest.raises(ValueError, match="queries must be a callable"):
        SamplerDiagnostics(queries=3)
