"""One gradient for a class table read by many gathers.

A sampled head that scores its rows a block at a time (under activation checkpointing) gathers
class vectors once per block. ``F.embedding``'s backward gives each gather its own gradient: a
dense ``[N, D]`` one, zeroed and then added to the others (one ``[N, D]`` fill and add per
gather), or a sparse one that autograd adds to the sum so far (each addition copies every row
gathered before it: quadratic in the number of blocks). Here every gather of a
:class:`RowGradientSink` adds its rows' gradients into one ``[N, D]`` buffer, allocated at the
first backward, or, for a row-sparse table, keeps them, and the table's gradient is handed over
once: that buffer, or one sparse COO tensor of every gathered row (uncoalesced, as
``F.embedding(..., sparse=True)`` gives).

Only the first-order gradient is supported (no ``create_graph`` through the gathers).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor


class RowGradients:
    """The gradient that the gathers of a :class:`RowGradientSink` add into.

    Attributes:
        sparse: whether the gradient is a sparse COO tensor over the gathered rows.
        grad: the dense ``[N, D]`` buffer (the table's dtype and device), ``None`` before the
            first backward, for a sparse gradient, and after it is handed over.
    """

    def __init__(self, like: Tensor, sparse: bool) -> None:
        self.shape, self.dtype, self.device = like.shape, like.dtype, like.device
        self.sparse = sparse
        self.grad: Tensor | None = None
        self._rows: list[tuple[Tensor, Tensor]] = []

    def add(self, ids: Tensor, grad: Tensor) -> None:
        """Adds the gradient ``[*ids.shape, D]`` of gathered rows ``ids``."""
        flat = grad.reshape(-1, grad.shape[-1]).to(self.dtype)
        if self.sparse:
            self._rows.append((ids.reshape(-1), flat))
            return
        if self.grad is None:
            self.grad = torch.zeros(self.shape, dtype=self.dtype, device=self.device)
        self.grad.index_add_(0, ids.reshape(-1), flat)

    def take(self) -> Tensor | None:
        """The table's gradient (``None`` where nothing was gathered), handed over once."""
        if not self.sparse:
            grad, self.grad = self.grad, None
            return grad
        rows, self._rows = self._rows, []
        if not rows:
            return None
        ids, values = zip(*rows, strict=True)
        indices, values = torch.cat(ids)[None], torch.cat(values)  # ids a gather took: valid
        return torch.sparse_coo_tensor(indices, values, self.shape, check_invariants=False)


class RowGradientSink(NamedTuple):
    """Gathers from a table ``weight`` ``[N, D]`` whose gradients go into one gradient.

    Attributes:
        table: ``weight`` as the gathers read it: the node whose backward hands the buffer to
            ``weight`` once every gather's backward has added to it.
        gradients: where the gathers' gradients go.
    """

    table: Tensor
    gradients: RowGradients

    @classmethod
    def of(cls, weight: Tensor, sparse: bool = False) -> RowGradientSink:
        """A sink for the gathers of one forward from ``weight``, whose gradient is sparse
        where ``sparse``."""
        gradients = RowGradients(weight, sparse)
        return cls(_HandOver.apply(weight, gradients), gradients)

    def gather(self, ids: Tensor) -> Tensor:
        """Rows ``[*ids.shape, D]`` of the table, their gradient added into the sink's."""
        return _GatherInto.apply(self.table, ids, self.gradients)


class _HandOver(torch.autograd.Function):
    """The identity on the table; its backward, which runs after every gather's, returns the
    gathers' gradient as the table's gradient (the gathers pass none back through the graph)."""

    @staticmethod
    def forward(ctx, weight: Tensor, gradients: RowGradients) -> Tensor:
        ctx.set_materialize_grads(False)  # the gathers send no gradient: no [N, D] of zeros
        ctx.gradients = gradients
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx, grad: Tensor | None) -> tuple[Tensor | None, None]:
        gathered = ctx.gradients.take()
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
