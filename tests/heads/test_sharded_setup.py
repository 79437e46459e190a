"""``sharded=True`` in one process and its bad input: the heads that refuse it, the options it
refuses, the samplers' restrictions to a shard and the allocation of draws, and checkpoints of
the whole table or of another split."""

import math

import pytest
import torch

from lightning_sampled.heads import (
    CaneHead,
    FullSoftmaxHead,
    OneVsEachHead,
    SampledSoftmaxHead,
    TapasHead,
)
from lightning_sampled.heads.stratified import stratum_size
from lightning_sampled.heads.table_init import BLOCK_ROWS, seeded_rows
from lightning_sampled.samplers import (
    LogUniformSampler,
    MIDXSampler,
    MixtureSampler,
    UniformSampler,
    UnigramSampler,
)
from lightning_sampled.sharding import ShardMap

N, D = 23, 4


@pytest.mark.parametrize(
    "head_type,args", [(OneVsEachHead, ()), (TapasHead, ()), (CaneHead, (3, 5))]
)
def test_heads_without_a_sharded_objective_refuse_it_by_name(head_type, args):
    with pytest.raises(ValueError, match=f"{head_type.__name__} cannot be sharded: its"):
        head_type(N, D, *args, sharded=True)


@pytest.mark.parametrize(
    "build,match",
    [
        (
            lambda: FullSoftmaxHead(
                N, D, sharded=True, weight=torch.nn.Parameter(torch.zeros(N, D))
            ),
            "weight=None",
        ),
        (lambda: FullSoftmaxHead(N, D, sharded="yes"), "sharded must be a bool"),
        (lambda: FullSoftmaxHead(N, D, sharded=True, backend="triton"), "does not support sharded"),
    ],
)
def test_options_a_sharded_head_cannot_take_are_refused(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_in_one_process_shard_creates_every_row_and_the_head_equals_the_unsharded_one():
    sharded = FullSoftmaxHead(N, D, sharded=True, bias=True)
    assert sharded.table_deferred and sharded.weight.is_meta and sharded.bias.is_meta
    z, y = torch.randn(5, D), torch.randint(N, (5,))
    with pytest.raises(RuntimeError, match=r"head\.shard\(\)"):
        sharded(z, y)
    sharded.shard()
    assert not sharded.is_split and not sharded.table_deferred
    assert torch.equal(sharded.shard_ids, torch.arange(N))
    assert sharded.weight.shape == (N, D) and torch.equal(sharded.bias, torch.zeros(N))
    bound = D**-0.5
    assert sharded.weight.abs().max() <= bound and sharded.weight.std() > bound / 3
    weight = sharded.weight.detach().clone()
    sharded.shard()  # done once
    assert torch.equal(sharded.weight, weight)
    plain = FullSoftmaxHead(N, D, bias=True)
    with torch.no_grad():
        plain.weight.copy_(sharded.weight)
        plain.bias.copy_(torch.randn(N))
        sharded.bias.copy_(plain.bias)
    torch.testing.assert_close(sharded(z, y), plain(z, y))
    with pytest.raises(ValueError, match="sharded=False"):
        plain.shard()


def test_a_deferred_table_is_the_same_at_any_world_size_and_any_block():
    seed, n, d = 7, 3 * BLOCK_ROWS + 5, 3
    whole = seeded_rows(seed, n, d, torch.arange(n))
    for world in (2, 3, 8):
        for rank in range(world):
            ids = ShardMap(n, world, rank).shard_ids()
            assert torch.equal(seeded_rows(seed, n, d, ids), whole[ids])
    assert not torch.equal(seeded_rows(seed + 1, n, d, torch.arange(n)), whole)
    blocks = whole[: 3 * BLOCK_ROWS].reshape(3, BLOCK_ROWS, d)
    assert not torch.equal(blocks[0], blocks[1])  # each block has its own stream
    with pytest.raises(ValueError, match="ascending"):
        seeded_rows(seed, n, d, torch.tensor([3, 1]))


def test_a_deferred_head_loads_a_checkpoint_into_real_rows():
    plain = FullSoftmaxHead(N, D, bias=True)
    with torch.no_grad():
        plain.bias.copy_(torch.randn(N))
    sharded = FullSoftmaxHead(N, D, sharded=True, bias=True)
    sharded.load_state_dict(plain.state_dict())
    assert torch.equal(sharded.weight, plain.weight) and torch.equal(sharded.bias, plain.bias)


def test_a_one_process_sharded_head_grows_and_loads_its_own_checkpoint():
    """In one process a sharded head holds the whole table and can grow it; its layout grows
    with it (it used to keep the old size, so that its own checkpoint could not load into a head
    of the new size: "rows of rank 0 of a table of 23 classes split over 1 ranks")."""
    head = SampledSoftmaxHead(N, D, num_negatives=3, sharded=True, bias=True)
    head.shard()
    head.add_classes(15)
    assert head.shard_layout.tolist() == [N + 15, 1, 0]
    grown = SampledSoftmaxHead(N + 15, D, num_negatives=3, sharded=True, bias=True)
    grown.load_state_dict(head.state_dict())
    assert torch.equal(grown.weight, head.weight) and torch.equal(grown.bias, head.bias)
    plain = SampledSoftmaxHead(N + 15, D, num_negatives=3, bias=True)
    plain.load_state_dict(head.state_dict(), strict=False)
    assert torch.equal(plain.weight, head.weight)


@pytest.mark.parametrize(
    "sampler",
    [
        UniformSampler(N, padding_idx=4),
        LogUniformSampler(N, padding_idx=4),
        UnigramSampler(torch.arange(N).float() + 1, alpha=0.5, padding_idx=4),
    ],
    ids=["uniform", "log_uniform", "unigram"],
)
def test_a_restricted_static_proposal_is_the_proposal_renormalised_over_the_shard(sampler):
    ids = torch.arange(0, N, 2)  # holds the padding class 4 at local row 2
    local = sampler.restricted(ids)
    assert local.num_classes == ids.numel() and local.padding_idx == 2
    log_q = sampler.log_prob(torch.zeros(1, D), ids)
    want = log_q - torch.logsumexp(log_q, 0)
    got = local.log_prob(torch.zeros(1, D), torch.arange(ids.numel()))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    draws = local.sample(
        torch.zeros(1, D), 60000, shared=True, generator=torch.Generator().manual_seed(0)
    ).ids
    freq = torch.bincount(draws, minlength=ids.numel()).double() / draws.numel()
    assert freq[2] == 0
    torch.testing.assert_close(freq, want.exp().double(), rtol=0, atol=0.01)


def test_midx_restricts_to_an_unbuilt_index_of_the_shard_and_midx_learn_refuses():
    midx = MIDXSampler(N, codebook_size=8, dim=D, padding_idx=4)
    local = midx.restricted(torch.arange(1, N, 2))
    assert local.num_classes == 11 and local.padding_idx is None and local.codebook_size == 8
    assert not local.is_built
    with pytest.raises(ValueError, match=r"learnable=True\) cannot be restricted"):
        MIDXSampler(N, codebook_size=4, learnable=True, dim=D).restricted(torch.arange(3))
    mixture = MixtureSampler([UniformSampler(N), LogUniformSampler(N)], [0.5, 0.5])
    with pytest.raises(ValueError, match="MixtureSampler has no restriction"):
        mixture.restricted(torch.arange(3))


def test_draws_per_rank_follow_the_proposals_mass_on_the_rank():
    even, odd = torch.arange(0, N, 2), torch.arange(1, N, 2)
    assert [stratum_size(UniformSampler(N), ids, 7, D) for ids in (even, odd)] == [4, 4]
    assert [stratum_size(UniformSampler(N), ids, 100, D) for ids in (even, odd)] == [53, 48]
    log_uniform = LogUniformSampler(N)
    mass = log_uniform.log_prob(torch.zeros(1, D), even).exp().sum()
    assert stratum_size(log_uniform, even, 100, D) == math.ceil(100 * float(mass))
    midx = MIDXSampler(N, codebook_size=4, dim=D, padding_idx=4)
    assert stratum_size(midx, even, 100, D) == math.ceil(100 * 11 / 22)  # drawable share
    with pytest.raises(ValueError, match="holds no class"):
        stratum_size(UniformSampler(N, padding_idx=4), torch.tensor([4]), 10, D)


def test_a_whole_table_checkpoint_loads_and_another_split_is_refused():
    plain = FullSoftmaxHead(N, D, bias=True)
    sharded = FullSoftmaxHead(N, D, bias=True, sharded=True)
    sharded.load_state_dict(plain.state_dict())  # an unsharded head's checkpoint
    assert torch.equal(sharded.weight, plain.weight)
    state = sharded.state_dict()
    state["shard_layout"] = torch.tensor([N, 2, 1])
    state["weight"] = state["weight"][1::2]
    with pytest.raises(ValueError, match="rows of rank 1 of a table of 23 classes split over 2"):
        sharded.load_state_dict(state)


def test_a_split_table_refuses_logits_and_adaptive_topk_by_name():
    head = FullSoftmaxHead(N, D, sharded=True)
    head.shard_map = object.__new__(type("Fake", (), {"world_size": 2}))
    for method, call in (
        ("logits", lambda: head.logits(torch.randn(2, D))),
        ("adaptive_topk", lambda: head.adaptive_topk(torch.randn(2, D))),
    ):
        with pytest.raises(ValueError, match=f"FullSoftmaxHead.{method} is not available"):
            call()


def test_init_std_draws_new_tables_sharded_rows_and_added_classes_from_a_normal():
    torch.manual_seed(0)
    plain = FullSoftmaxHead(4000, 16, init_std=0.3)
    sharded = FullSoftmaxHead(4000, 16, init_std=0.3, sharded=True)
    sharded.shard()
    plain.add_classes(2000)
    for rows in (plain.weight[:4000], sharded.weight, plain.weight[4000:]):
        assert float(rows.std()) == pytest.approx(0.3, rel=0.03)
        assert float(rows.abs().max()) > 16**-0.5  # beyond the uniform default's bound
    assert float(FullSoftmaxHead(4000, 16).weight.abs().max()) <= 16**-0.5
    with pytest.raises(ValueError, match="init_std"):
        FullSoftmaxHead(N, D, init_std=-1.0)
