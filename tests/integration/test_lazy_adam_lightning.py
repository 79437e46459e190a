"""LazyAdam and sparse-aware clipping inside Lightning: a module whose class table gets row-sparse
gradients (a sparse sampled head tied to a sparse embedding) trained with gradient accumulation
and clipping, in bf16, resumed from a checkpoint, and under two-process DDP on gloo."""

import tempfile
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.distributed as dist
from ddp_sparse_train import (
    NUM_CLASSES,
    SparseToyModel,
    copy_task,
    fit,
    make_trainer,
)
from launched_script import run_script
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from lightning_sampled.callbacks import RNGCheckpoint
from lightning_sampled.heads import SampledSoftmaxHead
from lightning_sampled.optim import LazyAdam
from lightning_sampled.samplers import UniformSampler

HERE = Path(__file__).resolve().parent
STEPS_PER_EPOCH = 4  # 256 rows / 32 per batch / 2 batches per step


def loader() -> DataLoader:
    return DataLoader(copy_task(), batch_size=32, shuffle=True)


def test_accumulated_sparse_grads_are_clipped_by_our_clipping_and_the_model_trains():
    L.seed_everything(0, verbose=False)
    model = SparseToyModel()
    before = model.exact_loss(copy_task())
    make_trainer(max_epochs=3).fit(model, loader())
    after = model.exact_loss(copy_task())
    assert after < 0.7 * before, (before, after)
    assert model.grad_layouts == [torch.sparse_coo] * 3 * STEPS_PER_EPOCH
    assert len(model.clip_norms) == 3 * STEPS_PER_EPOCH
    assert any(pre > 0.5 for pre, _ in model.clip_norms)  # clipping was active
    assert all(post <= 0.5 * (1 + 1e-5) for _, post in model.clip_norms), model.clip_norms


def test_lightnings_default_clipping_fails_naming_our_clip_grad_norm():
    L.seed_everything(0, verbose=False)
    model = SparseToyModel(clip_override=False)
    with pytest.raises(RuntimeError, match=r"lightning_sampled\.optim\.clip_grad_norm_") as info:
        make_trainer(max_epochs=1).fit(model, loader())
    assert isinstance(info.value.__cause__, NotImplementedError)


def test_bf16_mixed_precision_trains_with_sparse_grads():
    L.seed_everything(0, verbose=False)
    model = SparseToyModel()
    before = model.exact_loss(copy_task())
    trainer = make_trainer(max_epochs=2, precision="bf16-mixed")
    trainer.fit(model, loader())
    assert torch.isfinite(trainer.callback_metrics["train/loss"])
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert model.grad_layouts == [torch.sparse_coo] * 2 * STEPS_PER_EPOCH
    assert model.exact_loss(copy_task()) < 0.8 * before


def fit_from(epochs: int, ckpt_path=None, save_to=None) -> tuple[SparseToyModel, L.Trainer]:
    L.seed_everything(0, verbose=False)
    model = SparseToyModel(weight_decay=0.01)
    trainer = make_trainer(max_epochs=epochs, callbacks=[RNGCheckpoint()])
    trainer.fit(model, loader(), ckpt_path=ckpt_path)
    if save_to is not None:
        trainer.save_checkpoint(save_to)
    return model, trainer


def test_resume_at_an_epoch_boundary_equals_an_uninterrupted_run(tmp_path):
    ckpt = tmp_path / "half.ckpt"
    _, first = fit_from(2, save_to=ckpt)
    saved = torch.load(ckpt, weights_only=True)["optimizer_states"][0]
    table_states = [s for s in saved["state"].values() if s["exp_avg"].shape == (NUM_CLASSES, 8)]
    assert len(table_states) == 1 and float(table_states[0]["step"]) == 2 * STEPS_PER_EPOCH
    resumed, resumed_trainer = fit_from(4, ckpt_path=ckpt)
    straight, straight_trainer = fit_from(4)
    assert resumed_trainer.global_step == straight_trainer.global_step == 4 * STEPS_PER_EPOCH
    for (name, a), b in zip(resumed.named_parameters(), straight.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=name)
    ours = resumed_trainer.optimizers[0].state_dict()["state"]
    theirs = straight_trainer.optimizers[0].state_dict()["state"]
    assert ours.keys() == theirs.keys()
    for key, state in ours.items():
        for name, value in state.items():
            torch.testing.assert_close(value, theirs[key][name], rtol=0, atol=1e-6)


@pytest.mark.parametrize("reduction", ["sparse", "dense"])
def test_two_process_ddp_with_sparse_grads_equals_one_process_on_the_whole_batch(
    tmp_path, reduction
):
    """``sparse``: DDP reduces the table's gradient (gloo's sparse all-reduce); ``dense``:
    ``SparseGradSync`` keeps the table out of DDP and averages it by dense collectives (the path
    that also runs on NCCL)."""
    run_script(HERE / "ddp_sparse_train.py", [str(tmp_path), "2", reduction], tmp_path, "error*")
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    for rank in ranks:  # the table's gradient was reduced as a sparse tensor
        assert rank["layouts"] == ["torch.sparse_coo"] * 2 * STEPS_PER_EPOCH
        tied = ["embedding.weight", "head.weight"] if reduction == "dense" else []
        assert rank["ignored_by_ddp"] == tied
    for name, value in ranks[0]["state_dict"].items():
        if torch.is_tensor(value):
            assert torch.equal(value, ranks[1]["state_dict"][name]), name
        else:  # the sampler's draw stream, {"seed", "draws"}
            assert value == ranks[1]["state_dict"][name], name
    L.seed_everything(0, verbose=False)
    initial = SparseToyModel().state_dict()
    single = fit(devices=1, batch_size=32).state_dict()
    assert single.keys() == ranks[0]["state_dict"].keys()
    for name, value in single.items():
        if not torch.is_tensor(value):
            # the same stream, as far along: the ranks drew the one process's negatives
            assert value == ranks[0]["state_dict"][name], name
            continue
        assert (value - initial[name]).abs().max() > 0.1, name  # trained
        torch.testing.assert_close(ranks[0]["state_dict"][name], value, rtol=0, atol=1e-5)


class SparseTableNet(nn.Module):
    def __init__(self, tie_embedding_first: bool):
        super().__init__()
        if tie_embedding_first:
            self.embedding = nn.Embedding(16, 4, sparse=True)
        weight = self.embedding.weight if tie_embedding_first else None
        self.head = SampledSoftmaxHead(
            16, 4, UniformSampler(16), 3, sparse_grad=True, weight=weight
        )
        self.query = nn.Linear(2, 4)

    def forward(self, target):
        return self.head(self.query(torch.ones(len(target), 2)), target)


@pytest.fixture
def one_process_group():
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", world_size=1, rank=0)
        try:
            yield
        finally:
            dist.destroy_process_group()


@pytest.mark.filterwarnings("ignore:Grad strides do not match bucket view strides")
def test_ddp_takes_a_sparse_table_only_when_a_sparse_embedding_registered_first_holds_it(
    one_process_group,
):
    """torch's DDP expects a sparse gradient only for parameters whose first owner in
    ``named_modules()`` is an ``nn.Embedding(sparse=True)``; a table the head owns reaches the
    reducer as a dense-bucket parameter and backward fails; LazyAdam re-raises that error saying
    how to hold the table (not blaming gradient clipping)."""
    target = torch.tensor([1, 5, 5, 7])
    works = DistributedDataParallel(SparseTableNet(tie_embedding_first=True))
    works(target).backward()
    assert works.module.head.weight.grad.is_sparse

    fails = DistributedDataParallel(SparseTableNet(tie_embedding_first=False))
    optimizer = LazyAdam(fails.parameters())
    with pytest.raises(RuntimeError, match=r"nn.Embedding\(sparse=True\)") as caught:
        optimizer.step(lambda: fails(target).backward())
    assert "clip" not in str(caught.value)
    assert isinstance(caught.value.__cause__, NotImplementedError)
