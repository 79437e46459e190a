"""One dense gradient for a class table read by many gathers.

A sampled head that scores its rows a block at a time (under activation checkpointing) gathers
class vectors once per block. ``F.embedding``'s backward gives each gather its own dense
``[N, D]`` gradient, zeroed and then added to the others: at a language model's shape (4,088
positions in 42 blocks, a 50,257-word table) that zeroing and adding was half of the step. Here
every gather of a :class:`RowGradientSink` adds its rows' gradients into one ``[N, D]`` buffer,
allocated at the first backward, and the table's gradient is that buffer, handed over once.

Only the first-order gradient is supported (no ``create_graph`` through the gathers).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor


class RowGradients:
    """The dense ``[N, D]`` gradient that the gathers of a :class:`RowGradientSink` add into.

    Attributes:
        grad: the buffer (the table's dtype and device), ``None`` before the first backward and
            after it is handed over.
    """

    def __init__(self, like: Tensor) -> None:
        self.shape, self.dtype, self.device = like.shape, like.dtype, like.device
        self.grad: Tensor | None = None

    def add(self, ids: Tensor, grad: Tensor) -> None:
        """Adds the gradient ``[*ids.shape, D]`` of gathered rows ``ids`` into :attr:`grad`."""
        if self.grad is None:
            self.grad = torch.zeros(self.shape, dtype=self.dtype, device=self.device)
        self.grad.index_add_(0, ids.reshape(-1), grad.reshape(-1, grad.shape[-1]).to(self.dtype))


class RowGradientSink(NamedTuple):
    """Gathers from a table ``weight`` ``[N, D]`` whose gradients go into one dense buffer.

    Attributes:
        table: ``weight`` as the gathers read it: the node whose backward hands the buffer to
            ``weight`` once every gather's backward has added to it.
        gradients: the buffer.
    """

    table: Tensor
    gradients: RowGradients

    @classmethod
    def of(cls, weight: Tensor) -> RowGradientSink:
        """A sink for the gathers of one forward from ``weight``."""
        gradients = RowGradients(weight)
        return cls(_HandOver.apply(weight, gradients), gradients)

    def gather(self, ids: Tensor) -> Tensor:
        """Rows ``[*ids.shape, D]`` of the table, their gradient added into the buffer."""
        return _GatherInto.apply(self.table, ids, self.gradients)


class _HandOver(torch.autograd.Function):
    """The identity on the table; its backward, which runs after every gather's, returns the
    buffer as the table's gradient (the gathers pass none back through the graph)."""

    @staticmethod
    def forward(ctx, weight: Tensor, gradients: RowGradients) -> Tensor:
        ctx.set_materialize_grads(False)  # the gathers send no gradient: no [N, D] of zeros
        ctx.gradients = gradients
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx, grad: Tensor | None) -> tuple[Tensor | None, None]:
        gathered, ctx.gradients.grad = ctx.gradients.grad, None
        if grad is None:
            return gathered, None
        return grad if gathered is None else gathered + grad, None


class _GatherInto(torch.autograd.Function):
    """``F.embedding(ids, table)`` whose backward adds into the sink instead of returning a
    dense ``[N, D]`` gradient."""

    @staticmethod
    def forward(ctx, table: Tensor, ids: Tensor, gradients: RowGradients) -> Tensor:
        ctx.save_for_backward(ids)
        ctx.gradients = gradients
        return F.embedding(ids, table)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[None, None, None]:
        (ids,) = ctx.saved_tensors
        ctx.gradients.add(ids, grad)
        return None, None, None
