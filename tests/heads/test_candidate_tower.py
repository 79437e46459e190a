"""A candidate tower (``candidate_encoder``): class vectors computed by a module from item
features. The head scores exactly what a table head holding the tower's outputs scores, gradients
reach the tower through the chain rule, a training step calls the tower only on the ids it
scores, and MIDX indexes the tower's outputs."""

import pytest
import torch
from fake_samplers import restart_draws
from torch import nn

from lightning_sampled.heads import CaneHead, FullSoftmaxHead, SampledSoftmaxHead
from lightning_sampled.samplers import MIDXSampler, UniformSampler

N, F, D = 45, 5, 6


class Tower(nn.Module):
    """Item features ``[N, F]`` through a linear layer; records the ids it is called on."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Parameter(torch.randn(N, F))
        self.linear = nn.Linear(F, D)
        self.calls: list[torch.Tensor] = []

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        self.calls.append(ids.detach().reshape(-1))
        return self.linear(self.features[ids])


def pair(make, **options):
    """A tower head and a table head holding the tower's outputs, with the same bias."""
    torch.manual_seed(0)
    tower = Tower()
    head = make(candidate_encoder=tower, bias=True, **options)
    table = make(bias=True, **options)
    with torch.no_grad():
        table.weight.copy_(tower(torch.arange(N)))
        table.bias.copy_(head.bias)
    tower.calls.clear()
    return tower, head, table


def tower_grads(tower, table_grad):
    """The tower's gradients by the chain rule from a table's gradient ``[N, D]``."""
    params = list(tower.parameters())
    return torch.autograd.grad(tower(torch.arange(N)), params, table_grad)


@pytest.mark.parametrize("kind", ["sampled", "full"])
def test_the_tower_head_is_the_table_head_of_its_outputs(kind):
    if kind == "sampled":
        make = lambda **o: SampledSoftmaxHead(N, D, UniformSampler(N), 7, chunk_size=8, **o)  # noqa: E731
    else:
        make = lambda **o: FullSoftmaxHead(N, D, chunk_size=8, **o)  # noqa: E731
    tower, head, table = pair(make)
    z, target = torch.randn(3, 4, D), torch.randint(N, (3, 4))
    restart_draws(head, 5)
    restart_draws(table, 5)
    loss, want = head(z, target), table(z, target)
    torch.testing.assert_close(loss, want)
    loss.backward()
    want.backward()
    for got, expected in zip(
        (p.grad for p in tower.parameters()), tower_grads(tower, table.weight.grad), strict=True
    ):
        torch.testing.assert_close(got, expected)
    torch.testing.assert_close(head.bias.grad, table.bias.grad)
    torch.testing.assert_close(head.full_loss(z, target), table.full_loss(z, target))
    torch.testing.assert_close(head.log_prob(z, target), table.log_prob(z, target))
    torch.testing.assert_close(head.logits(z), table.logits(z))
    assert torch.equal(head.topk(z, 5)[1], table.topk(z, 5)[1])


def test_a_training_step_calls_the_tower_on_the_scored_ids_only():
    tower, head, _ = pair(lambda **o: SampledSoftmaxHead(N, D, UniformSampler(N), 4, **o))
    target = torch.tensor([3, 9, 20])
    head(torch.randn(3, D), target).backward()
    called = torch.cat(tower.calls)
    # the targets, each query's 4 negatives and the batch's 3 distinct targets (the default
    # in-batch negatives)
    assert called.numel() == 3 * (1 + 4) + 3
    assert set(target.tolist()) <= set(called.tolist())


def test_midx_indexes_the_towers_outputs():
    tower = Tower()
    head = SampledSoftmaxHead(N, D, MIDXSampler(N, 3, kmeans_iters=2), 5, candidate_encoder=tower)
    head.refresh_index()
    on_table = MIDXSampler(N, 3, kmeans_iters=2)
    on_table.refresh(tower(torch.arange(N)).detach())
    assert torch.equal(head.sampler.class_cells, on_table.class_cells)
    z = torch.randn(2, D)
    torch.testing.assert_close(
        head.sampler.log_prob(z, torch.arange(N)), on_table.log_prob(z, torch.arange(N))
    )


def test_what_a_tower_cannot_do_is_refused():
    tower = Tower()
    with pytest.raises(ValueError, match="neither weight= nor sharded=True"):
        FullSoftmaxHead(N, D, candidate_encoder=tower, weight=nn.Parameter(torch.zeros(N, D)))
    with pytest.raises(ValueError, match="sparse_grad=True needs a class table"):
        SampledSoftmaxHead(N, D, candidate_encoder=tower, sparse_grad=True)
    with pytest.raises(ValueError, match="CaneHead cannot take a candidate_encoder"):
        CaneHead(N, D, num_candidates=3, num_noise=3, candidate_encoder=tower)
    with pytest.raises(ValueError, match="no table to grow"):
        FullSoftmaxHead(N, D, candidate_encoder=tower).add_classes(3)
    with pytest.raises(ValueError, match="must be an nn.Module"):
        FullSoftmaxHead(N, D, candidate_encoder=lambda ids: ids)
    wrong = FullSoftmaxHead(N, D + 1, candidate_encoder=tower)
    with pytest.raises(ValueError, match=r"candidate_encoder must map ids \(2,\) to vectors"):
        wrong.embed(torch.tensor([1, 2]))


class IntegerTower(Tower):
    """The right shape, the wrong kind: integer vectors, through which no gradient flows."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return super().forward(ids).round().long()


@pytest.mark.parametrize("kind", ["sampled", "full"])
def test_a_tower_returning_integer_vectors_is_refused(kind):
    make = SampledSoftmaxHead if kind == "sampled" else FullSoftmaxHead
    head = make(N, D, candidate_encoder=IntegerTower())
    z, target = torch.randn(4, D), torch.randint(N, (4,))
    for call in (lambda: head(z, target), lambda: head.full_loss(z, target)):
        with pytest.raises(ValueError, match="must return floating-point vectors, got torch.int64"):
            call()
