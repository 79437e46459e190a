"""Gradient clipping that also takes sparse COO gradients, and a LightningModule mixin that makes
``Trainer(gradient_clip_val=..., gradient_clip_algorithm="norm" | "value")`` use it.

``torch.nn.utils.clip_grad_norm_`` and ``clip_grad_value_`` (what Lightning's clipping calls)
stop at the row-sparse gradient of a ``sparse_grad=True`` head or an ``nn.Embedding(sparse=True)``
table: ``NotImplementedError`` from torch's sparse backend. The functions here clip such a
gradient as torch would clip its dense equivalent (duplicate rows summed first, as the optimizer
sees them), touching only its stored entries.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

from .._validation import check_finite_number

#: the values of Lightning's ``gradient_clip_algorithm`` (its ``GradClipAlgorithmType``)
CLIP_ALGORITHMS = ("norm", "value")


def _gradients(parameters: Iterable[Tensor] | Tensor) -> list[Tensor]:
    """The ``.grad`` of every tensor in ``parameters`` that has one, a sparse gradient coalesced
    first (stored back in ``.grad``), so that its entries are those of the dense gradient."""
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    params = [p for p in params if p.grad is not None]
    for p in params:
        if p.grad.is_sparse and not p.grad.is_coalesced():
            p.grad = p.grad.coalesce()
    return [p.grad for p in params]


def _entries(grad: Tensor) -> Tensor:
    """The stored entries of a gradient: a sparse gradient's values, a dense one itself."""
    return grad.values() if grad.is_sparse else grad


@torch.no_grad()
def clip_grad_norm_(
    parameters: Iterable[Tensor] | Tensor, max_norm: float, norm_type: float = 2.0
) -> Tensor:
    """``torch.nn.utils.clip_grad_norm_`` that also takes sparse COO gradients.

    The total norm is over every gradient's entries (a sparse gradient's duplicate rows are
    summed first, as the optimizer sees them); all gradients are scaled by
    ``min(1, max_norm / (total + 1e-6))`` in place.

    Args:
        parameters: tensors whose ``.grad`` to clip.
        max_norm: the largest allowed total norm, ``> 0``.
        norm_type: the ``p`` of the norm (``inf`` allowed).

    Returns:
        the total norm before clipping, a scalar tensor.
    """
    check_finite_number("max_norm", max_norm, minimum=0.0, strict=True)
    entries = [_entries(g) for g in _gradients(parameters)]
    if not entries:
        return torch.tensor(0.0)
    norms = torch.stack([torch.linalg.vector_norm(g, norm_type).float() for g in entries])
    total = torch.linalg.vector_norm(norms, norm_type)
    scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in entries:
        g.mul_(scale.to(g.dtype))
    return total


@torch.no_grad()
def clip_grad_value_(parameters: Iterable[Tensor] | Tensor, clip_value: float) -> None:
    """``torch.nn.utils.clip_grad_value_`` that also takes sparse COO gradients: every entry of
    every gradient is clamped to ``[-clip_value, clip_value]`` in place. A sparse gradient's
    duplicate entries are summed first (the clamp of the dense gradient it stands for); its
    entries not stored are zeros, which the clamp leaves.

    Args:
        parameters: tensors whose ``.grad`` to clip.
        clip_value: the largest allowed absolute value of a gradient entry, ``> 0``.
    """
    check_finite_number("clip_value", clip_value, minimum=0.0, strict=True)
    for grad in _gradients(parameters):
        _entries(grad).clamp_(-clip_value, clip_value)


class SparseGradientClipping:
    """A LightningModule mixin: the Trainer's gradient clipping (``gradient_clip_val`` with
    ``gradient_clip_algorithm="norm"``, the default, or ``"value"``) also clips sparse COO
    gradients, through :func:`clip_grad_norm_` / :func:`clip_grad_value_`, so that a module
    with a ``sparse_grad=True`` head needs no ``configure_gradient_clipping`` of its own.

    Mix it in before ``LightningModule``: ``class Model(SparseGradientClipping,
    L.LightningModule)`` (``TypeError`` at class creation otherwise, where Lightning's hook
    would shadow it). When no gradient of the optimizer's parameters is sparse it leaves the
    clipping to Lightning (its precision plugin's, unchanged). In manual optimisation Lightning
    does not clip; call :func:`clip_grad_norm_` or :func:`clip_grad_value_` there.
    """

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        owner = next(c for c in cls.__mro__ if "configure_gradient_clipping" in vars(c))
        if not issubclass(owner, SparseGradientClipping):
            raise TypeError(
                f"{cls.__name__}: {owner.__name__}.configure_gradient_clipping comes before "
                f"SparseGradientClipping's in the class's bases, so sparse gradients would not be "
                f"clipped; list SparseGradientClipping first: class {cls.__name__}("
                f"SparseGradientClipping, {owner.__name__})"
            )

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Clips the gradients of ``optimizer``'s parameters: by :func:`clip_grad_norm_` or
        :func:`clip_grad_value_` when one of them is sparse (``gradient_clip_val`` ``None`` or
        ``0``: no clipping; ``gradient_clip_algorithm`` ``None``: ``"norm"``, as Lightning's
        default), else by Lightning's own clipping."""
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if not any(p.grad is not None and p.grad.is_sparse for p in params):
            super().configure_gradient_clipping(  # type: ignore[misc]
                optimizer, gradient_clip_val, gradient_clip_algorithm
            )
            return
        # Lightning passes its GradClipAlgorithmType, a str enum; a user may pass a str
        name = getattr(gradient_clip_algorithm, "value", gradient_clip_algorithm)
        algorithm = "norm" if name is None else str(name).lower()
        if algorithm not in CLIP_ALGORITHMS:
            raise ValueError(
                f"gradient_clip_algorithm must be one of {list(CLIP_ALGORITHMS)} or None, got "
                f"{gradient_clip_algorithm!r}"
            )
        if not gradient_clip_val:
            return
        if algorithm == "norm":
            clip_grad_norm_(params, gradient_clip_val)
        else:
            clip_grad_value_(params, gradient_clip_val)
