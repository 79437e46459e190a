"""Heads over a class table split across two gloo processes (``sharded=True``) against the same
head unsharded in one process: losses, gradients of every parameter, ``log_prob``,
``full_loss``, ``topk`` and ``evaluate_ranking``.

One spawn runs every case (a spawn costs seconds); each rank saves what it computed and the
tests compare with the unsharded head here. Sampled heads are compared on the draws each rank
made, recorded by a wrapper around its sampler: the reference rebuilds the stratified estimator
from them over the whole table."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lightning_sampled.callbacks import IndexRefresh
from lightning_sampled.heads import FullSoftmaxHead, SampledSoftmaxHead
from lightning_sampled.metrics import evaluate_ranking
from lightning_sampled.samplers import DrawStream, LogUniformSampler, MIDXSampler, UniformSampler
from lightning_sampled.sharding import whole_rows_on_first_rank

N, D, WORLD = 23, 6, 2  # 12 rows on rank 0, 11 on rank 1
ROWS = {0: 5, 1: 3}  # scored positions per rank (uneven), plus one ignored position each


def table() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(N, D, generator=g) * 0.7, torch.randn(N, generator=g) * 0.3


def rank_batch(rank: int, batch: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s queries ``[T + 1, D]`` and targets ``[T + 1]`` (the last one ignored)."""
    g = torch.Generator().manual_seed(100 + rank + 10 * batch)
    z = torch.randn(ROWS[rank] + 1, D, generator=g)
    y = torch.randint(N, (ROWS[rank] + 1,), generator=g)
    y[y == 4] = 5  # class 4 is the padding class of some cases
    y[-1] = -100
    return z, y


def exclude_of(rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(200 + rank)
    ex = torch.randint(N, (ROWS[rank] + 1, 3 + rank), generator=g)
    ex[0, 0] = -1
    return ex


FULL_CASES = {
    "plain": dict(),
    "bias_padding_smoothing": dict(bias=True, padding_idx=4, label_smoothing=0.1),
    "normalize_temperature": dict(normalize=True, temperature=0.5),
}
# every case names its convention: the reference (stratified_reference) implements it
SAMPLED_CASES = {
    "uniform_padding": dict(sampler="uniform", padding_idx=4, convention="exact_positive"),
    "log_uniform_corrected_all": dict(sampler="log_uniform", convention="corrected_all"),
    "log_uniform_shared_bias_padding": dict(
        sampler="log_uniform",
        shared_negatives=True,
        bias=True,
        padding_idx=4,
        convention="exact_positive",
    ),
    "uniform_tensorflow_sparse": dict(sampler="uniform", convention="tensorflow", sparse=True),
    "midx": dict(sampler="midx", convention="exact_positive"),
}
M = 7


def counts_with_a_zero() -> torch.Tensor:
    """Fixed target counts ``[N]`` with a 0 for class 5, a target of both ranks' batches (its
    ``q_b`` is floored at the batch's share)."""
    counts = torch.arange(N).float() % 5 + 1
    counts[5] = 0
    return counts


IN_BATCH_CASES = {
    "counts_with_a_zero": dict(target_counts=counts_with_a_zero()),
    "moving_average_corrected_all": dict(convention="corrected_all", bias=True),
    "tensorflow_padding_sparse": dict(
        convention="tensorflow", padding_idx=4, target_counts=counts_with_a_zero(), sparse=True
    ),
    # 5 of the 8 scored positions drawn, alike on every rank (the sampler's stream, not per rank)
    "limited_corrected_all": dict(max_in_batch_draws=5, convention="corrected_all", bias=True),
    # groups of 3 rows sharing their 5 draws (the last group of the 8 positions short)
    "grouped_corrected_all": dict(
        max_in_batch_draws=5, in_batch_group_size=3, convention="corrected_all", bias=True
    ),
}


def make_sampler(name: str, padding_idx: int | None = None):
    if name == "uniform":
        return UniformSampler(N, padding_idx=padding_idx)
    if name == "log_uniform":
        return LogUniformSampler(N, padding_idx=padding_idx)
    return MIDXSampler(N, codebook_size=3, quantizer="rq", dim=D, padding_idx=padding_idx)


def make_head(kind: str, options: dict, sharded: bool):
    options = dict(options)
    if kind == "full":
        head = FullSoftmaxHead(N, D, sharded=sharded, **options)
    elif kind == "in_batch":  # pure in-batch softmax, or mixed with num_negatives
        sparse = options.pop("sparse", False)
        head = SampledSoftmaxHead(
            N,
            D,
            UniformSampler(N, padding_idx=options.get("padding_idx")),
            options.pop("num_negatives", 0),
            in_batch_negatives=True,
            sharded=sharded,
            sparse_grad=sparse,
            **options,
        )
        head.sampler.draw_stream = DrawStream(7)  # the same drawn positions in the reference
    else:
        sampler = make_sampler(options.pop("sampler"), options.get("padding_idx"))
        sparse = options.pop("sparse", False)
        head = SampledSoftmaxHead(
            N, D, sampler, M, sharded=sharded, sparse_grad=sparse, in_batch_negatives=False,
            **options,
        )  # fmt: skip
    weight, bias = table()
    with torch.no_grad():
        ids = head.shard_ids
        head.weight.copy_(weight[ids])
        if head.bias is not None:
            head.bias.copy_(bias[ids])
    return head


class Recorder:
    """Wraps a head's sampler and keeps each draw as global ids with their ``log q``, whether
    the head draws alone (``sample``) or with its positives' scores (``sample_and_score``)."""

    def __init__(self, head) -> None:
        self.head, self.draws = head, []
        sample, sample_and_score = head.sampler.sample, head.sampler.sample_and_score

        def keep(draw, m):
            self.draws.append((head.shard_ids[draw.ids], draw.log_q, m))

        def recorded(z, m, **kwargs):
            draw = sample(z, m, **kwargs)
            keep(draw, m)
            return draw

        def recorded_with_scores(z, m, ids, **kwargs):
            draw, log_q = sample_and_score(z, m, ids, **kwargs)
            keep(draw, m)
            return draw, log_q

        head.sampler.sample = recorded
        head.sampler.sample_and_score = recorded_with_scores


def run_case(kind: str, options: dict, rank: int) -> dict:
    head = make_head(kind, options, sharded=True)
    if kind == "sampled" and options["sampler"] == "midx":
        IndexRefresh().refresh(head)  # each rank its own rows' index, nothing broadcast
    recorder = Recorder(head) if kind == "sampled" else None
    if kind == "in_batch":
        return {**run_step(head, rank), "shard_ids": head.shard_ids, **reloaded(head, options)}
    z, y = rank_batch(rank)
    z.requires_grad_(True)
    loss = head(z, y)
    loss.backward()
    sampler = getattr(head, "sampler", None)
    out = {
        "loss": loss.detach(),
        "z_grad": z.grad,
        "weight_grad": head.weight.grad.to_dense(),
        "bias_grad": None if head.bias is None else head.bias.grad,
        "shard_ids": head.shard_ids,
        "draws": None if recorder is None else recorder.draws,
        "cells": sampler.class_cells if isinstance(sampler, MIDXSampler) else None,
    }
    with torch.no_grad():
        out["log_prob"] = head.log_prob(z, y)
        out["full_loss"] = head.full_loss(z, y)
        out["topk"] = head.topk(z, 6, exclude=exclude_of(rank))
    return out


def run_step(head, rank: int) -> dict:
    """One training step's loss and gradients of rank ``rank``'s batch."""
    z, y = rank_batch(rank)
    z.requires_grad_(True)
    loss = head(z, y)
    loss.backward()
    return {
        "loss": loss.detach(),
        "z_grad": z.grad,
        "weight_grad": head.weight.grad.to_dense(),
        "bias_grad": None if head.bias is None else head.bias.grad,
    }


def reloaded(head, options: dict) -> dict:
    """``q_b``'s counts after a checkpoint of the whole table, as ``ShardedTables`` writes it,
    loads into a new split head: the in-batch estimate is every rank's, so it loads as saved."""
    state = {**head.state_dict(), **head.whole_table()}
    state["shard_layout"] = torch.tensor([N, 1, 0])
    fresh = make_head("in_batch", options, sharded=True)
    fresh.load_state_dict(state)
    return {"count": head.target_frequency.count, "reloaded_count": fresh.target_frequency.count}


def run_mixed_consistency(rank: int) -> torch.Tensor:
    """A mixed head's loss (drawn and in-batch negatives) with many draws, beside the exact
    loss it estimates (under ``"exact_positive"``: the other conventions' corrected positive
    shifts the loss's value)."""
    options = {
        "num_negatives": M,
        "target_counts": counts_with_a_zero(),
        "padding_idx": 4,
        "convention": "exact_positive",
    }
    head = make_head("in_batch", options, sharded=True)
    head.num_local_negatives = 20000
    z, y = rank_batch(rank)
    with torch.no_grad():
        return torch.stack([head(z, y), head.full_loss(z, y)])


def tied_loss(head, z, y, rank):
    """The head's loss plus a loss on inputs looked up from its table (a tied embedding)."""
    ids = torch.tensor([[rank, 4, 7], [22 - rank, 4, 4]])
    return head(z, y) + 0.1 * (head.embed(ids) ** 2).sum() * (rank + 1)


def run_tied(rank: int) -> dict:
    head = make_head("full", {"padding_idx": 4}, sharded=True)
    z, y = rank_batch(rank)
    z.requires_grad_(True)
    loss = tied_loss(head, z, y, rank)
    loss.backward()
    return {"loss": loss.detach(), "z_grad": z.grad, "weight_grad": head.weight.grad}


def run_consistency(rank: int) -> torch.Tensor:
    """A sampled head's loss with many draws, beside the exact loss it estimates (under
    ``"exact_positive"``: the other conventions' corrected positive shifts the loss's value)."""
    options = {"sampler": "log_uniform", "padding_idx": 4, "convention": "exact_positive"}
    head = make_head("sampled", options, sharded=True)
    head.num_local_negatives = 20000
    z, y = rank_batch(rank)
    with torch.no_grad():
        return torch.stack([head(z, y), head.full_loss(z, y)])


def run_on_a_mesh(rank: int) -> dict:
    """A head split over a one-dimensional ``DeviceMesh``: its rows and a loss."""
    from torch.distributed.device_mesh import init_device_mesh

    head = make_head("full", {"process_group": init_device_mesh("cpu", (WORLD,))}, sharded=True)
    z, y = rank_batch(rank)
    gathered = whole_rows_on_first_rank(head.weight, head.shard_map, head.process_group, 4)
    return {"shard_ids": head.shard_ids, "loss": head(z, y).detach(), "gathered": gathered}


def run_first_rank_gather(rank: int) -> dict:
    """The whole table and bias gathered to rank 0 in blocks of 4 rows (12 and 11 rows per
    rank: three blocks, the last one short on rank 1), and a checkpoint's whole table."""
    head = make_head("full", {"bias": True}, sharded=True)
    blocks = {
        "weight": whole_rows_on_first_rank(head.weight, head.shard_map, block_rows=4),
        "bias": whole_rows_on_first_rank(head.bias, head.shard_map, block_rows=5),
    }
    return {"blocks": blocks, "whole_table": head.whole_table(first_rank_only=True)}


def run_disagreement(rank: int) -> str:
    """The error of building a sharded head whose ``N`` differs on rank 1."""
    try:
        FullSoftmaxHead(N + rank, D, sharded=True)
    except ValueError as error:
        return str(error)
    return "no error"


def run_evaluation(rank: int) -> dict:
    head = make_head("full", {"padding_idx": 4}, sharded=True)
    batches = [rank_batch(rank, b) for b in range(2)]
    return evaluate_ranking(head, batches, lambda b: (b[0], b[1].clamp(min=0)), ks=(3,))


def worker(rank: int, init_file: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        torch.manual_seed(0)
        results = {}
        for name, options in FULL_CASES.items():
            results[("full", name)] = run_case("full", options, rank)
        for name, options in SAMPLED_CASES.items():
            results[("sampled", name)] = run_case("sampled", options, rank)
        for name, options in IN_BATCH_CASES.items():
            results[("in_batch", name)] = run_case("in_batch", options, rank)
        results["mixed_consistency"] = run_mixed_consistency(rank)
        results["evaluation"] = run_evaluation(rank)
        results["tied"] = run_tied(rank)
        results["consistency"] = run_consistency(rank)
        results["disagreement"] = run_disagreement(rank)
        results["mesh"] = run_on_a_mesh(rank)
        results["first_rank_gather"] = run_first_rank_gather(rank)
        torch.save(results, f"{out}{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sharded")
    out = str(tmp / "rank")
    mp.spawn(worker, args=(str(tmp / "init"), out), nprocs=WORLD, join=True)
    return [torch.load(f"{out}{r}.pt", weights_only=False) for r in range(WORLD)]


def reference_grads(head, loss_of_rank):
    """Per rank: (loss, z grad); and the table's (and bias') gradient of the mean of the ranks'
    losses, as DDP averages a replicated table."""
    per_rank, total = [], 0.0
    for rank in range(WORLD):
        z, y = rank_batch(rank)
        z.requires_grad_(True)
        loss = loss_of_rank(head, z, y, rank)
        (z_grad,) = torch.autograd.grad(loss, z, retain_graph=True)
        per_rank.append((loss.detach(), z_grad))
        total = total + loss / WORLD
    total.backward()
    return per_rank, head.weight.grad.to_dense(), None if head.bias is None else head.bias.grad


def check_against(results, kind, name, per_rank, weight_grad, bias_grad):
    for rank in range(WORLD):
        got = results[rank][(kind, name)]
        ids = got["shard_ids"]
        torch.testing.assert_close(got["loss"], per_rank[rank][0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got["z_grad"], per_rank[rank][1], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got["weight_grad"], weight_grad[ids], rtol=1e-5, atol=1e-6)
        if bias_grad is not None:
            torch.testing.assert_close(got["bias_grad"], bias_grad[ids], rtol=1e-5, atol=1e-6)


def test_the_shards_are_strided_and_cover_the_table(ranks):
    ids = [ranks[r][("full", "plain")]["shard_ids"] for r in range(WORLD)]
    assert ids[0].tolist() == list(range(0, N, 2)) and ids[1].tolist() == list(range(1, N, 2))


@pytest.mark.parametrize("name", sorted(FULL_CASES))
def test_full_softmax_equals_the_unsharded_head(ranks, name):
    head = make_head("full", FULL_CASES[name], sharded=False)
    per_rank, weight_grad, bias_grad = reference_grads(head, lambda h, z, y, r: h(z, y))
    check_against(ranks, "full", name, per_rank, weight_grad, bias_grad)
    for rank in range(WORLD):
        got = ranks[rank][("full", name)]
        z, y = rank_batch(rank)
        torch.testing.assert_close(got["log_prob"], head.log_prob(z, y), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got["full_loss"], head.full_loss(z, y), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind,name", [("full", n) for n in FULL_CASES] + [("sampled", "midx")])
def test_topk_merges_the_ranks_into_the_exact_top_k(ranks, kind, name):
    options = FULL_CASES[name] if kind == "full" else SAMPLED_CASES[name]
    head = make_head(kind, options, sharded=False)
    for rank in range(WORLD):
        z, _ = rank_batch(rank)
        values, ids = ranks[rank][(kind, name)]["topk"]
        want_values, want_ids = head.topk(z, 6, exclude=exclude_of(rank))
        torch.testing.assert_close(values, want_values, rtol=1e-5, atol=1e-6)
        assert torch.equal(ids, want_ids)


def test_evaluate_ranking_equals_the_unsharded_head_on_all_ranks_batches(ranks):
    head = make_head("full", {"padding_idx": 4}, sharded=False)
    batches = [rank_batch(rank, b) for rank in range(WORLD) for b in range(2)]
    want = evaluate_ranking(head, batches, lambda b: (b[0], b[1].clamp(min=0)), ks=(3,))
    for rank in range(WORLD):
        assert ranks[rank]["evaluation"].keys() == want.keys()
        for key, value in want.items():
            assert ranks[rank]["evaluation"][key] == pytest.approx(value, rel=1e-5), key


def stratified_reference(head, options, draws):
    """The loss of rank ``rank`` from the draws every rank made for the gathered queries."""

    def loss_of_rank(head, z, y, rank):
        every_z = torch.cat([z if r == rank else rank_batch(r)[0] for r in range(WORLD)])
        every_y = torch.cat([rank_batch(r)[1] for r in range(WORLD)])
        keep = every_y >= 0
        q = head.score_queries(every_z[keep])
        target = every_y[keep]
        logits = q @ head.weight.T + (0 if head.bias is None else head.bias)
        pos = logits.gather(1, target[:, None])[:, 0]
        columns = [pos[:, None]]
        convention = options["convention"]
        for r in range(WORLD):
            ids, log_q, m = draws[r]
            ids, log_q = ids.expand(len(target), -1), log_q.expand(len(target), -1)
            neg = logits.gather(1, ids) - (math.log(m) + log_q)
            if convention != "corrected_all":
                neg = neg.masked_fill(ids == target[:, None], -math.inf)
            columns.append(neg)
        if convention != "exact_positive":
            owner = target % WORLD
            sizes = torch.stack([torch.full_like(pos, math.log(draws[r][2])) for r in range(2)])
            log_q_pos = torch.stack(
                [restricted_log_q(head, options, r, target) for r in range(WORLD)]
            )
            columns[0] = columns[0] - (sizes + log_q_pos).gather(0, owner[None])[0][:, None]
        logits = torch.cat(columns, dim=1)
        losses = torch.logsumexp(logits, 1) - logits[:, 0]
        start = sum(ROWS[r] for r in range(rank))
        return losses[start : start + ROWS[rank]].mean()

    return loss_of_rank


def restricted_log_q(head, options, rank, target):
    """``log q_r(y)`` of the proposal restricted to rank ``rank``'s rows (``-inf`` off them)."""
    ids = torch.arange(rank, N, WORLD)
    full = make_sampler(options["sampler"], options.get("padding_idx"))
    log_q = full.log_prob(torch.zeros(1, D), ids)
    log_q = log_q - torch.logsumexp(log_q, 0)
    out = torch.full(target.shape, -math.inf)
    mine = target % WORLD == rank
    out[mine] = log_q[target[mine] // WORLD]
    return out


@pytest.mark.parametrize("name", sorted(SAMPLED_CASES))
def test_sampled_softmax_equals_the_stratified_estimator_on_the_same_draws(ranks, name):
    options = SAMPLED_CASES[name]
    draws = [ranks[r][("sampled", name)]["draws"][0] for r in range(WORLD)]
    head = make_head("sampled", {**options, "sparse": False}, sharded=False)
    per_rank, weight_grad, bias_grad = reference_grads(
        head, stratified_reference(head, options, draws)
    )
    check_against(ranks, "sampled", name, per_rank, weight_grad, bias_grad)


def test_a_tied_input_lookup_reads_and_trains_the_rows_where_they_live(ranks):
    head = make_head("full", {"padding_idx": 4}, sharded=False)
    per_rank, weight_grad, _ = reference_grads(head, tied_loss)
    for rank in range(WORLD):
        got = ranks[rank]["tied"]
        ids = ranks[rank][("full", "plain")]["shard_ids"]
        torch.testing.assert_close(got["loss"], per_rank[rank][0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got["z_grad"], per_rank[rank][1], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got["weight_grad"], weight_grad[ids], rtol=1e-5, atol=1e-6)
    assert weight_grad[4].abs().sum() == 0  # the padding class is looked up as zeros


def test_stratified_draws_are_consistent_with_many_negatives(ranks):
    for rank in range(WORLD):
        sampled, exact = ranks[rank]["consistency"]
        assert sampled == pytest.approx(float(exact), rel=0.01)


def test_ranks_that_disagree_on_the_table_raise_on_every_rank_instead_of_hanging(ranks):
    for rank in range(WORLD):
        message = ranks[rank]["disagreement"]
        assert "the ranks disagree on the sharded head: {'num_classes': [23, 24]}" in message


def test_a_device_mesh_splits_the_table_as_its_group_does(ranks):
    head = make_head("full", {}, sharded=False)
    for rank in range(WORLD):
        got = ranks[rank]["mesh"]
        assert got["shard_ids"].tolist() == list(range(rank, N, WORLD))
        z, y = rank_batch(rank)
        torch.testing.assert_close(got["loss"], head(z, y).detach(), rtol=1e-5, atol=1e-6)


def test_a_checkpoint_gathers_the_whole_table_to_the_first_rank_only_in_blocks(ranks):
    weight, bias = table()
    first, second = (ranks[r]["first_rank_gather"] for r in range(WORLD))
    assert torch.equal(first["blocks"]["weight"], weight)
    assert torch.equal(first["blocks"]["bias"], bias)
    assert first["whole_table"].keys() == {"weight", "bias"}
    assert torch.equal(first["whole_table"]["weight"], weight)
    assert second["blocks"] == {"weight": None, "bias": None} and second["whole_table"] == {}
    assert torch.equal(ranks[0]["mesh"]["gathered"], weight)  # a DeviceMesh's group
    assert ranks[1]["mesh"]["gathered"] is None


def test_index_refresh_builds_each_ranks_midx_index_from_its_own_rows(ranks):
    cells = [ranks[rank][("sampled", "midx")]["cells"] for rank in range(WORLD)]
    assert [c.numel() for c in cells] == [12, 11]
    assert all(bool((c >= 0).all()) for c in cells)  # every row of the rank has a cell


def every_rank_batch() -> tuple[list[torch.Tensor], torch.Tensor]:
    """Each rank's queries (requiring grad) and every rank's targets, concatenated."""
    zs = [rank_batch(r)[0].requires_grad_(True) for r in range(WORLD)]
    return zs, torch.cat([rank_batch(r)[1] for r in range(WORLD)])


@pytest.mark.parametrize("name", sorted(IN_BATCH_CASES))
def test_in_batch_negatives_over_a_split_table_are_every_ranks_batch(ranks, name):
    """The split head's in-batch softmax is the unsharded head's on the ranks' batches together
    (every rank's targets are the negatives); losses, query, table and bias gradients."""
    head = make_head("in_batch", {**IN_BATCH_CASES[name], "sparse": False}, sharded=False)
    zs, y = every_rank_batch()
    losses = head(torch.cat(zs), y, reduction="none")
    ends = [0, *torch.cumsum(torch.tensor([ROWS[r] + 1 for r in range(WORLD)]), 0).tolist()]
    per_rank = [losses[ends[r] : ends[r + 1]].sum() / ROWS[r] for r in range(WORLD)]
    z_grads = [torch.autograd.grad(per_rank[r], zs[r], retain_graph=True)[0] for r in range(WORLD)]
    (sum(per_rank) / WORLD).backward()
    for rank in range(WORLD):
        got = ranks[rank][("in_batch", name)]
        ids = got["shard_ids"]
        torch.testing.assert_close(got["loss"], per_rank[rank].detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got["z_grad"], z_grads[rank], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got["weight_grad"], head.weight.grad[ids], rtol=1e-5, atol=1e-6)
        if head.bias is not None:
            torch.testing.assert_close(got["bias_grad"], head.bias.grad[ids], rtol=1e-5, atol=1e-6)


def test_the_in_batch_estimate_is_every_ranks_and_loads_from_a_whole_checkpoint(ranks):
    name = "moving_average_corrected_all"
    head = make_head("in_batch", IN_BATCH_CASES[name], sharded=False)
    head.target_frequency.update(every_rank_batch()[1].clamp(min=0)[[*range(5), *range(6, 9)]])
    for rank in range(WORLD):
        got = ranks[rank][("in_batch", name)]
        assert torch.equal(got["count"], head.target_frequency.count)
        assert torch.equal(got["reloaded_count"], got["count"]) and got["count"].sum() > 0


def test_mixed_negatives_over_a_split_table_are_consistent_with_many_draws(ranks):
    for rank in range(WORLD):
        sampled, exact = ranks[rank]["mixed_consistency"]
        assert sampled == pytest.approx(float(exact), rel=0.01)
