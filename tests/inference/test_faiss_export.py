"""The faiss export of a head's class table: its top-k is the head's exact top-k (bias,
temperature, padding, CANE's leaf order and path sums included), and bad input is refused."""

import faiss
import pytest
import torch

from lightning_sampled.heads import CaneHead, FullSoftmaxHead
from lightning_sampled.inference import class_table_index, export_head, faiss_topk


def randomized(head, seed=0):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in head.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator))
    return head


@pytest.mark.parametrize(
    "head",
    [
        FullSoftmaxHead(300, 8, bias=True, padding_idx=0, temperature=0.5),
        FullSoftmaxHead(300, 8, normalize=True, temperature=0.1),
        CaneHead(300, 8, 5, 3, branching=4, bias=True, padding_idx=7),
        CaneHead(300, 8, 5, 3, branching=4, parameterization="path", bias=True),
    ],
    ids=["full-bias-padding", "full-normalize", "cane-flat", "cane-path"],
)
def test_flat_export_top_k_equals_the_heads_exact_top_k(head):
    randomized(head)
    if isinstance(head, CaneHead):
        head.refresh_index()  # a tree built from the random table: its leaf order is not 0..N-1
        assert not torch.equal(head.tree_leaf_order, torch.arange(300))
    z = torch.randn(3, 7, 8, generator=torch.Generator().manual_seed(1))
    values, ids = faiss_topk(export_head(head), head.score_queries(z), 10)
    want_values, want_ids = head.topk(z, 10)
    assert ids.shape == (3, 7, 10)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(values, want_values, rtol=1e-5, atol=1e-5)


def test_rows_are_stored_in_the_trees_leaf_order_and_padding_is_left_out():
    head = randomized(CaneHead(50, 4, 3, 2, branching=3, padding_idx=2))
    head.refresh_index()
    index = export_head(head)
    stored = faiss.vector_to_array(index.id_map)
    order = head.tree_leaf_order
    assert stored.tolist() == order[order != 2].tolist()
    assert index.ntotal == 49


def test_an_approximate_index_serves_the_heads_ranking():
    generator = torch.Generator().manual_seed(2)
    table, bias = torch.randn(2000, 16, generator=generator), torch.randn(2000, generator=generator)
    quantizer = faiss.IndexFlatIP(17)
    ivf = faiss.IndexIVFFlat(quantizer, 17, 8, faiss.METRIC_INNER_PRODUCT)
    index = class_table_index(table, bias=bias, index=ivf)
    queries = torch.randn(20, 16, generator=generator)
    exact = torch.topk(queries @ table.T + bias, 5)
    ivf.nprobe = 8  # every list: exact
    values, ids = faiss_topk(index, queries, 5)
    assert torch.equal(ids, exact.indices)
    torch.testing.assert_close(values, exact.values, rtol=1e-5, atol=1e-4)
    ivf.nprobe = 1
    assert not torch.equal(faiss_topk(index, queries, 5)[1], exact.indices)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"table": torch.zeros(5)}, "table must be \\[N, D\\] with N >= 1"),
        ({"bias": torch.zeros(4)}, "bias must be \\[5\\], got \\(4,\\)"),
        ({"order": torch.tensor([0, 1, 2, 3, 3])}, "order must be a permutation of 0..4"),
        ({"exclude": 5}, "exclude must be in \\[0, 5\\), got 5"),
        ({"index": faiss.IndexFlatIP(3)}, "dimension D \\+ 1 = 4, got d=3"),
        ({"index": faiss.IndexFlatL2(4)}, "empty inner-product index"),
    ],
)
def test_bad_input_is_refused(kwargs, match):
    args = {"table": torch.zeros(5, 3), **kwargs}
    with pytest.raises(ValueError, match=match):
        class_table_index(args.pop("table"), **args)


def test_a_used_index_is_refused():
    used = faiss.IndexFlatIP(4)
    used.add(torch.zeros(1, 4).numpy())
    with pytest.raises(ValueError, match="ntotal=1"):
        class_table_index(torch.zeros(5, 3), index=used)
