"""``LazyAdam``: one optimizer for modules whose class table has a row-sparse gradient.

Lightning's automatic optimisation steps one optimizer; ``torch.optim.Adam`` refuses sparse
gradients and ``torch.optim.SparseAdam`` refuses dense ones. ``LazyAdam`` takes both, per
parameter and per step, from the kind of gradient it finds:

- a dense gradient gets Adam with decoupled weight decay (``torch.optim.AdamW``'s update);
- a sparse COO gradient (``SampledSoftmaxHead(sparse_grad=True)``, ``nn.Embedding(sparse=True)``)
  gets exactly ``torch.optim.SparseAdam``'s lazy update on the touched rows: their moments are
  decayed and the rows moved, the moments of untouched rows are left as they are (not decayed),
  and bias correction uses the parameter's own step count. The update is vectorised over the
  touched rows (one gather and one scatter per state tensor, in cache-sized blocks of rows), so
  a step costs ``O(R * D)`` for ``R`` touched rows, not ``O(N * D)``.

Weight decay on sparse rows is lazy as well: a touched row is multiplied by ``1 - lr * wd``
before its Adam step (AdamW's decoupled decay, applied only when the row is touched), untouched
rows are not decayed. With ``weight_decay=0`` the sparse update equals ``SparseAdam``'s and the
dense update equals ``Adam``'s.
"""

from __future__ import annotations

import math
import traceback
from collections.abc import Callable, Iterable
from pathlib import PurePath

import torch
from torch import Tensor
from torch.optim.adam import adam

from .._validation import check_finite_number


class LazyAdam(torch.optim.Optimizer):
    """Adam for dense gradients and lazy (``SparseAdam``) Adam for row-sparse ones, in one
    optimizer that a ``configure_optimizers`` can return.

    Args:
        params: parameters or parameter groups, as for any ``torch.optim.Optimizer``.
        lr: learning rate, ``> 0``.
        betas: ``(beta1, beta2)``, each in ``[0, 1)``.
        eps: added to the square root of the second moment, ``> 0``.
        weight_decay: decoupled weight decay, ``>= 0`` (see the module docstring for sparse rows).
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        check_finite_number("lr", lr, minimum=0.0, strict=True)
        check_finite_number("eps", eps, minimum=0.0, strict=True)
        check_finite_number("weight_decay", weight_decay, minimum=0.0)
        if len(betas) != 2 or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in betas):
            raise ValueError(f"betas must be two numbers in [0, 1), got {betas!r}")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)

    def _state_of(self, param: Tensor) -> dict:
        """The parameter's state, created on first use: a float32 step count (a tensor, as
        ``torch.optim.Adam`` keeps it, so checkpoints load into either) and the two moments."""
        state = self.state[param]
        if not state:
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        return state

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """One update of every parameter that has a gradient.

        Args:
            closure: re-evaluates the model and returns the loss (Lightning passes one).

        Returns:
            the closure's loss, or ``None``.

        Raises:
            RuntimeError: if gradient clipping inside the closure meets a sparse gradient, naming
                :func:`~lightning_sampled.optim.clip_grad_norm_`.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = _run_closure(closure)
        for group in self.param_groups:
            dense: dict[str, list[Tensor]] = {k: [] for k in ("p", "g", "m", "v", "t")}
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self._state_of(param)
                if param.grad.is_sparse:
                    state["step"] += 1
                    _lazy_adam_rows(param, param.grad, state, group)
                    continue
                for key, value in zip(
                    "pgmvt",
                    (param, param.grad, state["exp_avg"], state["exp_avg_sq"], state["step"]),
                    strict=True,
                ):
                    dense[key].append(value)
            if dense["p"]:
                beta1, beta2 = group["betas"]
                adam(
                    dense["p"],
                    dense["g"],
                    dense["m"],
                    dense["v"],
                    [],
                    dense["t"],
                    decoupled_weight_decay=True,
                    amsgrad=False,
                    beta1=beta1,
                    beta2=beta2,
                    lr=group["lr"],
                    weight_decay=group["weight_decay"],
                    eps=group["eps"],
                    maximize=False,
                )
        return loss


def _run_closure(closure: Callable[[], float]) -> float:
    """Runs ``closure``, re-raising two torch errors about sparse gradients with what to do:
    norm clipping (``gradient_clip_val`` in Lightning), which cannot take them, and DDP's
    gradient reducer, which expects a dense gradient for a table no sparse ``nn.Embedding`` owns.
    """
    try:
        return closure()
    except NotImplementedError as err:
        if "Sparse" in str(err) and _raised_in_clip_grad(err):
            raise RuntimeError(
                "a gradient is row-sparse (sparse_grad=True or nn.Embedding(sparse=True)) and "
                "torch.nn.utils.clip_grad_norm_ cannot take sparse gradients; clip with "
                "lightning_sampled.optim.clip_grad_norm_ instead: in your LightningModule, "
                "override configure_gradient_clipping(self, optimizer, gradient_clip_val, "
                "gradient_clip_algorithm) to call clip_grad_norm_(self.parameters(), "
                "gradient_clip_val)"
            ) from err
        if "Cannot access storage of SparseTensorImpl" in str(err):
            raise RuntimeError(
                "DDP expected a dense gradient for a parameter that received a row-sparse one: "
                "torch's DDP reduces a sparse gradient only for a parameter first registered in "
                "an nn.Embedding(sparse=True). Hold the class table of a sparse_grad=True head in "
                "such an embedding, registered before the head, and tie the head to it "
                "(SampledSoftmaxHead(..., sparse_grad=True, weight=embedding.weight)), or use "
                "sparse_grad=False under DDP"
            ) from err
        raise


def _raised_in_clip_grad(err: BaseException) -> bool:
    """Whether ``err`` was raised inside ``torch.nn.utils.clip_grad``."""
    frames = traceback.extract_tb(err.__traceback__)
    return any(PurePath(f.filename).parts[-3:] == ("nn", "utils", "clip_grad.py") for f in frames)


def _lazy_adam_rows(param: Tensor, grad: Tensor, state: dict, group: dict) -> None:
    """``SparseAdam``'s update of the rows a sparse ``grad`` touches (decoupled weight decay on
    those rows first), over blocks of touched rows small enough to stay in cache."""
    rows, values = _summed_rows(grad)
    beta1, beta2 = group["betas"]
    step = float(state["step"])
    step_size = group["lr"] * math.sqrt(1 - beta2**step) / (1 - beta1**step)
    decay = 1 - group["lr"] * group["weight_decay"]
    block = _rows_per_block(values)
    for start in range(0, rows.numel(), block):
        _update_block(
            param,
            state["exp_avg"],
            state["exp_avg_sq"],
            rows[start : start + block],
            values[start : start + block],
            betas=(beta1, beta2),
            eps=group["eps"],
            step_size=step_size,
            decay=decay,
        )


def _summed_rows(grad: Tensor) -> tuple[Tensor, Tensor]:
    """The distinct rows of a sparse COO ``grad`` and their summed values.

    Args:
        grad: a sparse ``[N, D]`` gradient, coalesced or not (several draws of one class give
            duplicate rows).

    Returns:
        ``rows`` long ``[R]`` (sorted, distinct) and ``values`` ``[R, D]``.
    """
    if grad.is_coalesced():
        return grad.indices()[0], grad.values()
    # torch.unique + index_add_ is about twice as fast as Tensor.coalesce on CPU for [R, D] values
    rows, inverse = torch.unique(grad._indices()[0], sorted=True, return_inverse=True)
    values = grad._values()
    summed = values.new_zeros(rows.numel(), *values.shape[1:]).index_add_(0, inverse, values)
    return rows, summed


_BLOCK_BYTES = 1 << 19


def _rows_per_block(values: Tensor) -> int:
    """How many rows of ``values`` ``[R, D]`` fill about 512 KiB: a block's temporaries then
    stay in cache between the element-wise passes (2x faster than one pass over all rows)."""
    row_bytes = max(1, values[0].numel() * values.element_size()) if values.shape[0] else 1
    return max(1, _BLOCK_BYTES // row_bytes)


def _update_block(
    param: Tensor,
    exp_avg: Tensor,
    exp_avg_sq: Tensor,
    rows: Tensor,
    values: Tensor,
    *,
    betas: tuple[float, float],
    eps: float,
    step_size: float,
    decay: float,
) -> None:
    """Adam on ``rows`` (long ``[r]``, distinct) of ``param`` and its moments (each ``[N, D]``)
    given their summed gradient ``values`` ``[r, D]``: one gather and one scatter per tensor."""
    beta1, beta2 = betas
    m = exp_avg.index_select(0, rows).lerp_(values, 1 - beta1)
    v = exp_avg_sq.index_select(0, rows).mul_(beta2).addcmul_(values, values, value=1 - beta2)
    exp_avg.index_copy_(0, rows, m)
    exp_avg_sq.index_copy_(0, rows, v)
    old = param.index_select(0, rows)
    if decay != 1:
        old.mul_(decay)
    param.index_copy_(0, rows, old.addcdiv_(m, v.sqrt_().add_(eps), value=-step_size))


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
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    params = [p for p in params if p.grad is not None]
    if not params:
        return torch.tensor(0.0)
    for p in params:
        if p.grad.is_sparse and not p.grad.is_coalesced():
            p.grad = p.grad.coalesce()
    entries = [p.grad.values() if p.grad.is_sparse else p.grad for p in params]
    norms = torch.stack([torch.linalg.vector_norm(g, norm_type).float() for g in entries])
    total = torch.linalg.vector_norm(norms, norm_type)
    scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in entries:
        g.mul_(scale.to(g.dtype))
    return total
