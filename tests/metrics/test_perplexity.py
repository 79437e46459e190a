"""``Perplexity`` against ``torchmetrics.text.Perplexity``, from logits, log-probs and NLL sums."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor
from torchmetrics.text import Perplexity as ReferencePerplexity
from torchmetrics.utilities.data import dim_zero_sum

from lightning_sampled.heads import FullSoftmaxHead
from lightning_sampled.metrics import Perplexity

V = 29


def make_data(seed: int, shape: tuple[int, ...] = (3, 7)) -> tuple[Tensor, Tensor]:
    """Logits ``[*shape, V]`` and targets ``[*shape]`` with about a fifth ignored (-100)."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(*shape, V, generator=gen) * 3
    target = torch.randint(0, V, shape, generator=gen)
    target[torch.rand(shape, generator=gen) < 0.2] = -100
    return logits, target


def reference(logits: Tensor, target: Tensor, ignore_index: int | None = -100) -> float:
    metric = ReferencePerplexity(ignore_index=ignore_index)
    metric.update(logits, target)
    return float(metric.compute())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_logits_equal_torchmetrics(seed: int) -> None:
    logits, target = make_data(seed)
    metric = Perplexity(ignore_index=-100)
    metric.update(logits, target)
    assert float(metric.compute()) == pytest.approx(reference(logits, target), rel=1e-5)


def test_no_ignore_index_equals_torchmetrics() -> None:
    logits, target = make_data(3)
    target = target.clamp(min=0)
    metric = Perplexity()
    metric.update(logits, target)
    assert float(metric.compute()) == pytest.approx(reference(logits, target, None), rel=1e-5)


def test_ignore_index_that_is_a_class_id_equals_torchmetrics() -> None:
    logits, target = make_data(4)
    target = target.clamp(min=0)
    metric = Perplexity(ignore_index=0)
    metric.update(logits, target)
    assert float(metric.compute()) == pytest.approx(reference(logits, target, 0), rel=1e-5)


def test_two_dim_logits_and_hand_value() -> None:
    # uniform logits over V classes: perplexity V
    metric = Perplexity()
    metric.update(torch.zeros(5, V), torch.arange(5))
    assert float(metric.compute()) == pytest.approx(V, rel=1e-6)


@pytest.mark.parametrize("seed", [0, 1])
def test_head_log_prob_equals_torchmetrics_on_logits(seed: int) -> None:
    torch.manual_seed(seed)
    head = FullSoftmaxHead(V, 6, chunk_size=8)
    z = torch.randn(3, 7, 6)
    _, target = make_data(seed)
    expected = reference(head.logits(z), target)
    metric = Perplexity()
    metric.update_from_log_prob(head.log_prob(z, target), target != head.ignore_index)
    assert float(metric.compute()) == pytest.approx(expected, rel=1e-5)
    by_target = Perplexity()
    by_target.update(log_prob=head.log_prob(z, target), target=target)
    by_target.update_from_log_prob(head.log_prob(z, target), target=target)
    assert float(by_target.compute()) == pytest.approx(expected, rel=1e-5)


def test_the_ignored_positions_cannot_be_counted_silently() -> None:
    """A head's ``log_prob`` is 0 at ignored positions: counted, they lowered the perplexity
    (34,799 instead of 53,999 in the report that found it). Without ``target`` or ``mask`` the
    update is refused; ``update(lp, y)`` positionally says what to call instead; the default
    ``ignore_index`` is the heads' -100."""
    torch.manual_seed(0)
    head = FullSoftmaxHead(V, 6)
    z = torch.randn(3, 7, 6)
    _, target = make_data(0)
    log_prob = head.log_prob(z, target)
    with pytest.raises(ValueError, match="needs exactly one of target= .* or mask="):
        Perplexity().update(log_prob=log_prob)
    with pytest.raises(ValueError, match="needs exactly one of target="):
        Perplexity().update_from_log_prob(log_prob)
    with pytest.raises(ValueError, match="needs exactly one of target="):
        Perplexity().update(log_prob=log_prob, target=target, mask=target >= 0)
    with pytest.raises(ValueError, match=r"update\(log_prob=..., target=...\)"):
        Perplexity().update(log_prob, target)
    assert Perplexity().ignore_index == head.ignore_index == -100
    logits = head.logits(z)
    default = Perplexity()
    default.update(logits, target)  # -100 targets skipped, as the heads skip them
    assert float(default.compute()) == pytest.approx(reference(logits, target), rel=1e-5)


def test_nll_sum_equals_torchmetrics() -> None:
    torch.manual_seed(5)
    head = FullSoftmaxHead(V, 6, chunk_size=8)
    z = torch.randn(3, 7, 6)
    _, target = make_data(5)
    count = int((target != -100).sum())
    metric = Perplexity()
    metric.update_from_nll(head.full_loss(z, target) * count, count)
    assert float(metric.compute()) == pytest.approx(reference(head.logits(z), target), rel=1e-5)


def test_forms_mix_across_updates_and_accumulate() -> None:
    logits, target = make_data(6, (4, 9))
    expected = reference(logits, target)
    log_prob = torch.log_softmax(logits, -1).gather(-1, target.clamp(min=0)[..., None])[..., 0]
    mask = target != -100
    metric = Perplexity(ignore_index=-100)
    metric.update(logits[0], target[0])
    metric.update(log_prob=log_prob[1], mask=mask[1])
    nll = -(log_prob[2][mask[2]]).sum()
    metric.update(nll_sum=nll, num_tokens=int(mask[2].sum()))
    metric.update_from_nll(float(-(log_prob[3][mask[3]]).sum()), mask[3].sum())
    assert float(metric.compute()) == pytest.approx(expected, rel=1e-5)

    metric.reset()
    with pytest.warns(UserWarning, match="before the ``update``"):
        assert math.isnan(float(metric.compute()))
    metric.update(logits[1], target[1])
    assert float(metric.compute()) == pytest.approx(reference(logits[1:2], target[1:2]), rel=1e-5)


def test_forward_returns_the_batch_value() -> None:
    logits, target = make_data(7, (4, 9))
    metric = Perplexity(ignore_index=-100)
    first = float(metric(logits[:2], target[:2]))
    assert first == pytest.approx(reference(logits[:2], target[:2]), rel=1e-5)
    metric(logits[2:], target[2:])
    assert float(metric.compute()) == pytest.approx(reference(logits, target), rel=1e-5)


def test_merge_state_and_sum_reductions() -> None:
    logits, target = make_data(8, (6, 5))
    first, second = Perplexity(ignore_index=-100), Perplexity(ignore_index=-100)
    first.update(logits[:4], target[:4])
    second.update(logits[4:], target[4:])
    first.merge_state(second)
    assert float(first.compute()) == pytest.approx(reference(logits, target), rel=1e-5)
    assert set(first._reductions) == {"nll_sum", "num_tokens"}
    assert all(fn is dim_zero_sum for fn in first._reductions.values())
    assert Perplexity.higher_is_better is False and Perplexity.full_state_update is False


# -- bad input ------------------------------------------------------------------------------------


def test_bad_constructor() -> None:
    with pytest.raises(ValueError, match="ignore_index must be an int or None, got 1.5"):
        Perplexity(ignore_index=1.5)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"preds": torch.randn(2, 5), "target": torch.tensor([0, 5])}, IndexError, "got 5"),
        ({"preds": torch.randn(2, 5), "target": torch.tensor([0, -1])}, IndexError, "got -1"),
        ({"preds": torch.randn(2, 5), "target": torch.tensor([0])}, ValueError, r"\(2,\)"),
        ({"preds": torch.randn(2, 5), "target": torch.rand(2)}, ValueError, "target .*float32"),
        ({"preds": torch.ones(2, 5).long(), "target": torch.zeros(2).long()}, ValueError, "float"),
        (
            {"preds": torch.tensor([[0.0, math.nan]]), "target": torch.tensor([1])},
            ValueError,
            "NaN",
        ),
        ({"preds": torch.randn(2, 5)}, ValueError, "both preds and target"),
        (
            {"log_prob": torch.tensor([-1.0, 0.5]), "mask": torch.ones(2).bool()},
            ValueError,
            "log_prob .*<= 0.*got 0.5",
        ),
        (
            {"log_prob": torch.tensor([-1.0, math.nan]), "target": torch.tensor([1, 2])},
            ValueError,
            "log_prob contains NaN",
        ),
        (
            {"log_prob": torch.tensor([-1, -2]), "target": torch.tensor([1, 2])},
            ValueError,
            "log_prob must be a float",
        ),
        ({"log_prob": torch.zeros(3), "target": torch.zeros(2).long()}, ValueError, "shape of"),
        ({"log_prob": torch.zeros(3), "target": torch.zeros(3)}, ValueError, "integer tensor"),
        ({"log_prob": torch.zeros(3), "mask": torch.ones(2).bool()}, ValueError, "mask .* shape"),
        ({"log_prob": torch.zeros(3), "mask": torch.ones(3)}, ValueError, "mask must be a bool"),
        ({"nll_sum": -2.0, "num_tokens": 3}, ValueError, "nll_sum .* got -2.0"),
        ({"nll_sum": 2.0, "num_tokens": -3}, ValueError, "num_tokens must be >= 0, got -3"),
        ({"nll_sum": 2.0, "num_tokens": 1.5}, ValueError, "num_tokens must be an int, got 1.5"),
        ({"nll_sum": 2.0, "num_tokens": 0}, ValueError, "nll_sum must be 0"),
        ({"nll_sum": torch.ones(2), "num_tokens": 2}, ValueError, "nll_sum must be a float"),
        ({"nll_sum": 2.0}, ValueError, "needs both"),
        (
            {"preds": torch.randn(2, 5), "target": torch.tensor([0, 1]), "nll_sum": 1.0},
            ValueError,
            "exactly one of",
        ),
        ({}, ValueError, "exactly one of"),
    ],
)
def test_bad_update_input(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        Perplexity(ignore_index=-100).update(**kwargs)
