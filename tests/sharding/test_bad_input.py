"""Bad input on one rank of a split table never hangs the others: every rank raises the same
clear error (``RankInputError``, naming the failing rank) within seconds, on two gloo processes.

One spawn runs every case in turn over a process group whose timeout is 8 s, so that a call
that leaves a rank waiting fails that case fast (a gloo timeout, not the error asked for)
instead of hanging the test. After the cases both ranks make one more call together, which
only works if every case left them in step."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from gloo_ranks import run_on_ranks

from lightning_sampled.heads import FullSoftmaxHead, SampledSoftmaxHead
from lightning_sampled.samplers import LogUniformSampler, UniformSampler

N, D, WORLD = 23, 6, 2
GROUP_TIMEOUT_S = 8
#: the issue's bound on how long every rank may take to raise
WITHIN_S = 10.0


def batch(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(10 + rank)
    return torch.randn(4 + rank, D, generator=g), torch.randint(N, (4 + rank,), generator=g)


def bad_target(rank: int, bad_rank: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``bad_rank``'s batch holds the target ``N``, out of range."""
    z, y = batch(rank)
    if rank == bad_rank:
        y[1] = N
    return z, y


def heads(group) -> dict:
    torch.manual_seed(0)
    return {
        "full": FullSoftmaxHead(N, D, sharded=True, process_group=group),
        "sampled": SampledSoftmaxHead(N, D, num_negatives=5, sharded=True, process_group=group),
    }


def cases(rank: int, group) -> dict:
    """Each case's call on this rank: only one rank's input (or only the ranks' agreement) is
    bad."""
    built = heads(group)
    full, sampled = built["full"], built["sampled"]

    def weights(rank):
        w = torch.ones(4 + rank)
        if rank == 1:
            w[0] = -1.0
        return w

    def different_sampler():
        sampler = (UniformSampler if rank == 0 else LogUniformSampler)(N)
        SampledSoftmaxHead(N, D, sampler, 5, sharded=True, process_group=group)

    def no_drawable_class():  # rank 1 holds class 1 only, the padding class
        sampler = UniformSampler(3, padding_idx=1)
        SampledSoftmaxHead(3, D, sampler, 2, padding_idx=1, sharded=True, process_group=group)

    return {
        "full_forward_target": lambda: full(*bad_target(rank)).backward(),
        "sampled_forward_target": lambda: sampled(*bad_target(rank)).backward(),
        "sampled_negative_weight": lambda: sampled(*batch(rank), weights(rank)),
        "full_loss_target": lambda: sampled.full_loss(*bad_target(rank, bad_rank=0)),
        "log_prob_wrong_dim": lambda: full.log_prob(
            torch.randn(3, D + rank), torch.zeros(3, dtype=torch.long)
        ),
        "topk_k_differs": lambda: full.topk(batch(rank)[0], 3 + rank),
        "topk_k_too_large": lambda: sampled.topk(batch(rank)[0], N + rank),
        "topk_exclude_out_of_range": lambda: full.topk(
            batch(rank)[0], 3, exclude=torch.full((4 + rank, 2), N * rank)
        ),
        "embed_out_of_range": lambda: full.embed(torch.tensor([[0, -5 * (1 - rank)]])),
        "sampler_kind_differs": different_sampler,
        "rank_without_a_drawable_class": no_drawable_class,
    }


#: what every rank's error must say, per case
EXPECTED = {
    "full_forward_target": "FullSoftmaxHead.forward failed on rank 1 of 2 (rank 1: IndexError: "
    "target must be in [0, 23)",
    "sampled_forward_target": "SampledSoftmaxHead.forward failed on rank 1 of 2 (rank 1: "
    "IndexError: target must be in [0, 23)",
    "sampled_negative_weight": "SampledSoftmaxHead.forward failed on rank 1 of 2 (rank 1: "
    "ValueError: sample_weight must be non-negative",
    "full_loss_target": "SampledSoftmaxHead.full_loss failed on rank 0 of 2 (rank 0: "
    "IndexError: target must be in [0, 23)",
    "log_prob_wrong_dim": "FullSoftmaxHead.log_prob failed on rank 1 of 2 (rank 1: ValueError: "
    "z must have shape [..., 6] to match the class table [23, 6], got (3, 7)",
    "topk_k_differs": "the ranks disagree on FullSoftmaxHead.topk: {'k': [3, 4]}",
    "topk_k_too_large": "SampledSoftmaxHead.topk failed on rank 1 of 2 (rank 1: ValueError: "
    "k must be <= num_classes=23, got 24",
    "topk_exclude_out_of_range": "FullSoftmaxHead.topk failed on rank 1 of 2 (rank 1: "
    "IndexError: exclude must be in [0, 23)",
    "embed_out_of_range": "FullSoftmaxHead.embed failed on rank 0 of 2 (rank 0: IndexError: "
    "ids must be in [0, 23)",
    "sampler_kind_differs": "the ranks disagree on the sharded head: {'sampler': "
    "['UniformSampler', 'LogUniformSampler']}",
    "rank_without_a_drawable_class": "SampledSoftmaxHead.shard failed on rank 1 of 2 (rank 1: "
    "ValueError: a rank holds no class that UniformSampler draws",
}


def run(rank: int) -> dict:
    group = dist.new_group([0, 1], timeout=timedelta(seconds=GROUP_TIMEOUT_S))
    results = {}
    for name, call in cases(rank, group).items():
        start = time.perf_counter()
        try:
            call()
            outcome = ("no error", "")
        except Exception as error:  # noqa: BLE001 (the error is the result)
            outcome = (type(error).__name__, str(error))
        results[name] = (*outcome, time.perf_counter() - start)
    # still in step: both ranks' exclusions are optional (one passes none) and topk works
    full = heads(group)["full"]
    exclude = torch.full((5, 1), 2) if rank == 1 else None
    results["after"] = full.topk(batch(rank)[0], 4, exclude=exclude)
    results["whole"] = full.whole_table()["weight"]
    return results


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return run_on_ranks(run, tmp_path_factory.mktemp("bad_input"), WORLD)


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_every_rank_raises_the_same_clear_error_within_seconds(ranks, case):
    for rank in range(WORLD):
        kind, message, seconds = ranks[rank][case]
        assert kind == "RankInputError", (rank, kind, message)
        assert EXPECTED[case] in message, (rank, message)
        assert seconds < WITHIN_S, (rank, seconds)
    assert ranks[0][case][1] == ranks[1][case][1]  # the same message on every rank


def test_the_ranks_stay_in_step_and_exclude_may_be_left_out_on_one_rank(ranks):
    head = FullSoftmaxHead(N, D)
    with torch.no_grad():
        head.weight.copy_(ranks[0]["whole"])
    for rank in range(WORLD):
        z = batch(rank)[0]
        want = head.topk(z, 4, exclude=torch.full((5, 1), 2) if rank == 1 else None)
        values, ids = ranks[rank]["after"]
        torch.testing.assert_close(values, want[0])
        assert torch.equal(ids, want[1])
