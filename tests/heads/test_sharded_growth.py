"""``add_classes`` on a table split across two gloo processes: every rank gains the new classes it
holds by the layout's rule (class ``c`` on rank ``c mod W``), with their optimizer state and its
proposal's rows, the grown head equals an unsharded head grown alike, its checkpoints (its own
rows, or the whole table) load into a head of the new size, a one-process sharded head's grown
checkpoint loads into the split head, and a refusal is every rank's."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from gloo_ranks import run_on_ranks

from lightning_sampled.heads import FullSoftmaxHead, SampledSoftmaxHead
from lightning_sampled.samplers import LogUniformSampler

N, D, NEW, WORLD = 11, 4, 5, 2  # 6 + 5 rows; the new classes 11..15: 3 on rank 1, 2 on rank 0


def table() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(N, D, generator=g), torch.randn(N, generator=g) * 0.3


def new_rows() -> torch.Tensor:
    return torch.randn(NEW, D, generator=torch.Generator().manual_seed(1))


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s queries ``[4, D]`` and targets; after growth (``step`` 1) they include
    new classes of both ranks."""
    g = torch.Generator().manual_seed(10 * step + rank)
    y = torch.randint(N, (4,), generator=g)
    if step:
        y[:2] = torch.tensor([N + rank, N + NEW - 1])
    return torch.randn(4, D, generator=g), y


def full_head(num_classes: int = N, group=None) -> FullSoftmaxHead:
    head = FullSoftmaxHead(num_classes, D, sharded=True, bias=True, process_group=group)
    head.shard()
    return head


def step(head, optimizer, rank: int, when: int) -> torch.Tensor:
    optimizer.zero_grad()
    loss = head(*batch(rank, when))
    loss.backward()
    optimizer.step()
    return loss.detach()


def run_full(rank: int) -> dict:
    head = full_head()
    weight, bias = table()
    with torch.no_grad():
        head.weight.copy_(weight[head.shard_ids])
        head.bias.copy_(bias[head.shard_ids])
    optimizer = torch.optim.Adam(head.parameters(), lr=0.1)
    step(head, optimizer, rank, 0)
    before = {name: x.clone() for name, x in head.whole_table().items()}
    old_rows = head.weight.detach().clone()
    old_moment = optimizer.state[head.weight]["exp_avg"].clone()
    head.add_classes(NEW, new_rows(), optimizers=[optimizer])
    z, y = batch(rank, 1)
    out = {
        "before": before,
        "old_rows": old_rows,
        "old_moment": old_moment,
        "shard_ids": head.shard_ids,
        "layout": head.shard_layout.tolist(),
        "weight": head.weight.detach().clone(),
        "moment": optimizer.state[head.weight]["exp_avg"].clone(),
        "full_loss": head.full_loss(z, y),
        "log_prob": head.log_prob(z, y),
        "topk": head.topk(z, 7),
        "whole": head.whole_table(),
    }
    optimizer.zero_grad()
    loss = head(z, y)
    loss.backward()
    out["loss"], out["weight_grad"] = loss.detach(), head.weight.grad.clone()
    # checkpoints: this rank's rows (its own layout), and the whole table (ShardedTables')
    state = head.state_dict()
    own = full_head(N + NEW)
    own.load_state_dict(state)
    whole = full_head(N + NEW)
    whole.load_state_dict({**state, **out["whole"], "shard_layout": torch.tensor([N + NEW, 1, 0])})
    out["reloaded"] = [own.weight.detach(), whole.weight.detach(), whole.bias.detach()]
    return out


def run_sampled(rank: int) -> dict:
    """A sampled head with in-batch negatives (``q_b`` over every class) and a log-uniform
    proposal restricted to the rank's rows: both grow; a step over new classes trains them."""
    torch.manual_seed(0)
    head = SampledSoftmaxHead(N, D, LogUniformSampler(N), 3, sharded=True)
    head.add_classes(NEW, new_rows())
    z, y = batch(rank, 1)
    head(z, y).backward()
    return {
        "sampler_classes": head.sampler.num_classes,
        "rows": head.weight.shape[0],
        "frequency_classes": head.target_frequency.count.numel(),
        "new_rows_grad": head.weight.grad[-2:].abs().sum(dim=1),
        "draws": head.sampler.sample(torch.zeros(1, D), 2000).ids.unique(),
    }


def run_one_process_into_split(rank: int) -> dict:
    """A sharded head in a group of one (one process holds the whole table) grows, and its
    checkpoint loads into the head split over both ranks."""
    solo = [dist.new_group([r]) for r in range(WORLD)][rank]
    torch.manual_seed(0)
    alone = full_head(group=solo)
    alone.add_classes(NEW, new_rows())
    split = full_head(N + NEW)
    split.load_state_dict(alone.state_dict())
    return {
        "layout": alone.shard_layout.tolist(),
        "alone": alone.weight.detach(),
        "split": split.weight.detach(),
        "ids": split.shard_ids,
    }


def refusal(rank: int, num_new: int, init: torch.Tensor) -> tuple[str, list]:
    head = full_head()
    before = head.weight.detach().clone()
    try:
        head.add_classes(num_new, init)
        message = "no error"
    except ValueError as error:
        message = f"{type(error).__name__}: {error}"
    unchanged = [head.num_classes == N, torch.equal(head.weight, before)]
    return message, [*unchanged, head.shard_layout.tolist() == [N, WORLD, rank]]


def run(rank: int) -> dict:
    nan = new_rows()
    if rank == 1:
        nan[2, 0] = float("nan")
    return {
        "full": run_full(rank),
        "sampled": run_sampled(rank),
        "one_process": run_one_process_into_split(rank),
        "nan_on_one_rank": refusal(rank, NEW, nan),
        "num_new_differs": refusal(rank, NEW + rank, torch.zeros(NEW + rank, D)),
    }


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return run_on_ranks(run, tmp_path_factory.mktemp("growth"), WORLD)


def test_each_rank_gains_the_new_classes_it_holds_with_their_optimizer_rows(ranks):
    init = new_rows()
    for rank in range(WORLD):
        got = ranks[rank]["full"]
        ids = got["shard_ids"]
        assert ids.tolist() == list(range(rank, N + NEW, WORLD))
        assert got["layout"] == [N + NEW, WORLD, rank]
        old = got["old_rows"].shape[0]
        assert torch.equal(got["weight"][:old], got["old_rows"])  # the old rows kept exactly
        assert torch.equal(got["weight"][old:], init[ids[old:] - N])
        assert torch.equal(got["moment"][:old], got["old_moment"])
        assert got["moment"].shape[0] == len(ids) and not got["moment"][old:].any()
    assert [len(ranks[r]["full"]["old_rows"]) for r in range(WORLD)] == [6, 5]
    assert [len(ranks[r]["full"]["weight"]) for r in range(WORLD)] == [8, 8]


def test_the_grown_split_head_equals_an_unsharded_head_grown_alike(ranks):
    before = ranks[0]["full"]["before"]
    head = FullSoftmaxHead(N, D, bias=True)
    with torch.no_grad():
        head.weight.copy_(before["weight"])
        head.bias.copy_(before["bias"])
    head.add_classes(NEW, new_rows())
    total = 0.0
    for rank in range(WORLD):
        got = ranks[rank]["full"]
        assert torch.equal(got["whole"]["weight"], head.weight)
        z, y = batch(rank, 1)
        torch.testing.assert_close(got["full_loss"], head.full_loss(z, y))
        torch.testing.assert_close(got["log_prob"], head.log_prob(z, y))
        values, ids = head.topk(z, 7)
        torch.testing.assert_close(got["topk"][0], values)
        assert torch.equal(got["topk"][1], ids)
        loss = head(z, y)
        torch.testing.assert_close(got["loss"], loss.detach())
        total = total + loss / WORLD
    total.backward()
    for rank in range(WORLD):
        got = ranks[rank]["full"]
        torch.testing.assert_close(got["weight_grad"], head.weight.grad[got["shard_ids"]])


def test_the_grown_heads_checkpoints_load_into_a_head_of_the_new_size(ranks):
    for rank in range(WORLD):
        got = ranks[rank]["full"]
        own, whole, whole_bias = got["reloaded"]
        assert torch.equal(own, got["weight"]) and torch.equal(whole, got["weight"])
        assert torch.equal(whole_bias, got["whole"]["bias"][got["shard_ids"]])


def test_a_sampled_head_grows_its_restricted_proposal_and_in_batch_estimate(ranks):
    for rank in range(WORLD):
        got = ranks[rank]["sampled"]
        assert got["sampler_classes"] == got["rows"] == len(range(rank, N + NEW, WORLD))
        assert got["frequency_classes"] == N + NEW  # q_b covers every class, on every rank
        assert (got["new_rows_grad"] > 0).any()  # a new class, a target, trained
        assert got["draws"].max() == got["rows"] - 1  # the proposal draws the new rows too


def test_a_one_process_sharded_heads_grown_checkpoint_loads_into_the_split_head(ranks):
    for rank in range(WORLD):
        got = ranks[rank]["one_process"]
        assert got["layout"] == [N + NEW, 1, 0]
        assert torch.equal(got["split"], got["alone"][got["ids"]])


@pytest.mark.parametrize(
    "case,expected",
    [
        (
            "nan_on_one_rank",
            "RankInputError: FullSoftmaxHead.add_classes failed on rank 1 of 2 (rank 1: "
            "ValueError: init gave new rows with NaN or infinite entries",
        ),
        (
            "num_new_differs",
            "RankInputError: the ranks disagree on FullSoftmaxHead.add_classes: "
            "{'num_new': [5, 6]}",
        ),
    ],
)
def test_a_refusal_is_every_ranks_and_nothing_grows(ranks, case, expected):
    for rank in range(WORLD):
        message, unchanged = ranks[rank][case]
        assert message.startswith(expected), message
        assert all(unchanged)
