"""CaneHead's frequency tree (Section 5 of the CANE paper): subsets of equal total count in the
count order, kept through refreshes; queries routed to the subset of best-scoring mean; candidates
drawn uniformly without replacement from it (Floyd's algorithm, checked by chi-square on every
pair); the loss on those candidates; checkpoints, exact beams, bad input and the recipes'
injection of the counts."""

import math
from functools import partial

import pytest
import torch
from scipy import stats

from lightning_sampled.heads import CaneHead
from lightning_sampled.heads.cane import distinct_uniform
from lightning_sampled.index import frequency_subsets
from lightning_sampled.samplers import UniformSampler
from recipes.specs import build_head

PARAMETERIZATIONS = ["flat", "path"]


def counts_of(n, seed=0):
    """Distinct Zipf-like counts in a random class order (no ties, so the order is unique)."""
    generator = torch.Generator().manual_seed(seed)
    return (1000.0 / torch.arange(1, n + 1)).round()[torch.randperm(n, generator=generator)] + (
        torch.rand(n, generator=generator) / 10
    )


def frequency_head(n, d, candidates, noise, subsets, seed=0, **options):
    head = CaneHead(
        n,
        d,
        candidates,
        noise,
        tree="frequency",
        class_counts=counts_of(n, seed),
        num_subsets=subsets,
        **options,
    )
    torch.manual_seed(seed)
    with torch.no_grad():
        head.weight.normal_(0.0, 1.0)
    head.refresh_index()
    return head


def subset_members(head, subset):
    """The class ids of one subset of the frequency tree."""
    starts = head.subset_starts.tolist()
    return head.tree_leaf_order[starts[subset] : starts[subset + 1]]


def routed_subset(head, z):
    """Brute force: the subset whose mean class vector scores highest."""
    table = head.class_table().detach()
    subsets = range(head.subset_starts.numel() - 1)
    means = torch.stack([table[subset_members(head, s)].mean(0) for s in subsets])
    return (z @ means.T).argmax(dim=1)


def pair_counts_are_uniform(sets, num_pairs):
    """Chi-square p-value of the counts of the unordered pairs in ``sets`` ``[R, 2]``."""
    keys = sets.sort(dim=1).values
    _, counts = torch.unique(keys, dim=0, return_counts=True)
    assert counts.numel() == num_pairs  # every pair occurs, and no other
    return stats.chisquare(counts.numpy()).pvalue


# -- the tree -------------------------------------------------------------------------------------


@pytest.mark.parametrize("parameterization", PARAMETERIZATIONS)
def test_subsets_cut_the_count_order_and_are_kept_through_refresh(parameterization):
    n, d, subsets = 50, 4, 6
    head = frequency_head(n, d, 3, 2, subsets, parameterization=parameterization, padding_idx=7)
    counts = counts_of(n)
    counts[7] = counts.max() + 1  # the padding class's count is never used: it is put last
    order = torch.cat([counts.argsort(descending=True)[1:], torch.tensor([7])])
    assert torch.equal(head.tree.leaf_order, order)
    assert head.tree.branchings == (10, 10)  # beam_topk's tree: 10-ary over the count order
    want = frequency_subsets(counts_of(n), subsets, min_size=4, last=7)[1]  # 3 candidates + 1
    assert torch.equal(head.subset_starts, want) and int(want[-1]) == n - 1
    order = head.tree_leaf_order.clone()
    z = torch.randn(7, d)
    before = head.logits(z)
    with torch.no_grad():
        head.weight.add_(torch.randn(n, d))
    head.refresh_index()
    assert torch.equal(head.tree_leaf_order, order)
    for subset in range(subsets):  # the subsets' vectors are the new means of their classes
        want = head.class_table().detach()[subset_members(head, subset)].mean(0)
        torch.testing.assert_close(head.subset_vectors[subset], want)
    if (
        parameterization == "path"
    ):  # the path model is re-decomposed on the same tree: logits unchanged by a refresh
        after_change = head.logits(z)
        head.refresh_index()
        torch.testing.assert_close(head.logits(z), after_change, rtol=0, atol=1e-5)
        assert not torch.allclose(after_change, before)


# -- the candidates -------------------------------------------------------------------------------


@pytest.mark.parametrize("parameterization", PARAMETERIZATIONS)
def test_candidates_are_distinct_classes_of_the_best_scoring_subset(parameterization):
    n, d, subsets, k = 40, 3, 4, 6
    head = frequency_head(n, d, k, 2, subsets, padding_idx=5, parameterization=parameterization)
    z = torch.randn(300, d)
    candidates = head.candidates(z)
    want_subset = routed_subset(head, z)
    assert len(set(want_subset.tolist())) > 1  # the queries reach several subsets
    for row, subset in zip(candidates, want_subset, strict=True):
        members = set(subset_members(head, int(subset)).tolist())
        assert 5 not in members
        assert len(set(row.tolist())) == k
        assert set(row.tolist()) <= members
        assert 5 not in row.tolist()


def test_floyd_draws_every_pair_of_a_small_set_equally_often():
    sizes = torch.tensor([5, 3])
    generator = torch.Generator().manual_seed(0)
    draws = distinct_uniform(sizes.repeat(20_000), 2, generator).view(20_000, 2, 2)
    assert pair_counts_are_uniform(draws[:, 0], 10) > 1e-3
    assert pair_counts_are_uniform(draws[:, 1], 3) > 1e-3
    every = distinct_uniform(torch.full((50,), 4), 4, generator)  # k = size: a permutation
    assert torch.equal(every.sort(dim=1).values, torch.arange(4).expand(50, 4))


def test_a_subset_of_one_more_class_than_candidates_draws_them_uniformly():
    """The weakest regime: one frequent class takes half the mass, so the minimum size decides
    the first subset: 2 classes for 1 candidate, the padding class in neither subset."""
    counts = torch.tensor([9.0, 0.0, 7.0, 6.0, 5.0, 40.0, 4.0])
    head = CaneHead(7, 2, 1, 1, tree="frequency", class_counts=counts, num_subsets=2, padding_idx=1)
    small = subset_members(head, 0)
    assert small.tolist() == [5, 0]
    with torch.no_grad():  # route every query to the small subset
        head.subset_vectors.copy_(torch.tensor([[1.0, 0.0], [-1.0, 0.0]]))
    drawn = head.candidates(torch.tensor([[1.0, 0.0]]).expand(6000, 2)).squeeze(1)
    counts_drawn = torch.stack([(drawn == c).sum() for c in small])
    assert int(counts_drawn.sum()) == 6000  # never the padding class, never another subset
    assert stats.chisquare(counts_drawn.numpy()).pvalue > 1e-3


def test_the_loss_is_eqs_2_and_3_on_the_drawn_candidates():
    n, d, k, m = 30, 4, 5, 3
    head = frequency_head(n, d, k, m, 3, bias=True)
    drawn = {}
    candidates, draw_noise = head.candidates, head.draw_noise

    def record_candidates(z):
        drawn["candidates"] = candidates(z)
        return drawn["candidates"]

    def record_noise(*args):
        drawn["noise"] = draw_noise(*args)
        return drawn["noise"]

    head.candidates, head.draw_noise = record_candidates, record_noise
    z = torch.randn(40, d)
    target = torch.randint(0, n, (40,))
    loss = head(z, target, reduction="none")
    s = (z @ head.weight.detach().T + head.bias.detach()).double()
    c, noise = drawn["candidates"], drawn["noise"]
    covered = (c == target[:, None]).any(dim=1)
    assert 0 < int(covered.sum()) < 40  # both branches occur
    for t in range(40):
        cand = torch.logsumexp(s[t, c[t]], 0)
        if covered[t]:  # Eq. 2, averaged over the noises
            want = torch.logaddexp(cand, s[t, noise.ids[t]] - noise.log_q[t]).mean()
        else:  # Eq. 3: the target plays the noise, q_x(y) = 1 / (N - k)
            want = torch.logaddexp(cand, s[t, target[t]] + math.log(n - k))
        torch.testing.assert_close(loss[t].double(), want - s[t, target[t]], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(noise.log_q, torch.full((40, m), -math.log(n - k)))


# -- serving, checkpoints, input ------------------------------------------------------------------


def test_beam_topk_with_beam_at_least_n_is_exact_and_a_checkpoint_restores_the_tree():
    n, d = 45, 4
    head = frequency_head(n, d, 3, 2, 5, bias=True)
    z = torch.randn(6, d)
    values, ids = head.beam_topk(z, 7, beam=n)
    want_values, want_ids = head.topk(z, 7)
    torch.testing.assert_close(values, want_values, rtol=1e-5, atol=1e-5)
    assert torch.equal(ids, want_ids)
    fresh = frequency_head(n, d, 3, 2, 5, seed=1, bias=True)
    assert not torch.equal(fresh.tree_leaf_order, head.tree_leaf_order)
    fresh.load_state_dict(head.state_dict())
    assert torch.equal(fresh.tree_leaf_order, head.tree_leaf_order)
    for a, b in zip(fresh.beam_topk(z, 4), head.beam_topk(z, 4), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"tree": "frequency"}, "needs class_counts"),
        ({"tree": "frequency", "class_counts": torch.ones(10), "num_clusters": 3}, "num_clusters"),
        ({"tree": "frequency", "class_counts": torch.ones(9)}, r"N=10 class counts.*\(9,\)"),
        ({"tree": "frequency", "class_counts": -torch.ones(10), "num_subsets": 2}, "non-negative"),
        ({"tree": "frequency", "class_counts": torch.ones(10), "num_subsets": 0}, "num_subsets"),
        ({"tree": "frequency", "class_counts": torch.ones(10), "num_subsets": 4}, "more than"),
        ({"tree": "balanced"}, "tree must be one of"),
    ],
)
def test_bad_arguments_name_the_argument_and_value(kwargs, match):
    """10 classes cannot make 4 subsets of 3 (more than 2 candidates) each."""
    with pytest.raises(ValueError, match=match):
        CaneHead(10, 3, 2, 2, **kwargs)


def test_recipes_inject_the_data_counts_into_a_head_that_takes_them():
    counts = counts_of(12)
    factory = partial(CaneHead, num_candidates=2, num_noise=2, tree="frequency", num_subsets=3)
    head = build_head(factory, 12, 4, sampler=UniformSampler(12), class_counts=counts)
    assert torch.equal(head.tree_leaf_order, counts.argsort(descending=True))
    with pytest.raises(ValueError, match="needs class_counts"):
        build_head(factory, 12, 4, class_counts=None)
