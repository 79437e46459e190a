"""IndexRefresh: schedule in a real CPU Trainer, resume from checkpoints, DDP broadcast (gloo)."""

import csv
import math
import warnings

import faiss
import lightning.pytorch as pl
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_sampled.callbacks import IndexRefresh
from lightning_sampled.callbacks.index_refresh import refresh_targets
from lightning_sampled.heads import SampledSoftmaxHead
from lightning_sampled.samplers import MIDXSampler

N, D, BATCHES = 40, 8, 4


class TinyModel(pl.LightningModule):
    """An embedding encoder and a sampled head with MIDX; records (epoch, step) of refreshes."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Embedding(16, D)
        self.head = SampledSoftmaxHead(N, D, MIDXSampler(N, 4, kmeans_iters=3), 8)
        self.refreshes: list[tuple[int, int]] = []
        self.cells_before_refresh: list[torch.Tensor] = []
        refresh = self.head.refresh_index

        def counted() -> None:
            self.refreshes.append((self.trainer.current_epoch, self.trainer.global_step))
            self.cells_before_refresh.append(self.head.sampler.class_cells.clone())
            refresh()

        self.head.refresh_index = counted

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.head(self.encoder(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        data = TensorDataset(
            torch.randint(0, 16, (8 * BATCHES,), generator=g),
            torch.randint(0, N, (8 * BATCHES,), generator=g),
        )
        return DataLoader(data, batch_size=8)


def fit(model, callback, tmp_path, epochs, ckpt_path=None, ckpt_dir="ckpt", **kwargs):
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=epochs,
        callbacks=[callback, ModelCheckpoint(dirpath=tmp_path / ckpt_dir, save_last=True)],
        logger=pl.loggers.CSVLogger(tmp_path),
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        log_every_n_steps=1,
        **kwargs,
    )
    trainer.fit(model, ckpt_path=ckpt_path)
    return trainer


@pytest.mark.parametrize(
    ("kwargs", "epochs", "expected"),
    [
        ({}, 3, [(0, 0), (1, 4), (2, 8)]),
        ({"every_n_epochs": 2}, 3, [(0, 0), (2, 8)]),
        ({"every_n_epochs": None, "every_n_train_steps": 3}, 2, [(0, 0), (0, 3), (1, 6)]),
        ({"every_n_epochs": None, "doubling_steps": None}, 2, [(0, 0)]),
        (
            {"every_n_epochs": None, "doubling_steps": 1},
            3,
            [(0, 0), (0, 1), (0, 2), (1, 4), (2, 8)],
        ),
        ({"doubling_steps": 3}, 3, [(0, 0), (0, 3), (1, 4), (1, 6), (2, 8)]),
    ],
)
def test_refreshes_before_the_first_batch_and_on_schedule(tmp_path, kwargs, epochs, expected):
    model = TinyModel()
    trainer = fit(model, IndexRefresh(**kwargs), tmp_path, epochs)
    assert model.refreshes == expected
    assert model.head.sampler.is_built
    # logged once per refresh, at its step (not again at every later step)
    rows = list(csv.DictReader(open(trainer.logger.experiment.metrics_file_path)))
    logged = [row for row in rows if row["index_refresh/seconds"]]
    assert [int(row["step"]) for row in logged] == [step for _, step in expected]
    assert all(float(row["index_refresh/seconds"]) > 0 for row in logged)
    assert all(float(row["index_refresh/head.sampler/quantization_mse"]) > 0 for row in logged)
    assert all(row["index_refresh/head.sampler/nonempty_cells"] for row in logged)


def test_gradient_accumulation_refreshes_once_per_optimizer_step(tmp_path):
    model = TinyModel()
    fit(model, IndexRefresh(every_n_train_steps=1), tmp_path, 1, accumulate_grad_batches=2)
    assert model.refreshes == [(0, 0), (0, 1)]


def test_resume_keeps_the_checkpointed_index_and_the_schedule(tmp_path):
    first = TinyModel()
    fit(first, IndexRefresh(every_n_epochs=2), tmp_path, 2)
    assert first.refreshes == [(0, 0)]
    checkpointed = {
        k: v.clone() for k, v in first.head.sampler.state_dict().items() if torch.is_tensor(v)
    }
    resumed = TinyModel()
    callback = IndexRefresh(every_n_epochs=2)
    last = tmp_path / "ckpt" / "last.ckpt"
    fit(resumed, callback, tmp_path, 3, ckpt_path=last, ckpt_dir="resumed")
    # No rebuild at the start of the resumed run: the next refresh is epoch 2's, as uninterrupted,
    # and until then the sampler used the checkpoint's index, bit for bit.
    assert resumed.refreshes == [(2, 8)]
    assert torch.equal(resumed.cells_before_refresh[0], checkpointed["class_cells"])
    assert callback.num_refreshes == 2 and callback.last_epoch == 2


def test_state_dict_round_trip_and_bad_arguments():
    callback = IndexRefresh(every_n_train_steps=5)
    callback.last_epoch, callback.last_step, callback.num_refreshes = 3, 17, 4
    other = IndexRefresh(every_n_train_steps=5)
    other.load_state_dict(callback.state_dict())
    assert (other.last_epoch, other.last_step, other.num_refreshes) == (3, 17, 4)
    for kwargs in (
        {"every_n_epochs": 0},
        {"every_n_train_steps": -1},
        {"every_n_epochs": 1.5},
        {"doubling_steps": 0},
    ):
        with pytest.raises(ValueError, match="must be a positive int or None"):
            IndexRefresh(**kwargs)


def test_warns_when_trained_codewords_have_no_step_interval():
    """MIDX-Learn's codewords move at every step: a schedule without a step interval warns once
    at fit start and names the sampler; a step interval, or k-means codebooks, do not warn."""
    learned = nn.ModuleDict(
        {"head": SampledSoftmaxHead(N, D, MIDXSampler(N, 4, learnable=True, dim=D), 4)}
    )
    static = nn.ModuleDict({"head": SampledSoftmaxHead(N, D, MIDXSampler(N, 4), 4)})
    with pytest.warns(UserWarning, match=r"\['head.sampler'\].*pass every_n_train_steps"):
        IndexRefresh().on_fit_start(None, learned)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        IndexRefresh(every_n_train_steps=1).on_fit_start(None, learned)
        IndexRefresh(every_n_train_steps=10, every_n_epochs=None).on_fit_start(None, learned)
        IndexRefresh().on_fit_start(None, static)
    learned.head.sampler.codewords.requires_grad_(False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        IndexRefresh().on_fit_start(None, learned)


def test_refresh_targets_are_the_outermost_modules_with_refresh_index():
    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = SampledSoftmaxHead(N, D, MIDXSampler(N, 4), 4)

        def refresh_index(self):
            self.inner.refresh_index()

    root = nn.ModuleDict({"a": Outer(), "b": SampledSoftmaxHead(N, D, MIDXSampler(N, 4), 4)})
    assert [name for name, _ in refresh_targets(root)] == ["a", "b"]


# -- DDP: rank 0 builds, every rank gets its index ---------------------------------------------


def _ddp_worker(rank: int, world_size: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size
    )
    faiss.omp_set_num_threads(1)
    torch.manual_seed(rank)  # different class tables: a local build would differ across ranks
    heads = nn.ModuleDict(
        {
            "fast": SampledSoftmaxHead(50, 6, MIDXSampler(50, 4, "pq", kmeans_iters=3), 5),
            "learn": SampledSoftmaxHead(
                50, 6, MIDXSampler(50, 3, "rq", "exact", True, dim=6, kmeans_iters=3), 5
            ),
        }
    )
    calls = []
    for name, head in heads.items():
        refresh = head.refresh_index

        def counted(name=name, refresh=refresh):
            calls.append(name)
            refresh()

        head.refresh_index = counted
    IndexRefresh().refresh(heads)
    z = torch.ones(2, 6)
    draws = [
        tuple(h.sampler.sample(z, 30, generator=torch.Generator().manual_seed(0)))
        for h in heads.values()
    ]
    sampler_state = {k: v for k, v in heads.state_dict().items() if ".sampler." in k}
    torch.save({"state": sampler_state, "calls": calls, "draws": draws}, f"{out_dir}/rank{rank}.pt")
    dist.destroy_process_group()


def test_ddp_rank_zero_builds_and_every_rank_gets_identical_buffers(tmp_path):
    mp.spawn(_ddp_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    assert rank0["calls"] == ["fast", "learn"] and rank1["calls"] == []
    assert rank0["state"].keys() == rank1["state"].keys()
    assert any("class_embeddings" in key for key in rank0["state"])
    for key, value in rank0["state"].items():
        other = rank1["state"][key]
        if not torch.is_tensor(value):
            # each sampler's draw stream ({"seed", "draws"}), not a buffer of the index: seeded
            # from each rank's own global generator, which this test seeds differently per rank
            assert key.endswith("._extra_state"), key
            continue
        assert value.shape == other.shape and torch.equal(value.nan_to_num(), other.nan_to_num()), (
            key
        )
    for (ids0, log_q0), (ids1, log_q1) in zip(rank0["draws"], rank1["draws"], strict=True):
        assert torch.equal(ids0, ids1) and torch.equal(log_q0, log_q1)


class SampledValidation(TinyModel):
    """TinyModel whose validation computes the sampled training loss (it needs the index)."""

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/loss", self.head(self.encoder(x), y))

    def val_dataloader(self):
        return self.train_dataloader()


def test_validation_of_a_fresh_model_builds_the_missing_index(tmp_path):
    """``trainer.validate`` on a fresh MIDX model, and the sanity check before training, used to
    fail with "MIDXSampler has no index yet". The first training batch still refreshes (the
    training clock of a fresh run includes its first build)."""
    options = dict(accelerator="cpu", logger=False, enable_progress_bar=False)
    model = SampledValidation()
    trainer = pl.Trainer(callbacks=[IndexRefresh()], enable_model_summary=False, **options)
    (metrics,) = trainer.validate(model)
    assert math.isfinite(metrics["val/loss"]) and model.head.sampler.is_built
    assert model.refreshes == [(0, 0)]
    model = SampledValidation()
    trainer = pl.Trainer(
        callbacks=[IndexRefresh()],
        max_steps=1,
        enable_checkpointing=False,
        enable_model_summary=False,
        num_sanity_val_steps=1,
        limit_val_batches=1,
        **options,
    )
    trainer.fit(model)
    assert model.refreshes == [(0, 0), (0, 0)]  # the sanity check's, then the first batch's
    built = SampledValidation()
    built.head.sampler.refresh(built.head.class_table().detach())
    trainer = pl.Trainer(callbacks=[IndexRefresh()], enable_model_summary=False, **options)
    trainer.validate(built)
    assert built.refreshes == []  # an index exists: nothing is rebuilt
