"""CaneHead: Eqs. (2)-(3) by hand, gradients against a plain reference, the noise draw outside the
candidates, the path model's sums, refresh, beam top-k, resume and bad input."""

import copy
import math

import lightning.pytorch as pl
import pytest
import torch
from fake_samplers import Stream
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_sampled.callbacks import SamplerDiagnostics
from lightning_sampled.heads import CaneHead
from lightning_sampled.heads.cane import REJECTION_ROUNDS, descendant_means
from lightning_sampled.index.tree import (
    ClassTree,
    beam_search,
    fit_node_vectors,
    whole_level_start,
)
from lightning_sampled.samplers import UniformSampler, UnigramSampler

PARAMETERIZATIONS = ["flat", "path"]


def randomize(head, seed=0, scale=2.0):
    """Random class vectors and biases; for ``path`` also random edges (not a decomposition
    into descendant means, so that refresh has something to preserve)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        head.weight.normal_(0.0, scale / math.sqrt(head.dim))
        if head.parameterization == "path":
            head.edges.normal_(0.0, scale / math.sqrt(head.dim))
        if head.bias is not None:
            head.bias.normal_()
    return head


def exact_logits(head, z):
    """float64 ``z . v_k + b_k`` of every class from the head's class table (padding ``-inf``)."""
    table = head.class_table().detach().double()
    logits = z.double() @ table.T
    if head.bias is not None:
        logits = logits + head.bias.detach().double()
    if head.padding_idx is not None:
        logits[..., head.padding_idx] = -math.inf
    return logits


def brute_path_table(tree, edges, weight):
    """Each class's vector is its leaf edge plus the edges of its ancestors (differentiable)."""
    levels = torch.split(edges, tree.level_sizes()[1:-1])
    table = weight
    for level, nodes in enumerate(tree.ancestors(torch.arange(weight.shape[0]))):
        table = table + levels[level][nodes]
    return table


def restricted_q(probs, candidates, ids, allowed):
    """``q_x`` of the rejection draw: ``q (1 - a^R) / (1 - a) + a^R / allowed``, ``a = q(C)``."""
    a = probs[candidates].sum()
    return probs[ids] * (1 - a**REJECTION_ROUNDS) / (1 - a) + a**REJECTION_ROUNDS / allowed


def recording(head):
    """Makes ``head`` keep its last noise draw in ``head.recorded``."""
    draw = head.draw_noise

    def record(*args):
        head.recorded = draw(*args)
        return head.recorded

    head.draw_noise = record
    return head


# -- the loss -------------------------------------------------------------------------------------


def test_loss_equals_eqs_2_and_3_by_hand_both_branches():
    n, m = 12, 2
    torch.manual_seed(1)
    probs = torch.rand(n, dtype=torch.float64) + 0.2
    probs /= probs.sum()
    head = CaneHead(n, 3, 3, m, branching=3, beam=n, sampler=Stream(probs.float(), None), bias=True)
    randomize(head)
    z = torch.randn(2, 3)
    s = exact_logits(head, z)
    c0, c1 = torch.topk(s[0], 3).indices, torch.topk(s[1], 3).indices
    y = torch.stack([c0[1], torch.topk(s[1], 5).indices[4]])  # a candidate; not a candidate
    assert y[1] not in c1
    n0, n1, n2, n3 = [j for j in range(n) if j not in c0][:4]
    # draws laid out [rounds, slots]: slot 0 takes n0 at once, slot 1 rejects two candidates
    head.sampler.stream = torch.tensor([n0, c0[0], c0[1], n1] + [n2, n3] * 2)
    loss = head(z, y)

    allowed = n - 3
    q0 = restricted_q(probs, c0, torch.tensor([n0, n1]), allowed)
    eq2 = [
        -torch.log(s[0, y[0]].exp() / (s[0, c0].exp().sum() + s[0, j].exp() / q))
        for j, q in zip([n0, n1], q0, strict=True)
    ]
    q_y = restricted_q(probs, c1, y[1], allowed)
    eq3 = -torch.log(s[1, y[1]].exp() / (s[1, c1].exp().sum() + s[1, y[1]].exp() / q_y))
    want = (torch.stack(eq2).mean() + eq3) / 2
    torch.testing.assert_close(loss.double(), want, rtol=1e-5, atol=1e-6)
    assert float(head.last_coverage) == 0.5


def reference_losses(s, candidates, noise_ids, noise_log_q, target, target_log_q):
    """Plain PyTorch Eqs. (2)-(3), one position at a time: ``[T]``."""
    losses = []
    for t in range(s.shape[0]):
        cand = torch.logsumexp(s[t, candidates[t]], 0)
        if target[t] in candidates[t]:
            noise = s[t, noise_ids[t]] - noise_log_q[t]
            losses.append(torch.logaddexp(cand, noise).mean() - s[t, target[t]])
        else:
            noise = s[t, target[t]] - target_log_q[t]
            losses.append(torch.logaddexp(cand, noise) - s[t, target[t]])
    return torch.stack(losses)


@pytest.mark.parametrize("parameterization", PARAMETERIZATIONS)
def test_gradients_match_autograd_of_a_plain_reference(parameterization):
    """Also with a temperature (queries divided by it) and per-position weights."""
    n, d, temperature = 40, 5, 0.7
    head = randomize(
        CaneHead(
            n,
            d,
            4,
            6,
            branching=3,
            beam=n,
            parameterization=parameterization,
            bias=True,
            temperature=temperature,
        )
    )
    recording(head)
    z = torch.randn(3, 7, d, requires_grad=True)
    target = torch.randint(0, n, (3, 7))
    target[0, :3] = exact_logits(head, z.detach() / temperature)[0, :3].argmax(-1)  # covered
    target[1, 1] = -100
    sample_weight = torch.rand(3, 7) + 0.5
    head(z, target, sample_weight).backward()

    tree = head.tree
    leaves = head.weight.detach().double().requires_grad_(True)
    bias = head.bias.detach().double().requires_grad_(True)
    zr = z.detach().double().requires_grad_(True)
    if parameterization == "path":
        edges = head.edges.detach().double().requires_grad_(True)
        table = brute_path_table(tree, edges, leaves)
    else:
        table = leaves
    keep = target != -100
    s = zr[keep] / temperature @ table.T + bias
    y = target[keep]
    candidates = torch.topk(s.detach(), 4).indices
    draw = head.recorded
    losses = reference_losses(s, candidates, draw.ids, draw.log_q, y, draw.target_log_q)
    weights = sample_weight[keep].double()
    ((losses * weights).sum() / weights.sum()).backward()
    assert float(head.last_coverage) == pytest.approx(
        float((candidates == y[:, None]).any(1).double().mean())
    )
    assert 0 < float(head.last_coverage) < 1  # both branches contribute
    torch.testing.assert_close(z.grad.double(), zr.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(head.weight.grad.double(), leaves.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(head.bias.grad.double(), bias.grad, rtol=1e-4, atol=1e-6)
    if parameterization == "path":
        torch.testing.assert_close(head.edges.grad.double(), edges.grad, rtol=1e-4, atol=1e-6)


def test_all_positions_ignored_gives_an_attached_zero():
    head = CaneHead(20, 4, 2, 3, branching=3)
    z = torch.randn(2, 4, requires_grad=True)
    loss = head(z, torch.full((2,), -100))
    loss.backward()
    assert float(loss.detach()) == 0.0 and head.last_coverage is None


@pytest.mark.parametrize("parameterization", PARAMETERIZATIONS)
def test_bf16_autocast_loss_is_close_to_fp32(parameterization):
    n, d = 50, 8
    head = randomize(CaneHead(n, d, 4, 5, branching=3, parameterization=parameterization))
    z, y = torch.randn(12, d), torch.randint(0, n, (12,))
    torch.manual_seed(3)
    want = head(z, y)
    torch.manual_seed(3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = head(z, y)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


def test_sparse_grad_gives_the_dense_gradient_as_sparse_rows():
    n, d = 30, 4
    dense = randomize(CaneHead(n, d, 3, 4, branching=3))
    sparse = CaneHead(n, d, 3, 4, branching=3, sparse_grad=True)
    sparse.load_state_dict(dense.state_dict())
    z, y = torch.randn(6, d), torch.randint(0, n, (6,))
    for head in (dense, sparse):
        torch.manual_seed(5)
        head(z, y).backward()
    assert sparse.weight.grad.is_sparse
    torch.testing.assert_close(sparse.weight.grad.to_dense(), dense.weight.grad)


# -- the noise draw -------------------------------------------------------------------------------


def test_uniform_noise_is_uniform_over_the_complement_of_candidates_and_padding():
    n, draws = 30, 6000
    head = randomize(CaneHead(n, 4, 5, draws, branching=3, padding_idx=7))
    z = torch.randn(2, 4)
    candidates = head.candidates(z)
    torch.manual_seed(0)
    noise = head.draw_noise(z, candidates, torch.zeros(2, dtype=torch.long))
    allowed = n - 5 - 1
    torch.testing.assert_close(noise.log_q, torch.full((2, draws), -math.log(allowed)))
    for t in range(2):
        excluded = set(candidates[t].tolist()) | {7}
        assert not excluded & set(noise.ids[t].tolist())
        counts = torch.bincount(noise.ids[t], minlength=n).double()
        mask = torch.ones(n, dtype=torch.bool)
        mask[list(excluded)] = False
        expected = draws / allowed
        chi2 = float(((counts[mask] - expected) ** 2 / expected).sum())
        assert chi2 < 48.0  # chi-square, 23 degrees of freedom: p ~ 0.002


def test_rejection_draw_follows_its_restricted_proposal():
    """A unigram proposal with most mass on the candidates: the draws never hit a candidate or
    padding, and their frequencies match the returned q_x (the uniform fallback included)."""
    n, draws = 20, 20000
    counts = torch.ones(n)
    counts[:4] = 200.0
    counts[4:19] = torch.arange(1.0, 16.0)  # not uniform outside: the fallback term shows
    head = CaneHead(n, 4, 4, draws, branching=3, padding_idx=19)
    head.sampler = UnigramSampler(counts, alpha=1.0, padding_idx=19)
    candidates = torch.tensor([[0, 1, 2, 3]])
    torch.manual_seed(0)
    noise = head.draw_noise(torch.randn(1, 4), candidates, torch.tensor([5]))
    ids = noise.ids[0]
    assert not set(ids.tolist()) & {0, 1, 2, 3, 19}
    q = torch.zeros(n, dtype=torch.float64)
    q[ids] = noise.log_q[0].double().exp()
    probs = counts.double() / counts[:19].sum()
    probs[19] = 0
    allowed = n - 4 - 1
    want = restricted_q(probs, candidates[0], torch.arange(n), allowed)
    want[[0, 1, 2, 3, 19]] = 0
    torch.testing.assert_close(q, want, rtol=1e-5, atol=0)
    assert float(want.sum()) == pytest.approx(1.0)
    assert probs[:4].sum() ** REJECTION_ROUNDS > 0.5  # the fallback matters here
    observed = torch.bincount(ids, minlength=n).double()[4:19]
    expected = draws * want[4:19]
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert chi2 < 36.1  # 14 degrees of freedom: p ~ 0.001
    torch.testing.assert_close(noise.target_log_q[0].double().exp(), want[5], rtol=1e-5, atol=0)


def test_padding_is_never_a_candidate_even_with_one_candidate():
    """A leaf alone under the last node of its level, holding the padding class with a vector
    that wins every beam step: a beam of width 1 would end there."""
    n, d = 10, 3  # branching 3: the last node of level 2 has a single leaf
    head = CaneHead(n, d, 1, 2, branching=3, padding_idx=4)
    with torch.no_grad():
        head.weight.normal_(0.0, 0.1)
        head.weight[4] = torch.tensor([50.0, 0.0, 0.0])
        order = torch.tensor([0, 1, 2, 3, 5, 6, 7, 8, 9, 4])  # padding at leaf position 9
        head.tree_leaf_order.copy_(order)
        head.tree_leaf_position.copy_(torch.argsort(order))
        head.node_vectors.copy_(torch.cat(head_means(head)))
    z = torch.tensor([[1.0, 0.0, 0.0]]).repeat(4, 1)
    recording(head)
    head(z, torch.tensor([1, 2, 3, 5]))
    assert (head.candidates(z) != 4).all()
    assert (head.recorded.ids != 4).all()


def head_means(head):
    from lightning_sampled.heads.cane import descendant_means

    weights = torch.ones(head.num_classes)
    weights[head.padding_idx] = 0.0
    return descendant_means(head.tree, head.weight.detach(), weights)


# -- the tree models ------------------------------------------------------------------------------


def test_path_class_table_and_beam_scores_are_the_brute_force_path_sums():
    n, d = 50, 4
    head = randomize(CaneHead(n, d, 5, 3, branching=3, parameterization="path", bias=True))
    assert len(head.tree.branchings) >= 3  # edges on two internal levels at least
    brute = brute_path_table(head.tree, head.edges.detach(), head.weight.detach())
    torch.testing.assert_close(head.class_table().detach(), brute)
    z = torch.randn(8, d)
    logits = exact_logits(head, z)
    for beam in (5, 12, n):
        values, ids = head.beam_topk(z, 5, beam=beam)
        torch.testing.assert_close(values.double(), logits.gather(1, ids), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(values.double(), logits.topk(5).values, rtol=1e-5, atol=1e-5)


def test_refresh_keeps_path_logits_and_sets_flat_nodes_to_descendant_means():
    n, d = 60, 4
    path = randomize(CaneHead(n, d, 5, 3, branching=4, parameterization="path", bias=True))
    z = torch.randn(10, d)
    before = path.logits(z)
    old_order = path.tree_leaf_order.clone()
    path.refresh_index()
    assert not torch.equal(old_order, path.tree_leaf_order)  # a new tree
    torch.testing.assert_close(path.logits(z), before, rtol=0, atol=1e-5)

    flat = randomize(CaneHead(n, d, 5, 3, branching=4, padding_idx=0))
    flat.refresh_index()
    tree = flat.tree
    sizes = tree.level_sizes()[1:-1]
    got = torch.split(flat.node_vectors, sizes)
    ancestors = tree.ancestors(torch.arange(1, n))  # padding left out of the means
    for level, nodes in enumerate(ancestors):
        for node in range(sizes[level]):
            members = torch.arange(1, n)[nodes == node]
            want = flat.weight.detach()[members].mean(0)
            torch.testing.assert_close(got[level][node], want)


@pytest.mark.parametrize("parameterization", PARAMETERIZATIONS)
def test_beam_topk_with_beam_at_least_n_equals_topk(parameterization):
    n, d = 70, 6
    head = CaneHead(
        n, d, 3, 2, parameterization=parameterization, bias=True, padding_idx=3, temperature=2.0
    )
    randomize(head)
    z = torch.randn(4, 5, d)
    values, ids = head.beam_topk(z, 10, beam=n)
    want_values, want_ids = head.topk(z, 10)
    torch.testing.assert_close(values, want_values, rtol=1e-5, atol=1e-5)
    assert torch.equal(ids, want_ids)
    assert values.shape == (4, 5, 10)


@pytest.mark.parametrize("parameterization", PARAMETERIZATIONS)
def test_beam_topk_starts_where_asked_and_by_default_at_the_whole_level(parameterization):
    """``start`` reaches :func:`beam_search`'s ``start_level``: "auto" (the default) is
    :func:`whole_level_start`'s level, "root" is 0, an int is that level; every start keeps the
    found classes' exact logits and differs from the root's search on a beam that prunes."""
    n, d = 3000, 4
    head = randomize(CaneHead(n, d, 3, 2, branching=3, parameterization=parameterization))
    z = torch.randn(40, d)
    tree = head.tree
    means = head._level_vectors(tree)
    accumulate = parameterization == "path"
    auto = whole_level_start(tree, 6)
    assert auto == 6  # levels of 1, 2, 5, 13, 38, 112, 334, 1000, 3000 nodes
    logits = exact_logits(head, z)
    found = {}
    for start, level in (("auto", auto), (None, auto), ("root", 0), (1, 1), (4, 4)):
        kwargs = {} if start is None else {"start": start}
        values, ids = head.beam_topk(z, 5, beam=6, **kwargs)
        want = beam_search(tree, z, means, 6, 5, accumulate=accumulate, start_level=level)
        torch.testing.assert_close(values, want[0])
        assert torch.equal(ids, want[1])
        torch.testing.assert_close(values.double(), logits.gather(1, ids), rtol=1e-5, atol=1e-5)
        found[level] = ids
    assert not torch.equal(found[auto], found[0])


@pytest.mark.parametrize("parameterization", PARAMETERIZATIONS)
def test_fit_search_scores_the_nodes_by_fitted_vectors_until_the_next_refresh(parameterization):
    """After ``fit_search`` the beam runs over :func:`fit_node_vectors` of the class table
    (path sums under ``"path"``, padding left out of the means and maxima) with flat scores;
    the found classes keep their exact logits, a beam of N stays exact, a checkpoint keeps the
    fit and ``refresh_index`` drops it."""
    n, d = 400, 4
    head = CaneHead(
        n, d, 3, 2, branching=3, parameterization=parameterization, bias=True, padding_idx=5
    )
    randomize(head)
    z, sample = torch.randn(30, d), torch.randn(2, 50, d)
    before = head.beam_topk(z, 5, beam=6)
    head.fit_search(sample)
    tree = head.tree
    table = head.class_table().detach()
    weights = torch.ones(n)
    weights[5] = 0.0
    bias = head._leaf_bias()
    nodes = fit_node_vectors(
        tree, table, sample.reshape(-1, d), descendant_means(tree, table, weights), leaf_bias=bias
    )
    torch.testing.assert_close(head.search_vectors, torch.cat(nodes), rtol=1e-5, atol=1e-6)
    values, ids = head.beam_topk(z, 5, beam=6)
    start = whole_level_start(tree, 6)
    want = beam_search(tree, z, [*nodes, table], 6, 5, accumulate=False, leaf_bias=bias,
                       start_level=start)  # fmt: skip
    torch.testing.assert_close(values, want[0])
    assert torch.equal(ids, want[1]) and not torch.equal(ids, before[1])
    torch.testing.assert_close(
        values.double(), exact_logits(head, z).gather(1, ids), rtol=1e-5, atol=1e-5
    )
    exact = head.topk(z, 5)
    assert torch.equal(head.beam_topk(z, 5, beam=n)[1], exact[1])

    fresh = CaneHead(
        n, d, 3, 2, branching=3, parameterization=parameterization, bias=True, padding_idx=5
    )
    fresh.load_state_dict(head.state_dict())
    assert torch.equal(fresh.beam_topk(z, 5, beam=6)[1], ids)
    head.refresh_index()
    assert not bool(head.search_fitted)
    values, ids = head.beam_topk(z, 5, beam=6)
    want = beam_search(head.tree, z, head._level_vectors(head.tree), 6, 5,
                       accumulate=parameterization == "path", leaf_bias=bias,
                       start_level=whole_level_start(head.tree, 6))  # fmt: skip
    assert torch.equal(ids, want[1])


def test_a_checkpoint_from_before_fit_search_loads_unfitted():
    head = randomize(CaneHead(60, 4, 3, 2, branching=3))
    state = head.state_dict()
    del state["search_vectors"], state["search_fitted"]
    other = CaneHead(60, 4, 3, 2, branching=3)
    other.fit_search(torch.randn(20, 4))
    other.load_state_dict(state)
    assert not bool(other.search_fitted)
    z = torch.randn(8, 4)
    assert torch.equal(other.beam_topk(z, 3, beam=4)[1], head.beam_topk(z, 3, beam=4)[1])


def test_fit_search_refuses_queries_of_another_width():
    head = CaneHead(60, 4, 3, 2, branching=3)
    with pytest.raises(ValueError, match="4"):
        head.fit_search(torch.randn(5, 3))


@pytest.mark.parametrize("start", ["leaves", -1, 6, 2.0, True])  # 6: the leaves
def test_beam_topk_refuses_a_start_that_is_not_a_level(start):
    head = CaneHead(300, 4, 3, 2, branching=3)  # depth 6: levels 0..5 may start
    with pytest.raises(ValueError, match="'root', 'auto' or a level in \\[0, 5\\], got"):
        head.beam_topk(torch.randn(2, 4), 5, beam=6, start=start)


@pytest.mark.parametrize("parameterization", PARAMETERIZATIONS)
def test_state_dict_restores_the_tree_and_beam_topk(parameterization):
    n, d = 80, 5
    head = randomize(CaneHead(n, d, 4, 2, branching=3, parameterization=parameterization))
    head.refresh_index()
    fresh = CaneHead(n, d, 4, 2, branching=3, parameterization=parameterization, seed=9)
    z = torch.randn(16, d)
    assert not torch.equal(fresh.beam_topk(z, 4)[1], head.beam_topk(z, 4)[1])
    fresh.load_state_dict(head.state_dict())
    assert torch.equal(fresh.tree_leaf_order, head.tree_leaf_order)
    assert torch.equal(fresh.tree_leaf_position, head.tree_leaf_position)
    for a, b in zip(fresh.beam_topk(z, 4), head.beam_topk(z, 4), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("parameterization", PARAMETERIZATIONS)
def test_buffers_written_in_place_as_a_ddp_broadcast_does_are_searched(parameterization):
    """IndexRefresh's broadcast writes rank 0's buffers into the others' tensors without bumping
    their version counters: the head must search the written tree, not a cached one."""
    n, d = 80, 5
    rank0 = randomize(CaneHead(n, d, 4, 2, branching=3, parameterization=parameterization))
    rank0.refresh_index()
    other = CaneHead(n, d, 4, 2, branching=3, parameterization=parameterization, seed=9)
    other.load_state_dict(dict(rank0.named_parameters()), strict=False)  # DDP-synced parameters
    z = torch.randn(16, d)
    other.beam_topk(z, 4)  # builds its search tree
    for name, buffer in rank0.named_buffers():
        dict(other.named_buffers())[name].data.copy_(buffer)
    rebuilt = copy.deepcopy(rank0)
    rebuilt._search_tree_cache = None  # searches a tree built from the buffers now
    for a, b in zip(other.beam_topk(z, 4), rebuilt.beam_topk(z, 4), strict=True):
        assert torch.equal(a, b)
    if parameterization == "path":
        brute = brute_path_table(other.tree, other.edges.detach(), other.weight.detach())
        torch.testing.assert_close(other.class_table().detach(), brute)
    torch.testing.assert_close(other.logits(z), rank0.logits(z))


# -- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"branching": 1}, "branching must be >= 2, got 1"),
        ({"num_candidates": 20}, "num_candidates must be < 20.*got 20"),
        ({"num_candidates": 19, "padding_idx": 0}, "num_candidates must be < 19.*got 19"),
        ({"num_candidates": 0}, "num_candidates must be a positive integer, got 0"),
        ({"beam": 3}, "beam must be >= num_candidates=4, got 3"),
        ({"num_noise": 0}, "num_noise must be a positive integer, got 0"),
        ({"parameterization": "tree"}, "parameterization must be one of.*'tree'"),
        ({"normalize": True}, "normalize must be False for CaneHead, got True"),
        ({"label_smoothing": 0.1}, "label_smoothing is not supported by CaneHead"),
        ({"sampler": UniformSampler(21)}, "sampler.num_classes=21"),
        ({"sampler": UniformSampler(20, padding_idx=0)}, "sampler.padding_idx=0"),
        (
            {"parameterization": "path", "weight": torch.nn.Parameter(torch.zeros(20, 3))},
            "weight cannot be tied with parameterization='path'",
        ),
    ],
)
def test_bad_arguments_name_the_argument_and_value(kwargs, match):
    args = {"num_candidates": 4, "num_noise": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        CaneHead(20, 3, **args)


def test_beam_topk_rejects_a_beam_narrower_than_k():
    head = CaneHead(20, 3, 2, 2, branching=3)
    with pytest.raises(ValueError, match="beam must be >= k=5, got 4"):
        head.beam_topk(torch.randn(2, 3), 5, beam=4)


# -- coverage -------------------------------------------------------------------------------------


class CoverageModel(pl.LightningModule):
    """An embedding and a CANE head; records the head's coverage after every step."""

    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Embedding(16, 4)
        self.head = CaneHead(30, 4, 3, 2, branching=3)
        self.coverages = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = self.head(self.encoder(x), y)
        self.coverages.append(float(self.head.last_coverage))
        return loss

    def diagnostic_queries(self):
        return self.encoder.weight

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        x, y = torch.randint(0, 16, (40,), generator=g), torch.randint(0, 30, (40,), generator=g)
        return DataLoader(TensorDataset(x, y), batch_size=8)


def test_sampler_diagnostics_logs_the_coverage_and_the_noise_proposal_kl(tmp_path):
    model = CoverageModel()
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=1,
        callbacks=[SamplerDiagnostics(save_plots=False)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(model)
    logged = float(trainer.logged_metrics["sampler_diagnostics/head/coverage"])
    assert len(model.coverages) == 5 and 0 < logged < 1
    assert logged == pytest.approx(sum(model.coverages) / 5)
    # the noise proposal (uniform) against the head's softmax: KL = log N - H(p) > 0
    z = model.head.score_queries(model.encoder.weight.detach())
    log_p = torch.log_softmax(model.head.logits(z), -1)
    want = (log_p.exp() * (log_p + math.log(30))).sum(-1).mean()
    kl = float(trainer.logged_metrics["sampler_diagnostics/head/kl"])
    assert kl == pytest.approx(float(want), rel=1e-4)


def test_num_clusters_builds_the_head_tree_around_flat_clusters():
    """``CaneHead(num_clusters=C)`` builds (and refreshes) its tree with
    ``ClassTree.from_vectors(..., num_clusters=C)``; the default keeps Algorithm 4."""
    torch.manual_seed(0)
    centres = 4 * torch.randn(12, 8)
    table = (centres.repeat_interleave(25, 0) + 0.3 * torch.randn(300, 8))[torch.randperm(300)]
    weight = nn.Parameter(table.clone())
    head = CaneHead(300, 8, 5, 5, branching=4, weight=weight, num_clusters=12)
    clustered = ClassTree.from_vectors(table, 4, seed=0, num_clusters=12)
    plain = ClassTree.from_vectors(table, 4, seed=0)
    assert torch.equal(head.tree_leaf_order, clustered.leaf_order)
    assert not torch.equal(clustered.leaf_order, plain.leaf_order)
    default = CaneHead(300, 8, 5, 5, branching=4, weight=weight)
    assert torch.equal(default.tree_leaf_order, plain.leaf_order)
    with pytest.raises(ValueError, match="num_clusters"):
        CaneHead(300, 8, 5, 5, num_clusters=301)
