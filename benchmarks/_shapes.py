"""Synthetic problems that several benchmarks share, and how their answers are scored.

- :func:`clustered_table`: a class table ``[N, D]`` of noisy copies of ``N / 100`` random centres
  (``benchmarks.cane``, ``benchmarks.cane_topk``), and :func:`recall` of a top-k against the exact
  one.
- :func:`zipf_targets`, :func:`zipf_batch`: targets from ``p(i) ∝ 1 / (i + 1)`` and a batch of
  Gaussian queries beside them, and :func:`head_step`, the forward and backward of a head on such
  a batch (``benchmarks.in_batch_step``, ``benchmarks.default_cost``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

#: the dimension of :func:`clustered_table`'s vectors
DIM = 64
#: classes per centre of :func:`clustered_table`
CLASSES_PER_CENTRE = 100


def clustered_table(num_classes: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """``(table [N, D], centres [N / 100, D])``: each class a random centre plus noise."""
    centres = torch.randn(max(1, num_classes // CLASSES_PER_CENTRE), DIM, generator=generator)
    owner = torch.randint(0, centres.shape[0], (num_classes,), generator=generator)
    return centres[owner] + 0.5 * torch.randn(num_classes, DIM, generator=generator), centres


def recall(found: Tensor, exact: Tensor) -> float:
    """Mean fraction of each row of ``exact`` ``[T, k]`` that ``found`` ``[T, k]`` holds."""
    hits = (found[:, :, None] == exact[:, None, :]).any(1)
    return float(hits.float().mean())


def zipf_targets(num: int, num_classes: int, generator: torch.Generator) -> Tensor:
    """``num`` class ids (long) from ``p(i) ∝ 1 / (i + 1)`` over ``num_classes`` classes."""
    weights = 1.0 / torch.arange(1, num_classes + 1, dtype=torch.float64)
    return torch.multinomial(weights, num, replacement=True, generator=generator)


def zipf_batch(
    positions: int, num_classes: int, dim: int, generator: torch.Generator, device: torch.device
) -> tuple[Tensor, Tensor, int]:
    """A batch on ``device``: ``positions`` targets of :func:`zipf_targets`, Gaussian queries
    ``[T, D]`` that require grad, and the number of distinct targets."""
    target = zipf_targets(positions, num_classes, generator)
    distinct = int(target.unique().numel())
    z = torch.randn(positions, dim, generator=generator)
    return target.to(device), z.to(device).requires_grad_(), distinct


def head_step(head: nn.Module, z: Tensor, target: Tensor) -> Callable[[], None]:
    """One forward and backward of ``head`` on ``z`` ``[T, D]`` and ``target`` ``[T]``, its
    gradients dropped first."""

    def run() -> None:
        head.zero_grad(set_to_none=True)
        head(z, target).backward()

    return run
