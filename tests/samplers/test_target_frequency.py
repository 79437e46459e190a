"""TargetFrequency: the in-batch proposal's estimate of each class's share of the targets."""

import math

import pytest
import torch

from lightning_sampled.samplers.frequency import TargetFrequency


def dense_ema(batches, num_classes, decay):
    """Brute force: both moving averages updated densely at every step."""
    count = torch.zeros(num_classes, dtype=torch.float64)
    total = 0.0
    for targets in batches:
        count = (1 - decay) * count + decay * torch.bincount(targets, minlength=num_classes)
        total = (1 - decay) * total + decay * targets.numel()
    return (count / total).log().float()


def test_lazy_averages_equal_the_dense_ones_step_by_step():
    batches = [
        torch.tensor([0, 0, 3]),
        torch.tensor([1]),
        torch.tensor([4, 4, 4, 0]),
        torch.tensor([1, 2]),
    ]
    freq = TargetFrequency(5, decay=0.3)
    for step in range(1, len(batches) + 1):
        freq.update(batches[step - 1])
        expected = dense_ema(batches[:step], 5, 0.3)
        torch.testing.assert_close(freq.log_prob(torch.arange(5)), expected)


def test_a_stationary_stream_recovers_the_target_distribution_even_for_a_likely_class():
    # class 0 fills 60% of every batch: an estimate from the gap between sightings (at most one
    # per step) would give it 1 / 256 per draw, not .6
    p = torch.tensor([0.6, 0.25, 0.1, 0.04, 0.01])
    g = torch.Generator().manual_seed(0)
    freq = TargetFrequency(5, decay=0.02)
    for _ in range(600):
        freq.update(torch.multinomial(p, 256, replacement=True, generator=g))
    estimate = freq.log_prob(torch.arange(5)).exp()
    torch.testing.assert_close(estimate, p, rtol=0.1, atol=0.003)
    assert math.isclose(float(estimate.sum()), 1.0, rel_tol=0.02)


@pytest.mark.parametrize("fixed", [False, True])
def test_more_lookups_than_classes_read_each_class_estimate_unchanged(fixed):
    # [T, M] draws of a recommender outnumber the classes: log_prob then computes each class once
    # and gathers; every entry must equal what one lookup of its class alone reads, floor included
    g = torch.Generator().manual_seed(1)
    num_classes = 7
    counts = torch.tensor([5.0, 0.0, 2.0, 0.0, 1.0, 9.0, 3.0]) if fixed else None
    freq = TargetFrequency(num_classes, decay=0.2, counts=counts)
    for _ in range(4):
        freq.update(torch.randint(0, 5, (6,), generator=g))  # classes 5, 6 unseen or stale
    ids = torch.randint(0, num_classes, (3, 5), generator=g)  # 15 lookups > 7 classes
    batch, batch_mask = torch.tensor([6, 1, 3, 6]), torch.tensor([True, True, False, True])
    for floor in ({}, {"batch": batch, "batch_mask": batch_mask}):
        many = freq.log_prob(ids, **floor)
        one_by_one = torch.stack([freq.log_prob(i.reshape(1), **floor)[0] for i in ids.reshape(-1)])
        assert many.shape == ids.shape
        torch.testing.assert_close(many.reshape(-1), one_by_one, rtol=0, atol=0)
    # the floor reaches the classes of the batch it keeps, and only those
    floored = freq.log_prob(torch.arange(num_classes).repeat(3), batch, batch_mask)[:num_classes]
    assert torch.isfinite(floored[[1, 6]]).all()
    assert floored[3] == freq.log_prob(torch.tensor([3]))[0]


def test_given_counts_fix_the_proposal():
    counts = torch.tensor([3.0, 0.0, 1.0])
    freq = TargetFrequency(3, counts=counts)
    expected = torch.tensor([0.75, 0.0, 0.25]).log()
    ids = torch.tensor([[0, 1], [2, 0]])
    torch.testing.assert_close(freq.log_prob(ids), expected[ids])
    freq.update(torch.tensor([1, 1, 1]))
    torch.testing.assert_close(freq.log_prob(torch.arange(3)), expected)


def test_a_class_never_seen_has_probability_zero_and_state_round_trips():
    freq = TargetFrequency(4, decay=0.5)
    freq.update(torch.tensor([2, 2, 1]))
    assert freq.log_prob(torch.tensor([0]))[0] == -math.inf
    copy = TargetFrequency(4, decay=0.5)
    copy.load_state_dict(freq.state_dict())
    freq.update(torch.tensor([3]))
    copy.update(torch.tensor([3]))
    torch.testing.assert_close(copy.log_prob(torch.arange(4)), freq.log_prob(torch.arange(4)))


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: TargetFrequency(3, decay=0.0), "decay must be a number in"),
        (lambda: TargetFrequency(3, decay=1.5), "decay must be a number in"),
        (lambda: TargetFrequency(3, counts=torch.zeros(3)), "must not be all zero"),
        (lambda: TargetFrequency(3, counts=torch.tensor([1.0, -1.0, 2.0])), "non-negative"),
        (lambda: TargetFrequency(3, counts=torch.ones(4)), "must have 3 entries"),
    ],
)
def test_bad_arguments_are_refused(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_bad_ids_and_reading_before_any_target_are_errors():
    freq = TargetFrequency(3)
    with pytest.raises(RuntimeError, match="seen no targets yet"):
        freq.log_prob(torch.tensor([0]))
    with pytest.raises(IndexError, match="targets"):
        freq.update(torch.tensor([3]))
    freq.update(torch.tensor([0]))
    with pytest.raises(IndexError, match="ids"):
        freq.log_prob(torch.tensor([-1]))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_updates_equal_the_dense_averages(backend, one_torch_thread):
    """Each step's update and read in one compiled graph: every step counts (an in-place update
    of a 0-dim fp64 buffer was lost under compile, and the estimate stayed empty)."""
    batches = [torch.tensor([0, 0, 3]), torch.tensor([1, 4, 4]), torch.tensor([4, 2, 0])]
    freq = TargetFrequency(5, decay=0.3)

    def step(targets):
        freq.update(targets)
        return freq.log_prob(torch.arange(5))

    compiled = torch.compile(step, backend=backend, fullgraph=True)
    for i in range(len(batches)):
        torch.testing.assert_close(compiled(batches[i]), dense_ema(batches[: i + 1], 5, 0.3))


def test_a_total_saved_0_dim_loads():
    freq = TargetFrequency(5, decay=0.3)
    freq.update(torch.tensor([0, 0, 3]))
    state = freq.state_dict()
    state["total"] = state["total"].reshape(())  # as saved before it had shape [1]
    loaded = TargetFrequency(5, decay=0.3)
    loaded.load_state_dict(state)
    torch.testing.assert_close(loaded.log_prob(torch.arange(5)), freq.log_prob(torch.arange(5)))


def test_a_cast_of_the_model_keeps_the_fp64_counts():
    freq = TargetFrequency(5, decay=0.01)
    freq.update(torch.tensor([1, 1, 2]))
    want = freq.log_prob(torch.arange(5))
    freq.bfloat16()
    assert freq.count.dtype == freq.total.dtype == torch.float64
    torch.testing.assert_close(freq.log_prob(torch.arange(5)), want)
