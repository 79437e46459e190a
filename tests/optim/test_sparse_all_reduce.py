"""``all_reduce_row_sparse`` in two gloo processes against gloo's own sparse all-reduce (what DDP
uses on gloo), for uneven, duplicated, empty and dense gradients."""

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lightning_sampled.optim.sparse_all_reduce import all_reduce_row_sparse

N, D = 50, 3


def rank_gradient(rank: int, case: str) -> torch.Tensor | None:
    """Rank ``rank``'s gradient of an ``[N, D]`` table in ``case``."""
    g = torch.Generator().manual_seed(10 + rank)
    if case == "empty" and rank == 1:
        return None
    if case == "dense":
        grad = torch.zeros(N, D)
        grad[torch.randint(N, (6 + rank,), generator=g)] = torch.randn(6 + rank, D, generator=g)
        return grad
    count = 4 + 5 * rank  # uneven, with duplicate ids
    ids = torch.randint(N, (count,), generator=g)
    ids[-1] = ids[0]
    return torch.sparse_coo_tensor(ids[None, :], torch.randn(count, D, generator=g), (N, D))


def worker(rank: int, init_file: str, case: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        table = torch.nn.Parameter(torch.zeros(N, D))
        table.grad = rank_gradient(rank, case)
        ours = all_reduce_row_sparse(table)
        # the reference: gloo's sparse all-reduce of every rank's gradient (as DDP does), / W
        reference = rank_gradient(rank, case)
        if reference is None:
            reference = torch.zeros(N, D).to_sparse(1)
        reference = reference if reference.is_sparse else reference.to_sparse(1)
        dist.all_reduce(reference)
        torch.save({"ours": ours, "reference": reference.to_dense() / 2}, f"{out}{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("case", ["uneven", "empty", "dense"])
def test_equals_gloos_sparse_all_reduce_divided_by_the_world(tmp_path, case):
    out = str(tmp_path / "rank")
    mp.spawn(worker, args=(str(tmp_path / "init"), case, out), nprocs=2, join=True)
    results = [torch.load(f"{out}{rank}.pt", weights_only=False) for rank in (0, 1)]
    for result in results:
        ours = result["ours"]
        assert ours.is_sparse and ours.is_coalesced() and ours.sparse_dim() == 1
        torch.testing.assert_close(ours.to_dense(), result["reference"], rtol=0, atol=1e-6)
    assert torch.equal(results[0]["ours"].to_dense(), results[1]["ours"].to_dense())
    assert results[0]["ours"]._nnz() > 0


def test_a_gradient_with_two_sparse_dimensions_is_refused_before_any_collective():
    table = torch.nn.Parameter(torch.zeros(N, D))
    table.grad = torch.zeros(N, D).to_sparse(2)
    with pytest.raises(ValueError, match="row-sparse gradients"):
        all_reduce_row_sparse(table)
