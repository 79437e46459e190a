"""Value clipping of sparse gradients, and the Trainer's ``gradient_clip_val`` on a module with a
``sparse_grad=True`` head through :class:`SparseGradientClipping`, against Lightning's own
clipping of the same module with a dense gradient."""

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_sampled.heads import SampledSoftmaxHead
from lightning_sampled.optim import LazyAdam, SparseGradientClipping, clip_grad_value_


def uncoalesced(indices, values, size):
    """A sparse COO gradient with the given (possibly repeated) indices, not coalesced."""
    return torch.sparse_coo_tensor(torch.tensor(indices), torch.tensor(values), size)


def test_value_clipping_of_sparse_and_dense_grads_equals_clipping_the_densified_grads():
    torch.manual_seed(0)
    emb, lin = nn.Embedding(6, 3, sparse=True), nn.Linear(3, 2)
    lin(emb(torch.tensor([1, 4, 1, 1]))).square().sum().mul(5).backward()  # row 1 thrice
    rows = nn.Parameter(torch.zeros(5, 2))  # duplicates whose sum is clipped, not each part
    rows.grad = uncoalesced([[3, 0, 3]], [[0.2, 2.0], [-1.0, 0.05], [0.3, -4.0]], (5, 2))
    elements = nn.Parameter(torch.zeros(4, 3))  # element-sparse (sparse_dim 2), as `sparse * p`
    elements.grad = uncoalesced([[0, 2, 0], [1, 2, 1]], [0.4, -0.9, 0.3], (4, 3))
    params = [emb.weight, *lin.parameters(), rows, elements]
    assert all(not p.grad.is_coalesced() for p in (emb.weight, rows, elements))
    twins = [nn.Parameter(p.detach().clone()) for p in params]
    for p, t in zip(params, twins, strict=True):
        t.grad = p.grad.to_dense().clone()
    clip_grad_value_(params, 0.5)
    torch.nn.utils.clip_grad_value_(twins, 0.5)
    for p, t in zip(params, twins, strict=True):
        torch.testing.assert_close(p.grad.to_dense(), t.grad)
    assert rows.grad.is_sparse and elements.grad.is_sparse
    torch.testing.assert_close(rows.grad.to_dense()[3], torch.tensor([0.5, -0.5]))  # the sum
    assert any((t.grad.abs() == 0.5).any() for t in twins[:3])  # the clamp bites everywhere


def test_value_clipping_takes_one_tensor_and_refuses_a_bad_value():
    p = nn.Parameter(torch.zeros(3))
    clip_grad_value_(p, 1.0)  # no gradient: nothing to do
    p.grad = torch.tensor([3.0, -0.5, -4.0])
    clip_grad_value_(p, 1.0)
    assert p.grad.tolist() == [1.0, -0.5, -1.0]
    for bad in (0.0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="clip_value"):
            clip_grad_value_(p, bad)


N, D = 40, 8


class TinyRecommender(SparseGradientClipping, L.LightningModule):
    """Linear encoder and a sampled head whose class table's gradient is row-sparse when
    ``sparse_grad``; plain SGD (which takes sparse gradients), so that a step moves each
    parameter by exactly its clipped gradient."""

    def __init__(self, sparse_grad: bool, optimizer: type = torch.optim.SGD):
        super().__init__()
        torch.manual_seed(0)
        self.encoder = nn.Linear(4, D)
        self.head = SampledSoftmaxHead(N, D, num_negatives=6, sparse_grad=sparse_grad)
        self.optimizer = optimizer

    def training_step(self, batch, batch_idx):
        inputs, target = batch
        return self.head(self.encoder(inputs) * 10, target)

    def configure_optimizers(self):
        return self.optimizer(self.parameters(), lr=1.0)


def one_step(tmp_path, model, **clipping) -> dict[str, torch.Tensor]:
    """How far one training step on a fixed batch moves each parameter, by name."""
    data = TensorDataset(
        torch.randn(16, 4, generator=torch.Generator().manual_seed(1)),
        torch.randint(0, N, (16,), generator=torch.Generator().manual_seed(2)),
    )
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    quiet = dict(enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    trainer = L.Trainer(
        max_steps=1, accelerator="cpu", logger=False, default_root_dir=tmp_path, **quiet, **clipping
    )
    L.seed_everything(0, verbose=False)  # the same negatives in every run
    trainer.fit(model, DataLoader(data, batch_size=16))
    return {name: p.detach() - before[name] for name, p in model.named_parameters()}


@pytest.mark.parametrize(("algorithm", "clip_val"), [("value", 0.01), ("norm", 0.05), (None, 0.05)])
def test_trainer_clips_sparse_gradients_as_lightning_clips_the_dense_ones(
    tmp_path, algorithm, clip_val
):
    options = dict(gradient_clip_val=clip_val, gradient_clip_algorithm=algorithm)
    sparse_grads = []
    sparse = TinyRecommender(sparse_grad=True)
    sparse.head.weight.register_post_accumulate_grad_hook(
        lambda p: sparse_grads.append(p.grad.is_sparse)
    )
    moved = one_step(tmp_path, sparse, **options)
    assert sparse_grads == [True]  # the table's gradient was row-sparse
    expected = one_step(tmp_path, TinyRecommender(sparse_grad=False), **options)
    unclipped = one_step(tmp_path, TinyRecommender(sparse_grad=False))
    assert moved.keys() == expected.keys() == unclipped.keys()
    for name in moved:
        torch.testing.assert_close(moved[name], expected[name], msg=name)
    assert not torch.allclose(expected["head.weight"], unclipped["head.weight"])  # it clips


def test_trainer_value_clipping_with_lazy_adam(tmp_path):
    """The recipes' optimizer: LazyAdam's lazy update of the clipped row-sparse gradient."""
    moved = one_step(
        tmp_path,
        TinyRecommender(sparse_grad=True, optimizer=LazyAdam),
        gradient_clip_val=0.01,
        gradient_clip_algorithm="value",
    )
    assert moved["head.weight"].abs().amax() > 0


def test_mixin_listed_after_lightning_module_is_refused():
    with pytest.raises(TypeError, match="list SparseGradientClipping first"):

        class Shadowed(L.LightningModule, SparseGradientClipping):
            pass


def test_without_the_mixin_lazy_adam_names_it(tmp_path):
    class Plain(L.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.encoder = nn.Linear(4, D)
            self.head = SampledSoftmaxHead(N, D, num_negatives=6, sparse_grad=True)

        training_step = TinyRecommender.training_step

        def configure_optimizers(self):
            return LazyAdam(self.parameters())

    with pytest.raises(RuntimeError, match=r"lightning_sampled\.optim\.SparseGradientClipping"):
        one_step(tmp_path, Plain(), gradient_clip_val=0.01, gradient_clip_algorithm="value")
