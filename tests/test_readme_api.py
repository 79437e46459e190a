"""The README's example of reductions, given negatives and the functional API runs as written
and gives what the text says."""

import re
from pathlib import Path

import torch
import torch.nn.functional as F

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_api_example_runs_and_its_losses_are_what_the_readme_says():
    section = README.read_text().split("## Per-position losses, your own negatives", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    torch.manual_seed(0)
    ns: dict = {}
    exec(code, ns)  # noqa: S102 (the README's own code)
    per_position, target = ns["per_position"], ns["target"]
    assert per_position.shape == (32, 20)
    assert torch.equal(per_position[:, :3], torch.zeros(32, 3))
    assert (per_position[:, 3:] > 0).all()
    assert ns["total"].shape == () and ns["loss"].shape == () and ns["sampled"].shape == ()
    z, weight = ns["z"], ns["weight"]
    logits = (z @ weight.T).reshape(-1, ns["N"])
    want = F.cross_entropy(logits, target.reshape(-1), reduction="none").reshape(32, 20)
    torch.testing.assert_close(ns["exact"], want)
    assert ns["each"].shape == () and torch.isfinite(ns["each"])
    several = ns["several"]
    probs = torch.zeros(32 * 20, ns["N"]).scatter_(1, several.reshape(-1, 3).clamp(min=0), 1 / 3)
    head = ns["head"]
    logits = (z @ head.weight[: ns["N"]].T).reshape(-1, ns["N"])  # before it grew; no bias
    scored = (several[..., 0] >= 0).reshape(-1)
    soft = F.cross_entropy(logits[scored], probs[scored])  # soft labels 1 / P
    torch.testing.assert_close(ns["soft"], soft)
    assert head.num_classes == 11_000 and head.weight.shape == (11_000, 64)
    assert torch.isfinite(ns["newest"])
    ns["tower_loss"].backward()
    assert ns["tower"][1].weight.grad.abs().sum() > 0  # the loss trains the tower


def test_the_perplexity_example_runs_and_equals_torchmetrics_on_the_logits():
    """The README's exact perplexity with a head ("Which number estimates what"), run as
    written over batches with ignored positions, equals torchmetrics' Perplexity of the full
    logits with ``ignore_index=-100``."""
    from torchmetrics.text import Perplexity as Reference

    from lightning_sampled.heads import SampledSoftmaxHead

    section = README.read_text().split("### Which number estimates what", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    g = torch.Generator().manual_seed(0)
    head = SampledSoftmaxHead(300, 16, num_negatives=5)
    batches = []
    for _ in range(3):
        y = torch.randint(300, (4, 9), generator=g)
        y[torch.rand(4, 9, generator=g) < 0.3] = -100
        batches.append((torch.randn(4, 9, 16, generator=g), y))
    ns: dict = {"head": head, "batches": batches}
    exec(code, ns)  # noqa: S102 (the README's own code)
    reference = Reference(ignore_index=-100)
    for z, y in batches:
        reference.update(head.logits(z).detach(), y)
    torch.testing.assert_close(ns["ppl"].compute(), reference.compute(), rtol=1e-5, atol=0)
