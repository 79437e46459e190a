"""Run-time checks of the row-sparse path: a class table that should get a sparse gradient but
gets a dense one (a warning naming the module that reads it densely), and an optimizer that
cannot take sparse gradients (an error naming :class:`LazyAdam` at its first step).

``OutputHead`` installs both when a head is built with ``sparse_grad=True``.
"""

from __future__ import annotations

import gc
import warnings

import torch
from torch import Tensor, nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from .lazy_adam import LazyAdam

# optimizers whose step takes sparse COO gradients
SPARSE_CAPABLE = (LazyAdam, torch.optim.SparseAdam, torch.optim.SGD, torch.optim.Adagrad)

_sparse_tables: dict[int, str] = {}  # id(parameter) -> the head that made it sparse
_step_hook: object | None = None


def _check_optimizer(optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
    """Global optimizer step pre-hook: refuses a sparse class-table gradient in an optimizer that
    cannot take it, before that optimizer fails with a message that does not name the fix."""
    if isinstance(optimizer, SPARSE_CAPABLE) or not _sparse_tables:
        return
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.grad is not None and param.grad.is_sparse:
                owner = _sparse_tables.get(id(param), "a parameter")
                raise TypeError(
                    f"{type(optimizer).__name__} cannot take the row-sparse gradient of {owner}'s "
                    f"class table (sparse_grad=True): use lightning_sampled.optim.LazyAdam (Adam "
                    f"for dense parameters, SparseAdam's lazy update for sparse ones, one "
                    f"optimizer for the whole module), or build the head with sparse_grad=False"
                )


def require_sparse_capable_optimizer(table: Tensor, owner: str) -> None:
    """Registers ``table`` as a row-sparse class table of ``owner`` (a head's name) and installs
    the global optimizer check once per process."""
    global _step_hook
    _sparse_tables[id(table)] = owner
    if _step_hook is None:
        _step_hook = register_optimizer_step_pre_hook(_check_optimizer)


def modules_holding(param: Tensor) -> list[nn.Module]:
    """The modules that hold ``param`` in their own ``_parameters`` (found through the garbage
    collector's referrers; slow, for error messages only)."""
    found = []
    for params in gc.get_referrers(param):
        if not isinstance(params, dict):
            continue
        for attrs in gc.get_referrers(params):  # a module's __dict__ holds its _parameters
            if not (isinstance(attrs, dict) and attrs.get("_parameters") is params):
                continue
            found += [
                m
                for m in gc.get_referrers(attrs)
                if isinstance(m, nn.Module) and m.__dict__ is attrs
            ]
    return found


def dense_readers(param: Tensor) -> str:
    """Names the modules that read ``param`` densely, for the warning of :func:`warn_if_dense`."""
    readers = [
        f"{m!r} (sparse=False)"
        for m in modules_holding(param)
        if isinstance(m, nn.Embedding) and not m.sparse
    ]
    if readers:
        return (
            f"it is tied to {', '.join(readers)}, whose lookup gives a dense gradient: build it "
            f"with sparse=True"
        )
    return (
        "some other use of the table gives it a dense gradient (an nn.Embedding or F.embedding "
        "without sparse=True, a matmul with the whole table such as full_loss or logits)"
    )


def warn_if_dense(table: nn.Parameter, owner: str) -> None:
    """Warns once, naming the dense path, when ``table``'s accumulated gradient is dense."""
    warned = False

    def hook(param: Tensor) -> None:
        nonlocal warned
        if warned or param.grad is None or param.grad.is_sparse:
            return
        warned = True
        warnings.warn(
            f"{owner} has sparse_grad=True but its class table {tuple(param.shape)} received a "
            f"dense gradient, so each step still costs O(N * D): {dense_readers(param)}",
            stacklevel=2,
        )

    table.register_post_accumulate_grad_hook(hook)
