"""``ShardMap``: the strided split of the classes over ranks, by brute force."""

import pytest
import torch

from lightning_sampled.sharding import ShardMap


@pytest.mark.parametrize("num_classes,world", [(23, 2), (10, 3), (7, 7), (100, 4)])
def test_every_class_lives_on_exactly_one_rank_at_its_local_row(num_classes, world):
    maps = [ShardMap(num_classes, world, r) for r in range(world)]
    ids = torch.cat([m.shard_ids() for m in maps])
    assert sorted(ids.tolist()) == list(range(num_classes))
    assert max(m.num_local() for m in maps) - min(m.num_local() for m in maps) <= 1
    every = torch.arange(num_classes)
    for m in maps:
        local = m.local_or(every)
        mine = m.shard_ids()
        assert torch.equal(local[mine], torch.arange(mine.numel()))
        assert (local[m.owner(every) != m.rank] == -1).all()
        assert torch.equal(m.global_ids(torch.arange(mine.numel())), mine)
        assert m.num_local() == mine.numel()


def test_frequency_sorted_ids_spread_over_the_ranks():
    """The most frequent classes (the smallest ids) are on every rank, not all on rank 0."""
    maps = [ShardMap(1000, 4, r) for r in range(4)]
    assert [int((m.shard_ids() < 8).sum()) for m in maps] == [2, 2, 2, 2]


def test_padding_and_negative_ids():
    m = ShardMap(10, 3, 1)
    assert m.local_padding(4) == 1 and m.local_padding(3) is None and m.local_padding(None) is None
    assert m.local_or(torch.tensor([-1, -100, 1])).tolist() == [-1, -1, 0]
    assert m.global_ids(torch.tensor([-1, 2])).tolist() == [-1, 7]


@pytest.mark.parametrize(
    "args,match",
    [((3, 4, 0), "at least one row"), ((10, 2, 2), "rank must be"), ((0, 2, 0), "num_classes")],
)
def test_bad_maps_are_refused(args, match):
    with pytest.raises(ValueError, match=match):
        ShardMap(*args)
