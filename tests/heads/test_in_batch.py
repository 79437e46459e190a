"""In-batch candidates and the mixed (in-batch + sampled) correction."""

import math
from unittest import mock

import pytest
import torch
from fake_samplers import Stream, restart_draws

from lightning_sampled.heads import SampledSoftmaxHead
from lightning_sampled.ops.in_batch import (
    FIXED_SHAPE_POSITIONS,
    batch_candidates,
    distinct_candidates,
    drawn_per_group,
    groups_scored,
    in_batch_logits,
    log_mixture_size,
    sorted_candidates,
)
from lightning_sampled.samplers import UniformSampler
from lightning_sampled.samplers.frequency import TargetFrequency


@pytest.mark.parametrize("build", [distinct_candidates, sorted_candidates])
@pytest.mark.parametrize("remove_hits", [True, False])
def test_in_batch_logits_count_the_other_positions_holding_each_target(build, remove_hits):
    target = torch.tensor([4, 1, 4, 4, 9])
    candidates = build(target)
    ids, counted = candidates.ids, candidates.counts > 0
    assert ids[counted].tolist() == [1, 4, 9] and candidates.counts[counted].tolist() == [1, 3, 1]
    assert (ids[candidates.column] == target).all() and counted[candidates.column].all()
    logits = torch.randn(5, ids.numel())
    log_size = torch.randn(ids.numel())
    got = in_batch_logits(logits.clone(), log_size, candidates, remove_hits)
    others = torch.tensor(
        [
            [float(sum(1 for s in range(5) if s != t and target[s] == u)) for u in ids]
            for t in range(5)
        ]
    )
    expected = logits + others.log() - log_size
    expected[:, ~counted] = -math.inf  # the repeats of a target are no candidates of their own
    if remove_hits:  # the own column holds the accidental hits
        expected[(target[:, None] == ids) & counted] = -math.inf
    torch.testing.assert_close(got, expected)
    assert got[1, candidates.column[1]] == -math.inf  # only position 1 holds class 1


@pytest.mark.parametrize("build", [distinct_candidates, sorted_candidates])
def test_left_out_positions_are_neither_candidates_nor_columns(build):
    target = torch.tensor([4, 0, 4, 9, 0, 4])
    mask = torch.tensor([True, False, True, True, False, False])
    candidates = build(target, mask)
    counted = candidates.counts > 0
    assert candidates.ids[counted].tolist() == [4, 9]  # 0 only at left-out positions
    assert candidates.counts[counted].tolist() == [2, 1]
    assert candidates.column[~mask].tolist() == [-1, -1, -1]
    assert (candidates.ids[candidates.column[mask]] == target[mask]).all()
    assert ((candidates.ids >= 0) & (candidates.ids < 10)).all()  # class ids in every column
    # nothing left out: the same as no mask
    whole = build(target, torch.ones(6, dtype=torch.bool))
    plain = build(target)
    for got, want in zip(whole, plain, strict=True):
        assert got.tolist() == want.tolist()


def test_batch_candidates_sort_in_fixed_shapes_only_where_shapes_must_not_depend_on_data():
    small = torch.randint(0, 50, (FIXED_SHAPE_POSITIONS,))
    large = torch.randint(0, 50, (FIXED_SHAPE_POSITIONS + 1,))
    for target in (small, large):  # eager CPU: torch.unique, the cheaper there
        assert batch_candidates(target).ids.tolist() == sorted(set(target.tolist()))
    with mock.patch("torch.compiler.is_compiling", return_value=True):
        assert batch_candidates(small).ids.numel() == FIXED_SHAPE_POSITIONS  # one column each
        assert batch_candidates(large).ids.tolist() == sorted(set(large.tolist()))


def test_log_mixture_size_is_the_balance_heuristic_denominator():
    log_qs = torch.tensor([-1.0, -3.0])
    log_qb = torch.tensor([-2.0, -0.5])
    expected = (5 * log_qs.exp() + 7 * log_qb.exp()).log()
    torch.testing.assert_close(log_mixture_size(log_qs, 5, log_qb, 7), expected)
    torch.testing.assert_close(log_mixture_size(None, 0, log_qb, 7), log_qb + math.log(7))
    torch.testing.assert_close(log_mixture_size(log_qs, 5, log_qb, 0), log_qs + math.log(5))


def brute_force_losses(
    head,
    z,
    y,
    draws=None,
    log_q_sampled=None,
    log_q_batch=None,
    drawn=None,
    convention="exact_positive",
):
    """Per-position losses of the mixed estimator written out position by position.

    ``draws`` [T, M] (or None) with their ``log_q_sampled`` (a callable of ids); ``log_q_batch``
    a callable of ids; ``drawn`` ``[T, K]`` the positions each row drew, whose targets are its
    in-batch draws (``None``: every other position); ``"exact_positive"`` (positive
    uncorrected, hits masked) or ``"corrected_all"`` (all corrected, hits kept)."""
    t_count = y.numel()
    m = 0 if draws is None else draws.shape[1]
    w, b = head.weight, head.bias if head.bias is not None else torch.zeros(head.num_classes)
    losses = []
    for t in range(t_count):
        others = [s for s in range(t_count) if s != t] if drawn is None else drawn[t].tolist()

        def size(j, others=others):
            total = len(others) * log_q_batch(j).exp()
            return total + m * log_q_sampled(j).exp() if m else total

        logits = [z[t] @ w[y[t]] + b[y[t]]]
        if convention == "corrected_all":
            logits[0] = logits[0] - size(int(y[t])).log()
        candidates = ([] if draws is None else draws[t].tolist()) + [int(y[s]) for s in others]
        for j in candidates:
            if j == int(y[t]) and convention == "exact_positive":
                continue  # accidental hit
            logits.append(z[t] @ w[j] + b[j] - size(j).log())
        logits = torch.stack(logits)
        losses.append(torch.logsumexp(logits, 0) - logits[0])
    return torch.stack(losses)


def test_pure_in_batch_loss_equals_the_brute_force_estimator():
    torch.manual_seed(0)
    counts = torch.tensor([5.0, 1.0, 3.0, 0.5, 2.0, 1.0])
    head = SampledSoftmaxHead(
        6,
        3,
        num_negatives=0,
        in_batch_negatives=True,
        target_counts=counts,
        bias=True,
        convention="exact_positive",
    )
    torch.nn.init.normal_(head.bias)
    z = torch.randn(7, 3)
    y = torch.tensor([0, 2, 0, 4, 5, 0, 2])
    log_q_batch = lambda j: (counts[j] / counts.sum()).log()  # noqa: E731
    expected = brute_force_losses(head, z, y, log_q_batch=log_q_batch).mean()
    torch.testing.assert_close(head(z, y), expected)


def test_mixed_loss_equals_the_brute_force_balance_heuristic():
    torch.manual_seed(1)
    counts = torch.tensor([5.0, 1.0, 3.0, 0.5, 2.0, 1.0])
    probs = torch.softmax(torch.randn(6), 0)
    stream = torch.tensor([1, 3, 0, 5])
    head = SampledSoftmaxHead(
        6,
        3,
        Stream(probs, stream),
        4,
        in_batch_negatives=True,
        target_counts=counts,
        convention="exact_positive",
    )
    z = torch.randn(5, 3)
    y = torch.tensor([0, 2, 0, 4, 3])
    expected = brute_force_losses(
        head,
        z,
        y,
        draws=stream.expand(5, -1),
        log_q_sampled=lambda j: probs[j].log(),
        log_q_batch=lambda j: (counts[j] / counts.sum()).log(),
    ).mean()
    torch.testing.assert_close(head(z, y), expected)


def in_batch_bias_gradient_error(num_negatives, batch, batches=6, limit=None):
    """Relative error of the in-batch gradient of a bias-only model (4 classes, ``z = 1``, zero
    class vectors and biases) against the full softmax's, on batches of targets drawn from
    (.6, .25, .1, .05), with ``q_b`` given exactly; at most ``limit`` in-batch draws."""
    p = torch.tensor([0.6, 0.25, 0.1, 0.05])
    torch.manual_seed(batch)  # the seed of the negatives' draw stream
    head = SampledSoftmaxHead(
        4,
        1,
        UniformSampler(4),
        num_negatives,
        in_batch_negatives=True,
        target_counts=p,
        bias=True,
        weight=torch.nn.Parameter(torch.zeros(4, 1)),
        max_in_batch_draws=limit,
    )
    g = torch.Generator().manual_seed(batch)
    full, total = torch.zeros(4), torch.zeros(4)
    for _ in range(batches):
        y = torch.multinomial(p, batch, replacement=True, generator=g)
        z = torch.ones(batch, 1)
        full += torch.autograd.grad(head.full_loss(z, y), head.bias)[0]
        total += torch.autograd.grad(head(z, y), head.bias)[0]
    return float((total - full).norm() / full.norm())


@pytest.mark.parametrize("num_negatives", [0, 20])
def test_in_batch_and_mixed_negatives_are_consistent_for_likely_targets(num_negatives):
    errors = [in_batch_bias_gradient_error(num_negatives, t) for t in (8, 64, 1024)]
    assert errors[0] > errors[1] > errors[2], errors
    assert errors[-1] <= 0.05, errors


def test_in_batch_negatives_train_sparse_and_shared_like_dense():
    torch.manual_seed(3)
    weight = torch.nn.Parameter(torch.randn(30, 4))
    z = torch.randn(9, 4)
    y = torch.randint(30, (9,))
    grads = []
    for sparse in (False, True):
        torch.manual_seed(4)  # the same seed of the heads' draw streams
        head = SampledSoftmaxHead(
            30,
            4,
            num_negatives=5,
            shared_negatives=True,
            in_batch_negatives=True,
            sparse_grad=sparse,
            weight=weight,
        )
        weight.grad = None
        head(z, y).backward()
        grads.append(weight.grad.to_dense())
    torch.testing.assert_close(grads[0], grads[1])


def test_training_counts_targets_and_evaluation_before_training_uses_the_batch():
    head = SampledSoftmaxHead(10, 2, num_negatives=0, in_batch_negatives=True)
    z, y = torch.randn(4, 2), torch.tensor([1, 1, 2, 3])
    head.eval()
    assert torch.isfinite(head(z, y))  # a sanity check before any training step
    assert not head.target_frequency.ready
    head.train()
    head(z, y)
    assert head.target_frequency.ready
    torch.testing.assert_close(
        head.target_frequency.log_prob(torch.tensor([1, 2])), torch.tensor([0.5, 0.25]).log()
    )


def test_in_batch_bad_input_is_refused():
    head = SampledSoftmaxHead(10, 2, num_negatives=0, in_batch_negatives=True)
    with pytest.raises(ValueError, match="at least two scored positions"):
        head(torch.randn(1, 2), torch.tensor([3]))
    with pytest.raises(ValueError, match="num_negatives must be >= 0"):
        SampledSoftmaxHead(10, 2, num_negatives=-1, in_batch_negatives=True)
    with pytest.raises(ValueError, match="num_negatives must be a positive integer"):
        SampledSoftmaxHead(10, 2, num_negatives=0, in_batch_negatives=False)
    with pytest.raises(ValueError, match="only used with in_batch_negatives"):
        SampledSoftmaxHead(10, 2, target_counts=torch.ones(10), in_batch_negatives=False)
    with pytest.raises(ValueError, match="True, False or 'auto'"):
        SampledSoftmaxHead(10, 2, in_batch_negatives=1)


def test_a_batch_target_whose_fixed_count_is_zero_gets_a_finite_correct_loss():
    """Issue 32 item 1: ``q_b = 0`` for a class in the batch made the loss ``inf`` and the
    gradients NaN. It gets the share of one occurrence (the smallest positive count) per time
    it is in the batch, once the batch is counted: ``n_j / (S + T)`` here."""
    counts = torch.ones(50)
    counts[7] = 0
    head = SampledSoftmaxHead(
        50,
        8,
        num_negatives=0,
        in_batch_negatives=True,
        target_counts=counts,
        convention="exact_positive",
    )
    z = torch.randn(4, 8, requires_grad=True)
    y = torch.tensor([7, 1, 2, 3])
    loss = head(z, y)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(z.grad).all()
    q = (counts / counts.sum()).clone()
    q[7] = 1 / (counts.sum() + 4)
    expected = brute_force_losses(head, z.detach(), y, log_q_batch=lambda j: q[j].log()).mean()
    torch.testing.assert_close(loss.detach(), expected)


def test_an_unseen_or_decayed_class_in_evaluation_gets_the_share_of_its_batch():
    head = SampledSoftmaxHead(50, 8, num_negatives=0, in_batch_negatives=True)
    head(torch.randn(4, 8), torch.tensor([1, 2, 3, 1]))  # training: counts 1, 2, 3
    head.eval()
    frequency = head.target_frequency
    y = torch.tensor([7, 1, 2, 3])  # 7 never seen in training
    assert torch.isfinite(head(torch.randn(4, 8), y))
    a, total = frequency.decay, float(frequency.total)
    got = frequency.log_prob(torch.tensor([7, 1]), y).double()
    torch.testing.assert_close(got[0], torch.tensor(a / (total + 4 * a)).log().double())
    torch.testing.assert_close(got[1], frequency.log_prob(torch.tensor(1)).double())  # above it
    frequency.step += 10**6  # a million steps since 1, 2, 3 were seen: their estimate underflows
    assert frequency.log_prob(torch.tensor([1])).item() == -math.inf
    assert torch.isfinite(head(torch.randn(4, 8), y))


def test_the_floor_changes_nothing_in_training_nor_for_positive_fixed_counts():
    frequency = TargetFrequency(20, decay=0.1)
    ids = torch.arange(20)
    for seed in range(5):
        batch = torch.randint(20, (6,), generator=torch.Generator().manual_seed(seed))
        frequency.update(batch)  # training mode: the batch is counted before it is scored
        torch.testing.assert_close(frequency.log_prob(ids, batch), frequency.log_prob(ids))
    fixed = TargetFrequency(20, counts=torch.rand(20) + 1e-3)
    batch = torch.tensor([3, 3, 3, 3, 5])  # a rare class found often: still its given share
    torch.testing.assert_close(fixed.log_prob(ids, batch), fixed.log_prob(ids))


@pytest.mark.parametrize("build", ["distinct", "sorted"])
@pytest.mark.parametrize("convention", ["corrected_all", "exact_positive"])
@pytest.mark.parametrize("draws", ["none", "shared"])
@pytest.mark.parametrize("streaming", [True, False], ids=["streamed_q_b", "fixed_q_b"])
def test_left_out_positions_change_nothing_for_the_scored_ones(build, convention, draws, streaming):
    """The static shapes of ``objective`` (every position kept, an ignored one with the
    stand-in target 0 and ``mask`` False) give the scored positions the losses, gradients and
    ``q_b`` of the batch without the ignored positions (found by ``torch.unique``); 0 is also a
    scored target once."""
    n, d = 30, 6
    target = torch.tensor([3, 7, 0, 3, 12, 0, 0, 0])
    mask = torch.tensor([True, True, True, True, True, False, False, False])
    z = torch.randn(8, d)

    def run(queries, targets, rows, candidates="distinct"):
        torch.manual_seed(1)
        counts = None if streaming else torch.arange(1.0, n + 1)
        options = {"num_negatives": 0} if draws == "none" else {"num_negatives": 4}
        head = SampledSoftmaxHead(
            n, d, in_batch_negatives=True, shared_negatives=draws == "shared",
            target_counts=counts, convention=convention, in_batch_candidates=candidates,
            **options,
        )  # fmt: skip
        head.target_frequency.update(torch.tensor([3, 3, 5, 12]))  # an earlier step
        queries = queries.clone().requires_grad_()
        losses = head.sampled_losses(queries, targets, rows)
        kept = losses if rows is None else losses[rows]
        assert torch.isfinite(losses).all()
        kept.sum().backward()
        grad = queries.grad if rows is None else queries.grad[rows]
        q_b = head.target_frequency.log_prob(torch.arange(n))
        return kept.detach(), grad, head.weight.grad, q_b

    static = run(z, target, mask, build)
    compact = run(z[mask], target[mask], None)
    for got, want in zip(static, compact, strict=True):
        torch.testing.assert_close(got, want)


def test_target_frequency_counts_only_the_kept_targets():
    masked, compact = TargetFrequency(10, decay=0.5), TargetFrequency(10, decay=0.5)
    masked.update(torch.tensor([1, 2, 2, 0, 0]), torch.tensor([1, 1, 1, 0, 0], dtype=torch.bool))
    compact.update(torch.tensor([1, 2, 2]))
    for step in ([4, 2], [2, 2, 9]):
        masked.update(torch.tensor(step))
        compact.update(torch.tensor(step))
    ids = torch.arange(10)
    torch.testing.assert_close(masked.log_prob(ids), compact.log_prob(ids))
    batch, keep = torch.tensor([7, 7, 3]), torch.tensor([True, False, True])
    torch.testing.assert_close(  # the floor counts the kept targets only
        masked.log_prob(ids, batch, keep), compact.log_prob(ids, torch.tensor([7, 3]))
    )


def test_a_left_out_stand_in_never_seen_keeps_every_loss_finite():
    """Class 0, the stand-in of the left-out positions, has no share of ``q_b`` yet: its
    positive's correction would be ``-log(0)``; the left-out rows' losses stay finite, so that
    weighting them 0 gives 0 (not NaN)."""
    head = SampledSoftmaxHead(20, 4, num_negatives=0, in_batch_negatives=True)
    target = torch.tensor([3, 7, 3, 0, 0])
    mask = torch.tensor([True, True, True, False, False])
    z = torch.randn(5, 4, requires_grad=True)
    losses = head.sampled_losses(z, target, mask)
    assert torch.isfinite(losses).all()
    (losses * mask).sum().backward()
    assert torch.isfinite(z.grad).all() and not z.grad[~mask].any()


def test_the_candidate_method_is_checked_and_reported():
    with pytest.raises(ValueError, match="in_batch_candidates must be one of"):
        SampledSoftmaxHead(10, 4, in_batch_negatives=True, in_batch_candidates="unique")
    head = SampledSoftmaxHead(10, 4, in_batch_negatives=True, in_batch_candidates="sorted")
    assert "in_batch_candidates='sorted'" in repr(head)
    default = repr(SampledSoftmaxHead(10, 4))
    assert "in_batch_negatives='auto', in_batch_candidates='auto'" in default
    plain = SampledSoftmaxHead(10, 4, in_batch_negatives=False)
    assert "in_batch_negatives=False," in repr(plain)
    assert "in_batch_candidates" not in repr(plain)


def test_the_default_goes_without_the_batch_where_a_call_brings_its_own_negatives():
    """``in_batch_negatives="auto"``: ``negatives=`` and ``positives=`` calls are the plain
    head's (same draws, same loss) and count nothing into ``q_b``; ``True`` refuses them."""
    torch.manual_seed(0)
    default = SampledSoftmaxHead(12, 4, UniformSampler(12), 3)
    plain = SampledSoftmaxHead(12, 4, UniformSampler(12), 3, in_batch_negatives=False)
    plain.load_state_dict(default.state_dict(), strict=False)
    z, target = torch.randn(5, 4), torch.tensor([0, 1, 1, 7, 9])
    given = {
        "negatives": torch.tensor([2, 3, 11]),
        "negative_log_q": torch.full((3,), -math.log(12)),
        "target_log_q": torch.full((5,), -math.log(12)),
    }
    torch.testing.assert_close(default(z, target, **given), plain(z, target, **given))
    several = torch.tensor([[0, 4], [1, 5], [1, -100], [7, 8], [9, 10]])
    for head in (default, plain):
        restart_draws(head, 3)
    torch.testing.assert_close(
        default(z, several, positives="each"), plain(z, several, positives="each")
    )
    assert not default.target_frequency.ready  # neither call counted its targets
    explicit = SampledSoftmaxHead(12, 4, UniformSampler(12), 3, in_batch_negatives=True)
    with pytest.raises(ValueError, match="in_batch_negatives=True"):
        explicit(z, target, **given)
    with pytest.raises(ValueError, match="in_batch_negatives"):
        explicit(z, several, positives="each")


def test_a_checkpoint_without_q_b_loads_into_the_default_head_with_a_warning():
    torch.manual_seed(0)
    plain = SampledSoftmaxHead(12, 4, UniformSampler(12), 3, in_batch_negatives=False)
    default = SampledSoftmaxHead(12, 4, UniformSampler(12), 3)
    with pytest.warns(UserWarning, match="q_b is estimated afresh"):
        default.load_state_dict(plain.state_dict())
    torch.testing.assert_close(default.weight, plain.weight)
    assert not default.target_frequency.ready
    default(torch.randn(5, 4), torch.tensor([0, 1, 1, 7, 9]))  # trains on, counting q_b
    assert default.target_frequency.ready
    # inside a model, under its prefix; asked for explicitly, in-batch negatives need q_b
    model, saved = torch.nn.Sequential(default), torch.nn.Sequential(plain).state_dict()
    with pytest.warns(UserWarning, match="q_b is estimated afresh"):
        model.load_state_dict(saved)
    explicit = SampledSoftmaxHead(12, 4, UniformSampler(12), 3, in_batch_negatives=True)
    with pytest.raises(RuntimeError, match="target_frequency"):
        explicit.load_state_dict(plain.state_dict())


def test_a_split_default_head_refuses_given_negatives_naming_the_split_table():
    head = SampledSoftmaxHead(12, 4, UniformSampler(12), 3)
    with mock.patch.object(SampledSoftmaxHead, "is_split", True):
        with pytest.raises(ValueError, match="this head has a split table"):
            head(
                torch.randn(2, 4), torch.tensor([0, 1]), negatives=torch.tensor([2, 3]),
                negative_log_q=torch.zeros(2), target_log_q=torch.zeros(2),
            )  # fmt: skip


def recorded_draws(monkeypatch):
    """Records each row's drawn positions ``[T, K]`` for every :func:`drawn_per_group` of the
    head (its group's, one row per row)."""
    seen = []

    def recording(num_positions, limit, group_size, *args, **kwargs):
        positions = drawn_per_group(num_positions, limit, group_size, *args, **kwargs)
        seen.append(positions.repeat_interleave(group_size, 0)[:num_positions])
        return positions

    monkeypatch.setattr("lightning_sampled.heads.sampled.drawn_per_group", recording)
    return seen


@pytest.mark.parametrize("group_size", [1, 3])
@pytest.mark.parametrize("masked", [False, True])
def test_each_group_draws_uniformly_from_the_scored_positions_outside_it(masked, group_size):
    """Never a position of the group (with groups of 1, the row itself) nor a left-out one;
    each scored one outside with probability 1 / (their count) per draw (chi-square over 6,000
    draws per group, seeded); groups of 3 over 8 positions: the last holds 2."""
    mask = torch.tensor([True, False, True, True, True, False, True, True]) if masked else None
    scored = mask if masked else torch.ones(8, dtype=torch.bool)
    g = torch.Generator().manual_seed(0)
    positions = drawn_per_group(8, 6000, group_size, mask, g, torch.device("cpu"))
    assert positions.shape == (-(-8 // group_size), 6000)
    for j, drawn in enumerate(positions):
        counts = torch.bincount(drawn, minlength=8).double()
        allowed = scored.clone()
        allowed[j * group_size : (j + 1) * group_size] = False
        assert counts[~allowed].sum() == 0, (j, counts)
        expected = 6000 / int(allowed.sum())
        chi2 = float(((counts[allowed] - expected) ** 2 / expected).sum())
        assert chi2 < 20.5, (j, counts)  # p = 0.001 at 5 degrees of freedom or fewer


def test_the_rows_draw_independently_not_one_shared_set():
    """The defect of the first bounded form: one set of ``K`` positions for every row. Here the
    1,000 rows' single draws spread over the batch (about 632 distinct positions), and two rows
    agree about as often as chance says (1 / 999)."""
    g = torch.Generator().manual_seed(1)
    positions = drawn_per_group(1000, 1, 1, None, g, torch.device("cpu"))[:, 0]
    assert 580 < positions.unique().numel() < 690
    many = drawn_per_group(1000, 400, 1, None, g, torch.device("cpu"))
    agree = (many[0] == many[1]).float().mean()
    assert agree < 0.01, agree


def test_groups_scored_counts_the_groups_holding_a_scored_position():
    mask = torch.tensor([False, False, True, False, False, False, False, True])
    assert [int(groups_scored(mask, g)) for g in (1, 3, 4, 8)] == [2, 2, 2, 1]
    assert int(groups_scored(torch.zeros(5, dtype=torch.bool), 2)) == 0


@pytest.mark.parametrize(("scored", "group_size"), [([2], 1), ([2], 3), ([0, 2], 3), ([1, 2], 4)])
def test_scored_positions_in_one_group_draw_nothing_from_the_batch(scored, group_size):
    """With no scored position outside a row's group (a lone scored position; all of them in
    one group) there is none to draw: the loss is that of the sampled draws alone, corrected by
    ``log(M q_s)``, whatever the limit."""
    torch.manual_seed(0)
    z, y = torch.randn(6, 4), torch.tensor([3, 1, 4, 1, 5, 9])
    mask = torch.zeros(6, dtype=torch.bool)
    mask[scored] = True
    probs = torch.softmax(torch.randn(12), 0)
    weight = torch.nn.Parameter(torch.randn(12, 4))
    losses = []
    limited = {"max_in_batch_draws": 2, "in_batch_group_size": group_size}
    for options in (limited, {"in_batch_negatives": False}):
        stream = Stream(probs, torch.tensor([0, 4, 7]))  # the same draws for both heads
        head = SampledSoftmaxHead(12, 4, stream, 3, weight=weight, **options)
        given = mask if options.get("max_in_batch_draws") else None
        losses.append(head.sampled_losses(z, y, given)[mask])
    torch.testing.assert_close(losses[0], losses[1])
    assert torch.isfinite(losses[0]).all()


class PerQueryStream(Stream):
    """:class:`Stream`'s proposal, which the head must score per query (as MIDX's)."""

    query_independent = False


@pytest.mark.parametrize(
    ("group_size", "proposal"), [(1, Stream), (4, Stream), (4, PerQueryStream)]
)
@pytest.mark.parametrize("convention", ["exact_positive", "corrected_all"])
@pytest.mark.parametrize("num_negatives", [0, 4])
def test_a_limited_mixed_loss_equals_the_brute_force_on_each_rows_draws(
    monkeypatch, convention, num_negatives, group_size, proposal
):
    """Each row's loss is the brute-force estimator over its draws (its group's, with groups
    of 4 over 9 rows: the last group one row), whether the draws' ``log q`` is taken once per
    group (a proposal that ignores the query) or per row."""
    seen = recorded_draws(monkeypatch)
    torch.manual_seed(1)
    counts = torch.tensor([5.0, 1.0, 3.0, 0.5, 2.0, 1.0])
    probs = torch.softmax(torch.randn(6), 0)
    stream = torch.tensor([1, 3, 0, 5])
    head = SampledSoftmaxHead(
        6, 3, proposal(probs, stream), num_negatives, in_batch_negatives=True, bias=True,
        target_counts=counts, convention=convention, max_in_batch_draws=4,
        in_batch_group_size=group_size,
    )  # fmt: skip
    torch.nn.init.normal_(head.bias)
    z = torch.randn(9, 3)
    y = torch.tensor([0, 2, 0, 4, 3, 0, 2, 5, 0])
    got = head(z, y, reduction="none")
    (drawn,) = seen
    assert drawn.shape == (9, 4)
    expected = brute_force_losses(
        head,
        z,
        y,
        draws=stream.expand(9, -1) if num_negatives else None,
        log_q_sampled=lambda j: probs[j].log(),
        log_q_batch=lambda j: (counts[j] / counts.sum()).log(),
        drawn=drawn,
        convention=convention,
    )
    torch.testing.assert_close(got, expected)


def test_a_limit_at_or_above_the_scored_positions_changes_nothing(monkeypatch):
    seen = recorded_draws(monkeypatch)
    z, y = torch.randn(8, 4), torch.randint(12, (8,))
    losses = []
    # a group of 8 rows or more holds the whole batch: nothing outside it to draw
    for limit, group_size in ((None, 1), (8, 1), (100, 1), (2, 8)):
        torch.manual_seed(2)
        options = {"max_in_batch_draws": limit, "in_batch_group_size": group_size}
        head = SampledSoftmaxHead(12, 4, UniformSampler(12), 3, **options)
        losses.append(head(z, y))
    assert seen == []
    assert losses[0] == losses[1] == losses[2] == losses[3]


def test_a_limited_estimator_is_consistent_for_likely_targets():
    """On batches of 1,024 targets from (.6, .25, .1, .05), the gradient error falls as the
    limit grows, and with 1,000 sampled draws beside 8 in-batch ones it is small."""
    errors = [in_batch_bias_gradient_error(0, 1024, limit=k) for k in (4, 32, 512)]
    assert errors[0] > errors[1] > errors[2], errors
    assert errors[-1] <= 0.05, errors
    assert in_batch_bias_gradient_error(1000, 1024, limit=8) <= 0.01


def test_the_limit_is_checked_and_reported():
    with pytest.raises(ValueError, match="limits in-batch negatives"):
        SampledSoftmaxHead(10, 4, in_batch_negatives=False, max_in_batch_draws=8)
    with pytest.raises(ValueError, match="max_in_batch_draws"):
        SampledSoftmaxHead(10, 4, max_in_batch_draws=0)
    pure = SampledSoftmaxHead(10, 4, num_negatives=0, max_in_batch_draws=1)  # one draw suffices
    assert torch.isfinite(pure(torch.randn(5, 4), torch.randint(10, (5,))))
    assert "max_in_batch_draws=1," in repr(SampledSoftmaxHead(10, 4, max_in_batch_draws=1))
    with pytest.raises(ValueError, match="in_batch_group_size"):
        SampledSoftmaxHead(10, 4, max_in_batch_draws=8, in_batch_group_size=0)
    with pytest.raises(ValueError, match="groups the draws of max_in_batch_draws"):
        SampledSoftmaxHead(10, 4, in_batch_group_size=4)
    grouped = SampledSoftmaxHead(10, 4, max_in_batch_draws=2, in_batch_group_size=4)
    assert "in_batch_group_size=4," in repr(grouped)
    assert "max_in_batch_draws" not in repr(SampledSoftmaxHead(10, 4))


@pytest.mark.parametrize(("limit", "group_size"), [(3, 1), (7, 1), (3, 3)])
def test_a_limited_static_shape_batch_draws_only_its_scored_positions(
    monkeypatch, limit, group_size
):
    """Left-out positions (static shapes) are never drawn; the scored ones' losses are the
    brute force over each row's draws among the scored positions."""
    seen = recorded_draws(monkeypatch)
    torch.manual_seed(5)
    counts = torch.tensor([5.0, 1.0, 3.0, 0.5, 2.0, 1.0])
    head = SampledSoftmaxHead(
        6, 3, num_negatives=0, in_batch_negatives=True, target_counts=counts,
        convention="corrected_all", max_in_batch_draws=limit, in_batch_group_size=group_size,
    )  # fmt: skip
    z = torch.randn(8, 3)
    y = torch.tensor([0, 2, 0, 4, 3, 0, 2, 5])
    mask = torch.tensor([True, False, True, True, False, True, True, True])
    got = head.sampled_losses(z, y, mask)[mask]
    scored = mask.nonzero()[:, 0].tolist()
    (positions,) = seen
    assert mask[positions].all()
    drawn = torch.tensor([[scored.index(p) for p in positions[t].tolist()] for t in scored])
    expected = brute_force_losses(
        head,
        z[mask],
        y[mask],
        log_q_batch=lambda j: (counts[j] / counts.sum()).log(),
        drawn=drawn,
        convention="corrected_all",
    )
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("masked", [False, True])
def test_sorted_candidates_over_fewer_classes_than_positions_take_one_column_per_class(masked):
    """With ``N < T`` the sorted runs are moved to the first ``N`` (+ 1 for the left-out
    positions) columns: the counted columns are the distinct targets in order, with their
    counts, and every scored position's column is its target's; the other columns count 0."""
    g = torch.Generator().manual_seed(3)
    n, t = 12, 70
    target = torch.randint(n, (t,), generator=g)
    target[:5] = 11  # one class held by many, one (the largest) class held
    mask = torch.rand(t, generator=g) > 0.3 if masked else None
    got = sorted_candidates(target, mask, num_classes=n)
    want = distinct_candidates(target[mask] if masked else target)
    counted = got.counts > 0
    assert got.ids.numel() == got.counts.numel() == n + masked
    assert got.ids[counted].tolist() == want.ids.tolist()
    assert got.counts[counted].tolist() == want.counts.tolist()
    assert got.counts.sum() == (t if mask is None else int(mask.sum()))
    assert ((got.ids >= 0) & (got.ids < n)).all()  # a class id in every column
    scored = torch.ones(t, dtype=torch.bool) if mask is None else mask
    assert (got.column[~scored] == -1).all()
    assert torch.equal(got.ids[got.column[scored]], target[scored])
    assert counted[got.column[scored]].all()
    # as many classes as positions: the sort's own T columns
    assert sorted_candidates(target, mask, num_classes=t).ids.numel() == t


@pytest.mark.parametrize("convention", ["corrected_all", "exact_positive"])
def test_the_compacted_sort_gives_the_distinct_candidates_loss_and_gradients(convention):
    """The head over 9 classes and 40 positions (8 ignored, kept with their mask): the sorted
    candidates in 10 columns give the losses and gradients of ``torch.unique``'s."""
    n, d = 9, 5
    g = torch.Generator().manual_seed(4)
    z = torch.randn(4, 10, d, generator=g)
    target = torch.randint(n, (4, 10), generator=g)
    target[3, 2:] = -100

    def run(candidates):
        torch.manual_seed(0)
        head = SampledSoftmaxHead(
            n, d, num_negatives=3, convention=convention, in_batch_candidates=candidates
        )
        queries = z.clone().requires_grad_()
        with mock.patch("lightning_sampled.ops.inputs.sync_free", return_value=True):
            loss = head(queries, target)  # every position kept, the ignored ones masked
        loss.backward()
        return loss.detach(), queries.grad, head.weight.grad

    for got, want in zip(run("sorted"), run("distinct"), strict=True):
        torch.testing.assert_close(got, want)


def test_on_a_gpu_the_sort_has_no_limit_on_positions():
    """Where the shapes must not depend on the targets and the tensors are not on the CPU (a
    ``meta`` tensor stands for CUDA here), any number of positions is sorted: 25,600 positions
    over 3,706 classes in 3,706 columns, over 50,000 classes in 25,600; never ``torch.unique``."""
    target = torch.empty(25_600, dtype=torch.long, device="meta")
    module = "lightning_sampled.ops.in_batch"
    with (
        mock.patch(f"{module}.sync_free", return_value=True),
        mock.patch(f"{module}.distinct_candidates", side_effect=AssertionError),
    ):
        assert batch_candidates(target, num_classes=3_706).ids.shape == (3_706,)
        assert batch_candidates(target, num_classes=50_000).ids.shape == (25_600,)
