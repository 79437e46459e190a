"""The sampled-metrics protocol: its keys say "sampled", it is the exact metric when the
negatives are every other class, and each query's top-k is its brute-force ranking among the
target and the negatives drawn for it, never holding a seen item."""

import math

import pytest
import torch

from lightning_sampled.heads import FullSoftmaxHead
from lightning_sampled.metrics import (
    evaluate_ranking,
    evaluate_sampled_ranking,
    sampled_candidates_topk,
)
from lightning_sampled.samplers import UniformSampler

N, D = 40, 6


def setup(seed: int = 0, padding_idx=None):
    torch.manual_seed(seed)
    head = FullSoftmaxHead(N, D, bias=True, padding_idx=padding_idx)
    z = torch.randn(3, 10, D)
    target = torch.randint(1, N, (3, 10))
    target[0, 0] = head.ignore_index
    return head, [(z[i], target[i]) for i in range(3)]


@pytest.mark.parametrize("padding_idx", [None, 0])
def test_with_every_other_class_as_negatives_it_is_the_exact_metric(padding_idx):
    head, batches = setup(padding_idx=padding_idx)
    drawable = N - (padding_idx is not None)
    exact = evaluate_ranking(head, batches, lambda b: b, ks=(1, 5), metrics=("ndcg", "hit"))
    options = dict(ks=(1, 5), metrics=("ndcg", "hit"))
    every = evaluate_sampled_ranking(head, batches, lambda b: b, num_negatives=drawable, **options)
    for key, value in exact.items():
        assert math.isclose(every[f"sampled_{key}"], value, abs_tol=1e-6), key
    # fewer candidates can only move a target up: a sampled metric is never below the exact one
    fewer = evaluate_sampled_ranking(head, batches, lambda b: b, num_negatives=5, **options)
    for key, value in exact.items():
        assert fewer[f"sampled_{key}"] >= value - 1e-6
    assert fewer["sampled_hit@1"] > exact["hit@1"]


def test_the_top_k_is_the_brute_force_ranking_among_the_candidates():
    head, batches = setup(1)
    z, target = batches[1]
    sampler = UniformSampler(N, unique=False)
    logits = (z @ head.weight.T + head.bias).detach()
    # the ten best classes other than the target are seen: never candidates
    exclude = logits.scatter(1, target[:, None], -math.inf).topk(10, dim=1).indices
    exclude[:, -1] = -1  # padding
    top = sampled_candidates_topk(
        head, z, target, 4, sampler, 30, exclude, torch.Generator().manual_seed(5)
    )
    draws = sampler.sample(z, 30, generator=torch.Generator().manual_seed(5)).ids
    for q in range(10):
        seen = set(exclude[q].tolist())
        kept = {int(j) for j in draws[q] if j != target[q] and int(j) not in seen}
        pool = sorted(kept | {int(target[q])}, key=lambda c: -logits[q, c].item())
        assert top[q].tolist() == pool[:4]
    # two negatives and k = 5: the ranks past the candidates hold -1, never the target again
    few = sampled_candidates_topk(head, z, target, 5, sampler, 2, None, torch.Generator())
    assert ((few == -1).sum(dim=1) >= 2).all()
    assert ((few == target[:, None]).sum(dim=1) == 1).all()


def test_keys_are_labelled_sampled_and_bad_input_is_refused():
    head, batches = setup(2)
    out = evaluate_sampled_ranking(head, batches, lambda b: b, num_negatives=20)
    assert set(out) == {"sampled_ndcg@10", "sampled_hit@10", "sampled_mrr@10"}
    again = evaluate_sampled_ranking(head, batches, lambda b: b, num_negatives=20)
    assert out == again  # seeded: two models meet the same negatives
    with pytest.raises(ValueError, match="num_negatives"):
        evaluate_sampled_ranking(head, batches, lambda b: b, num_negatives=0)
    with pytest.raises(ValueError, match="one target per query"):
        evaluate_sampled_ranking(
            head, [(batches[0][0], torch.zeros(10, N, dtype=torch.bool))], lambda b: b
        )
