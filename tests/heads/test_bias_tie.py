"""Migrating from ``nn.Linear``: ``weight`` and ``bias`` both tie to the Linear's parameters."""

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightning_sampled.heads import FullSoftmaxHead, SampledSoftmaxHead

N, D = 37, 5


def test_full_head_tied_to_a_linear_equals_its_cross_entropy():
    torch.manual_seed(0)
    linear = nn.Linear(D, N)
    head = FullSoftmaxHead(N, D, weight=linear.weight, bias=linear.bias, chunk_size=8)
    assert head.weight is linear.weight and head.bias is linear.bias
    z = torch.randn(6, 3, D, requires_grad=True)
    y = torch.randint(N, (6, 3))
    loss = head(z, y)
    ref = F.cross_entropy(linear(z).reshape(-1, N), y.reshape(-1))
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    params = [z, linear.weight, linear.bias]
    for got, want in zip(
        torch.autograd.grad(loss, params), torch.autograd.grad(ref, params), strict=True
    ):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_a_sampled_step_updates_the_linear():
    torch.manual_seed(1)
    linear = nn.Linear(D, N)
    head = SampledSoftmaxHead(N, D, num_negatives=4, weight=linear.weight, bias=linear.bias)
    before = linear.bias.detach().clone()
    optimizer = torch.optim.SGD(linear.parameters(), lr=1.0)
    head(torch.randn(8, D), torch.randint(N, (8,))).backward()
    optimizer.step()
    assert not torch.equal(linear.bias, before)
    assert list(head.parameters()) == [linear.weight, linear.bias]


@pytest.mark.parametrize(
    "bad, match",
    [
        (torch.zeros(N), "bias must be a bool or an nn.Parameter"),
        (1, "bias must be a bool or an nn.Parameter"),
        (nn.Parameter(torch.zeros(N + 1)), r"bias must have shape \(37,\)"),
        (nn.Parameter(torch.zeros(1, N)), r"bias must have shape \(37,\)"),
    ],
)
def test_bad_bias_is_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        FullSoftmaxHead(N, D, bias=bad)


def readme_migration_examples() -> tuple[str, str]:
    """The "before" and "after" Python blocks of the README's ``nn.Linear`` section."""
    readme = Path(__file__).resolve().parents[2] / "README.md"
    section = readme.read_text().split("## Migrating from `nn.Linear`", 1)[1].split("\n## ", 1)[0]
    before, after = re.findall(r"```python\n(.*?)```", section, re.S)
    return before, after


def test_readme_migration_keeps_the_model():
    before_code, after_code = readme_migration_examples()
    before_ns: dict = {}
    after_ns: dict = {}
    exec(before_code, before_ns)  # noqa: S102 (the README's own code)
    exec(after_code, after_ns)  # noqa: S102
    torch.manual_seed(0)
    before = before_ns["TextClassifier"](vocab_size=50, num_labels=300)
    torch.manual_seed(0)
    after = after_ns["TextClassifier"](vocab_size=50, num_labels=300)
    after.load_state_dict(before.state_dict(), strict=False)
    tokens, offsets = torch.randint(50, (40,)), torch.arange(0, 40, 4)
    labels = torch.randint(300, (10,))
    hidden = after.embed(tokens, offsets)
    torch.testing.assert_close(
        after.head.full_loss(hidden, labels), before(tokens, offsets, labels)
    )
    _, top = after.head.topk(hidden, 5)
    assert torch.equal(top, after.out(hidden).topk(5).indices)
    after(tokens, offsets, labels).backward()
    assert after.out.weight.grad is not None and after.out.bias.grad is not None
