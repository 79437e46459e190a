"""Two gloo processes seeded alike: the index is identical on both ranks, the negatives are not,
and an odd-sized evaluation set is split over the ranks without padding."""

import copy
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lightning_sampled.callbacks import IndexRefresh
from lightning_sampled.heads import OneVsEachHead, SampledSoftmaxHead
from lightning_sampled.metrics import evaluation_sampler
from lightning_sampled.samplers import MIDXSampler, UniformSampler

NUM_CLASSES, DIM, DRAWS, EVAL_ROWS = 300, 8, 64, 7


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def draw_on_rank(rank: int, port: int, out_dir: str) -> None:
    """Builds a MIDX head whose class table differs per rank, refreshes its index (rank 0 builds
    and broadcasts) and draws negatives; saves the index buffers, the draws and the rows of an
    odd-sized evaluation set that this rank evaluates."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        torch.manual_seed(0)  # as seed_everything: the same global stream on every rank
        sampler = MIDXSampler(NUM_CLASSES, codebook_size=8, kmeans_iters=5)
        head = SampledSoftmaxHead(NUM_CLASSES, DIM, sampler, num_negatives=DRAWS)
        with torch.no_grad():
            head.weight.mul_(rank + 1)  # a rank-local table: only the broadcast makes them agree
        IndexRefresh().refresh(head)
        z = torch.randn(4, DIM)
        target = torch.arange(4)
        uniform = UniformSampler(NUM_CLASSES)
        ove = OneVsEachHead(NUM_CLASSES, DIM, None, DRAWS)
        same_on_every_rank = UniformSampler(NUM_CLASSES)
        same_on_every_rank.rank_offset = False
        from_the_default_generator = UniformSampler(NUM_CLASSES)
        from_the_default_generator.own_stream = False
        global_before_draws = torch.get_rng_state()
        draws = {
            "midx": sampler.sample(z, DRAWS).ids,
            "uniform": uniform.sample(z, DRAWS).ids,
            "ove": ove.draw(z, target)[0],
            "uniform_no_offset": same_on_every_rank.sample(z, DRAWS).ids,
        }
        global_after_own_draws = torch.get_rng_state()
        draws["uniform_default_generator"] = from_the_default_generator.sample(z, DRAWS).ids
        torch.save(
            {
                # the index buffers (tensors) and the sampler's draw stream state (a dict)
                "index": {
                    k: v.clone() if torch.is_tensor(v) else v
                    for k, v in sampler.state_dict().items()
                },
                **draws,
                "own_draws_leave_global": torch.equal(global_before_draws, global_after_own_draws),
                "global_after": torch.rand(3),
                "global_state_after": torch.get_rng_state(),
                "eval_rows": list(evaluation_sampler(range(EVAL_ROWS))),
            },
            os.path.join(out_dir, f"rank{rank}.pt"),
        )
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp_streams")
    # spawn, not fork: a fork of a process whose OpenMP pool is running (any earlier test) hangs
    mp.start_processes(draw_on_rank, args=(free_port(), str(out)), nprocs=2, start_method="spawn")
    return [torch.load(out / f"rank{r}.pt") for r in range(2)]


def test_ranks_hold_the_same_index(ranks):
    first, second = (r["index"] for r in ranks)
    assert first.keys() == second.keys() and first
    assert any(torch.is_tensor(v) for v in first.values())
    for name in first:
        if torch.is_tensor(first[name]):
            assert torch.equal(first[name], second[name]), name
        else:  # the draw stream's {"seed", "draws"}: the same on every rank
            assert first[name] == second[name], name


@pytest.mark.parametrize("sampler", ["midx", "uniform", "ove"])
def test_ranks_draw_different_negatives(ranks, sampler):
    first, second = (r[sampler] for r in ranks)
    assert first.shape == second.shape == (4, DRAWS)
    assert (first != second).float().mean() > 0.5


def test_ranks_draw_the_same_negatives_without_rank_offset(ranks):
    assert torch.equal(ranks[0]["uniform_no_offset"], ranks[1]["uniform_no_offset"])


def test_ranks_global_generator_stays_in_step(ranks):
    """The samplers' streams are seeded from the global generator, and the rank-dependent draws
    never consume it: the ranks' global generators stay identical through building the samplers,
    refreshing the index on rank 0 only, drawing different negatives per rank, and drawing from
    the default generator (``own_stream = False``, the same draws on every rank)."""
    assert all(r["own_draws_leave_global"] for r in ranks)
    assert torch.equal(ranks[0]["uniform_default_generator"], ranks[1]["uniform_default_generator"])
    assert torch.equal(ranks[0]["global_state_after"], ranks[1]["global_state_after"])
    assert torch.equal(ranks[0]["global_after"], ranks[1]["global_after"])


def test_single_process_draws_from_the_samplers_own_stream():
    """Without ``torch.distributed`` a sampler draws from its own stream, not from torch's global
    generator: reseeding the global generator does not repeat a draw, a draw does not advance the
    global generator, and restoring the stream's state (the sampler's ``state_dict``) repeats the
    draw whatever the global generator holds. The stream is seeded when the sampler is built, so
    two samplers built after the same ``torch.manual_seed`` draw alike."""
    z = torch.zeros(2, DIM)
    torch.manual_seed(3)
    sampler = UniformSampler(NUM_CLASSES)
    saved = copy.deepcopy(sampler.state_dict())
    torch.manual_seed(3)
    global_before = torch.get_rng_state()
    ids = sampler.sample(z, 5).ids
    assert torch.equal(torch.get_rng_state(), global_before)
    torch.manual_seed(3)
    assert not torch.equal(ids, torch.randint(NUM_CLASSES, (2, 5)))
    torch.manual_seed(3)
    assert not torch.equal(sampler.sample(z, 5).ids, ids)  # the stream advanced
    sampler.load_state_dict(saved)
    torch.manual_seed(7)
    assert torch.equal(sampler.sample(z, 5).ids, ids)
    torch.manual_seed(3)
    twin = UniformSampler(NUM_CLASSES)
    torch.manual_seed(11)
    assert torch.equal(twin.sample(z, 5).ids, ids)


def test_evaluation_rows_are_split_without_padding(ranks):
    first, second = (r["eval_rows"] for r in ranks)
    assert sorted(first + second) == list(range(EVAL_ROWS))


def test_evaluation_sampler_is_the_default_in_a_single_process():
    assert evaluation_sampler(range(EVAL_ROWS)) is None
