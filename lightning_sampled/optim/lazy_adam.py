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

Lean state for the class table (options; the defaults are the update above, bit for bit):

- ``table_state="row_wise_adagrad"``: a parameter whose first gradient is row-sparse gets
  FBGEMM's ``EXACT_ROWWISE_ADAGRAD`` instead of Adam, with one accumulator per row (state
  ``row_sum_sq`` of shape ``[N]``, zeros at first, FBGEMM's initial value) instead of two
  ``[N, D]`` moments. For each touched row ``r`` (duplicates summed first) with gradient
  ``g_r [D]``::

      G_r <- G_r + mean_d(g_rd ** 2)
      w_r <- (1 - table_lr * wd) * w_r - table_lr * g_r / (sqrt(G_r) + eps)

  as FBGEMM's CPU and CUDA kernels do (``eps`` outside the square root, the mean over the row's
  ``D`` entries, the new ``G_r`` in the denominator) with its decoupled weight decay mode
  (``weight_decay_mode=DECOUPLE``: the factor ``1 - learning_rate * weight_decay``, here on
  touched rows only, as ``LazyAdam`` decays). Untouched rows and their ``G_r`` are unchanged. The
  table's rows move by ``table_lr`` (FBGEMM's and TorchRec's default 0.01), not ``lr``: Adagrad's
  step shrinks as ``1 / sqrt(t)`` on a row touched every step, so it wants a larger rate than
  Adam's; about 0.01 moves a row touched in each of a few hundred steps as far as Adam at 1e-3
  does. LR schedulers change ``lr`` only, not ``table_lr``. Memory: 4 bytes per row (2 with
  ``state_dtype=torch.bfloat16``) against Adam's ``8 * D`` (``D = 64``: 1.6% of an fp32 table).
  Dense parameters keep AdamW. A row-wise parameter that later receives a dense gradient gets
  the row-wise update on every row (its state stays ``[N]``).
- ``state_dtype=torch.bfloat16``: the state of row-sparse parameters (Adam's moments or the
  row-wise accumulator) is stored in bf16 and computed in fp32; the default ``torch.float32``
  keeps it in fp32 (in the parameter's dtype when that is wider).
- A bf16 parameter with a row-sparse gradient: its touched rows are read into fp32, updated in
  fp32 and written back with *stochastic rounding* (:func:`stochastic_round_bf16`), so that an
  update far below bf16's resolution (``2**-8`` relative) moves the row in expectation instead of
  being rounded away; bf16 state is written back the same way (Adam's ``v`` with
  ``beta2 = 0.999`` changes by 0.1% a step, which round-to-nearest would also lose). The random
  bits come from the default generator of the table's device (no private ``torch.Generator``),
  so a run is repeatable under ``torch.manual_seed`` / ``lightning.seed_everything``; they also
  advance that generator. An fp16 table is written back by rounding to nearest.

Checkpoints: ``state_dict`` / ``load_state_dict`` keep each state tensor's dtype and shape
(torch's ``Optimizer`` would cast it to its parameter's dtype, rounding an fp32 accumulator of a
bf16 table to bf16); the options are saved in the parameter groups, as ``lr`` is.
"""

from __future__ import annotations

import math
import traceback
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import PurePath

import torch
from torch import Tensor
from torch.optim.adam import adam

from .._validation import check_finite_number

#: the ``table_state`` options: how parameters with a row-sparse gradient are updated
TABLE_STATES = ("adam", "row_wise_adagrad")
#: the ``state_dtype`` options, by name (as a config gives them) and as dtypes
STATE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class LazyAdam(torch.optim.Optimizer):
    """Adam for dense gradients and lazy (``SparseAdam``) Adam for row-sparse ones, in one
    optimizer that a ``configure_optimizers`` can return; optionally lean state for the
    row-sparse ones (see the module docstring).

    Args:
        params: parameters or parameter groups, as for any ``torch.optim.Optimizer``; a group
            may override any argument below (its ``table_state``, ``table_lr`` and
            ``state_dtype`` are checked as the defaults are).
        lr: learning rate, ``> 0``.
        betas: ``(beta1, beta2)``, each in ``[0, 1)``.
        eps: added to the square root of the second moment (and of the row-wise accumulator),
            ``> 0``.
        weight_decay: decoupled weight decay, ``>= 0`` (see the module docstring for sparse rows).
        table_state: ``"adam"`` (two ``[N, D]`` moments per row-sparse parameter, ``SparseAdam``'s
            update) or ``"row_wise_adagrad"`` (one ``[N]`` accumulator, FBGEMM's exact row-wise
            Adagrad).
        table_lr: the learning rate of ``"row_wise_adagrad"``, ``> 0`` (unused by ``"adam"``).
        state_dtype: ``torch.float32`` or ``torch.bfloat16`` (or their names): the dtype the state
            of row-sparse parameters is stored in; it is computed in fp32.

    Raises:
        ValueError: naming the argument and the bad value.
    """

    def __init__(
        self,
        params: Iterable[Tensor] | Iterable[dict],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        *,
        table_state: str = "adam",
        table_lr: float = 1e-2,
        state_dtype: torch.dtype | str = torch.float32,
    ) -> None:
        check_finite_number("lr", lr, minimum=0.0, strict=True)
        check_finite_number("eps", eps, minimum=0.0, strict=True)
        check_finite_number("weight_decay", weight_decay, minimum=0.0)
        if len(betas) != 2 or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in betas):
            raise ValueError(f"betas must be two numbers in [0, 1), got {betas!r}")
        defaults = dict(
            lr=lr,
            betas=tuple(betas),
            eps=eps,
            weight_decay=weight_decay,
            table_state=table_state,
            table_lr=table_lr,
            state_dtype=state_dtype,
        )
        _check_lean_options(defaults)
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict) -> None:
        """``torch.optim.Optimizer.add_param_group`` after checking the group's lean-state
        options (``table_state``, ``table_lr``, ``state_dtype``; a name becomes a dtype)."""
        for key in ("table_state", "table_lr", "state_dtype"):
            param_group.setdefault(key, self.defaults[key])
        _check_lean_options(param_group)
        super().add_param_group(param_group)

    def __setstate__(self, state: dict) -> None:
        """Fills the options that saved groups lack with this optimizer's defaults: the
        lean-state options of a checkpoint older than them (``"adam"`` in fp32 where this
        optimizer has none either), and ``weight_decay`` of a ``torch.optim.SparseAdam``
        state dict (whose state, step count and two moments, ``LazyAdam`` continues)."""
        super().__setstate__(state)
        fallback = dict(table_state="adam", table_lr=1e-2, state_dtype=torch.float32)
        defaults = {**fallback, **getattr(self, "defaults", {})}
        for group in self.param_groups:
            for key, value in defaults.items():
                group.setdefault(key, value)

    def load_state_dict(self, state_dict: dict) -> None:
        """``torch.optim.Optimizer.load_state_dict``, keeping every state tensor's saved dtype:
        torch casts floating state to its parameter's dtype, which would round an fp32
        accumulator of a bf16 table to bf16 (or widen bf16 moments)."""
        saved_ids = [i for group in state_dict["param_groups"] for i in group["params"]]
        super().load_state_dict(state_dict)
        params = [p for group in self.param_groups for p in group["params"]]
        for saved_id, param in zip(saved_ids, params, strict=True):
            for key, value in state_dict["state"].get(saved_id, {}).items():
                if key != "step" and isinstance(value, Tensor) and value.is_floating_point():
                    self.state[param][key] = value.to(device=param.device, copy=True)

    def _state_of(self, param: Tensor) -> dict:
        """The parameter's state, created on first use: a float32 step count (a tensor, as
        ``torch.optim.Adam`` keeps it, so checkpoints load into either) and the two moments."""
        state = self.state[param]
        if not state:
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        elif state["exp_avg"].dtype != param.dtype:  # a checkpoint of other dtypes
            for key in ("exp_avg", "exp_avg_sq"):
                state[key] = state[key].to(param.dtype)
        return state

    def _row_state_of(self, param: Tensor, group: dict) -> dict:
        """The state of a parameter updated row by row (its first gradient was row-sparse),
        created on first use: the step count and, by the group's ``table_state``, Adam's two
        moments ``[N, D]`` or the row-wise accumulator ``row_sum_sq`` ``[N]``, zeros in
        :func:`_state_dtype`; a state of another dtype (a checkpoint's) is converted to it.

        Raises:
            ValueError: naming ``table_state`` when the state holds the other kind (a
                checkpoint saved with another ``table_state`` and loaded without its groups),
                or where its rows are not the parameter's (a checkpoint of another table).
        """
        state = self.state[param]
        dtype = _state_dtype(param, group)
        row_wise = group["table_state"] == "row_wise_adagrad"
        keys = ("row_sum_sq",) if row_wise else ("exp_avg", "exp_avg_sq")
        if not state:
            state["step"] = torch.tensor(0.0)
            for key in keys:
                shape = param.shape[:1] if row_wise else param.shape
                state[key] = torch.zeros(shape, dtype=dtype, device=param.device)
        if any(key not in state for key in keys):
            raise ValueError(
                f"table_state={group['table_state']!r}, but the optimizer state of the "
                f"{tuple(param.shape)} parameter holds {sorted(k for k in state if k != 'step')} "
                f"(a checkpoint of the other table_state, or a parameter whose first gradient "
                f"was dense): keep the table_state it was trained with"
            )
        for key in keys:
            if state[key].shape[0] != param.shape[0]:
                raise ValueError(
                    f"the optimizer state {key!r} has {state[key].shape[0]} rows and its "
                    f"parameter {param.shape[0]}: a checkpoint of another table (a whole table "
                    f"loaded into a split one needs the ShardedTables callback to cut it)"
                )
            if state[key].dtype != dtype:
                state[key] = state[key].to(dtype)
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
            ValueError: for a sparse gradient that is not row-sparse (``sparse_dim`` other than
                1), naming ``sparse_dim``.
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
                if param.grad.is_sparse or "row_sum_sq" in self.state[param]:
                    _check_row_sparse(param, param.grad)
                    state = self._row_state_of(param, group)
                    state["step"] += 1
                    if "row_sum_sq" in state:
                        _row_wise_adagrad_rows(param, param.grad, state, group)
                    else:
                        _lazy_adam_rows(param, param.grad, state, group)
                    continue
                state = self._state_of(param)
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


def _check_lean_options(group: dict) -> None:
    """Checks a parameter group's ``table_state``, ``table_lr`` and ``state_dtype`` (a name is
    replaced by its dtype), raising ``ValueError`` naming the bad one."""
    if group["table_state"] not in TABLE_STATES:
        raise ValueError(f"table_state must be one of {TABLE_STATES}, got {group['table_state']!r}")
    check_finite_number("table_lr", group["table_lr"], minimum=0.0, strict=True)
    dtype = STATE_DTYPES.get(group["state_dtype"], group["state_dtype"])
    if dtype not in STATE_DTYPES.values():
        raise ValueError(
            f"state_dtype must be torch.float32 or torch.bfloat16 (or their names), got "
            f"{group['state_dtype']!r}"
        )
    group["state_dtype"] = dtype


def _state_dtype(param: Tensor, group: dict) -> torch.dtype:
    """The dtype of a row-sparse parameter's state: the group's ``state_dtype``, widened to the
    parameter's dtype when ``state_dtype`` is fp32 and the parameter is wider (fp64)."""
    dtype = group["state_dtype"]
    return torch.promote_types(param.dtype, dtype) if dtype == torch.float32 else dtype


def _check_row_sparse(param: Tensor, grad: Tensor) -> None:
    """Refuses a sparse gradient that is not row-sparse (``sparse_dim`` other than 1)."""
    if grad.is_sparse and grad.sparse_dim() != 1:
        raise ValueError(
            f"LazyAdam takes row-sparse gradients (sparse COO with sparse_dim 1, as "
            f"nn.Embedding(sparse=True) and sparse_grad=True heads give); the "
            f"{tuple(param.shape)} parameter got one with sparse_dim {grad.sparse_dim()}"
        )


def _run_closure(closure: Callable[[], float]) -> float:
    """Runs ``closure``, re-raising two torch errors about sparse gradients with what to do:
    torch's clipping (``gradient_clip_val`` in Lightning), which cannot take them, and DDP's
    gradient reducer, which expects a dense gradient for a table no sparse ``nn.Embedding`` owns.
    """
    try:
        return closure()
    except NotImplementedError as err:
        if "Sparse" in str(err) and _raised_in_clip_grad(err):
            raise RuntimeError(
                "a gradient is row-sparse (sparse_grad=True or nn.Embedding(sparse=True)) and "
                "torch.nn.utils' gradient clipping (what Lightning's gradient_clip_val calls) "
                "cannot take sparse gradients: mix lightning_sampled.optim.SparseGradientClipping "
                "into your LightningModule (class Model(SparseGradientClipping, "
                "L.LightningModule)), which clips by norm and by value, or clip with "
                "lightning_sampled.optim.clip_grad_norm_ / clip_grad_value_ yourself"
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
    those rows first)."""
    beta1, beta2 = group["betas"]
    step = float(state["step"])
    update = partial(
        _update_block,
        param,
        state["exp_avg"],
        state["exp_avg_sq"],
        betas=(beta1, beta2),
        eps=group["eps"],
        step_size=group["lr"] * math.sqrt(1 - beta2**step) / (1 - beta1**step),
        decay=1 - group["lr"] * group["weight_decay"],
    )
    _in_row_blocks(grad, update)


def _row_wise_adagrad_rows(param: Tensor, grad: Tensor, state: dict, group: dict) -> None:
    """FBGEMM's exact row-wise Adagrad on the rows ``grad`` touches (every row for a dense
    ``grad``), decoupled weight decay on those rows first."""
    update = partial(
        _row_wise_block,
        param,
        state["row_sum_sq"],
        lr=group["table_lr"],
        eps=group["eps"],
        decay=1 - group["table_lr"] * group["weight_decay"],
    )
    _in_row_blocks(grad, update)


def _in_row_blocks(grad: Tensor, update: Callable[[Tensor, Tensor], None]) -> None:
    """Calls ``update(rows, values)`` on blocks of the rows ``grad`` touches (:func:`_summed_rows`)
    small enough to stay in cache: ``rows`` long ``[r]``, ``values`` ``[r, D]``."""
    rows, values = _summed_rows(grad)
    block = _rows_per_block(values)
    for start in range(0, rows.numel(), block):
        update(rows[start : start + block], values[start : start + block])


def _summed_rows(grad: Tensor) -> tuple[Tensor, Tensor]:
    """The distinct rows of a sparse COO ``grad`` and their summed values, in at least fp32.

    Args:
        grad: a sparse ``[N, D]`` gradient, coalesced or not (several draws of one class give
            duplicate rows), or a dense one (every row).

    Returns:
        ``rows`` long ``[R]`` (sorted, distinct) and ``values`` ``[R, D]`` (fp32 for a bf16 or
        fp16 ``grad``: duplicates are summed in fp32).
    """
    if not grad.is_sparse:
        return torch.arange(grad.shape[0], device=grad.device), _compute_dtype(grad)
    if grad.is_coalesced():
        return grad.indices()[0], _compute_dtype(grad.values())
    # torch.unique + index_add_ is about twice as fast as Tensor.coalesce on CPU for [R, D] values
    rows, inverse = torch.unique(grad._indices()[0], sorted=True, return_inverse=True)
    values = _compute_dtype(grad._values())
    summed = values.new_zeros(rows.numel(), *values.shape[1:]).index_add_(0, inverse, values)
    return rows, summed


def _compute_dtype(x: Tensor) -> Tensor:
    """``x`` itself when it is at least fp32, else ``x`` in fp32."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


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
    given their summed gradient ``values`` ``[r, D]``: one gather and one scatter per tensor,
    computed in ``values``' dtype (at least fp32) and written back by :func:`_write_rows`."""
    beta1, beta2 = betas
    dtype = values.dtype
    m = exp_avg.index_select(0, rows).to(dtype).lerp_(values, 1 - beta1)
    v = exp_avg_sq.index_select(0, rows).to(dtype)
    v.mul_(beta2).addcmul_(values, values, value=1 - beta2)
    _write_rows(exp_avg, rows, m)
    _write_rows(exp_avg_sq, rows, v)
    old = param.index_select(0, rows).to(dtype)
    if decay != 1:
        old.mul_(decay)
    _write_rows(param, rows, old.addcdiv_(m, v.sqrt_().add_(eps), value=-step_size))


def _row_wise_block(
    param: Tensor,
    row_sum_sq: Tensor,
    rows: Tensor,
    values: Tensor,
    *,
    lr: float,
    eps: float,
    decay: float,
) -> None:
    """Row-wise Adagrad on ``rows`` (long ``[r]``, distinct) of ``param`` ``[N, D]`` and its
    accumulator ``row_sum_sq`` ``[N]`` given their summed gradient ``values`` ``[r, D]``:
    ``G += mean_d(g ** 2)``, ``w <- decay * w - lr * g / (sqrt(G) + eps)``, in ``values``'
    dtype (at least fp32), written back by :func:`_write_rows`."""
    dims = tuple(range(1, values.dim()))
    total = row_sum_sq.index_select(0, rows).to(values.dtype)
    total.add_(values.square().mean(dim=dims) if dims else values.square())
    _write_rows(row_sum_sq, rows, total)
    scale = total.sqrt_().add_(eps).reciprocal_().mul_(-lr)  # [r]: -lr / (sqrt(G) + eps)
    new = param.index_select(0, rows).to(values.dtype)
    if decay != 1:
        new.mul_(decay)
    _write_rows(param, rows, new.addcmul_(values, scale.view(-1, *(1,) * len(dims))))


def _write_rows(dest: Tensor, rows: Tensor, values: Tensor) -> None:
    """``dest[rows] = values`` for ``dest`` ``[N, ...]`` and ``values`` ``[r, ...]`` computed in
    a wider dtype: stochastically rounded into a bf16 ``dest`` (:func:`stochastic_round_bf16`),
    rounded to nearest into another narrower one."""
    if values.dtype != dest.dtype:
        if dest.dtype == torch.bfloat16:
            values = stochastic_round_bf16(values)
        else:
            values = values.to(dest.dtype)
    dest.index_copy_(0, rows, values)


def stochastic_round_bf16(x: Tensor) -> Tensor:
    """``x`` rounded to bf16 stochastically: away from zero with probability equal to the part
    of the spacing that rounding toward zero would drop, so ``E[round(x)] = x`` exactly for
    every finite ``x`` within bf16's range.

    The 16 low bits of fp32 that bf16 drops are added to 16 uniform random bits and the sum is
    truncated (the carry rounds up the magnitude). The random bits come from the default
    generator of ``x``'s device (``Tensor.random_``), so the result is repeatable under
    ``torch.manual_seed``. ``nan`` stays ``nan`` and ``inf`` stays ``inf`` (its low bits are
    zero: nothing to carry); a value beyond bf16's largest finite one rounds to it or to
    ``inf``.

    Args:
        x: a float tensor of any shape (fp32 or wider; it is computed in fp32).

    Returns:
        a bf16 tensor of ``x``'s shape.
    """
    x = x.float().contiguous()
    # int32 random_() draws from [0, 2**31): its 16 low bits are uniform (4x faster than randint)
    noise = torch.empty(x.shape, dtype=torch.int32, device=x.device).random_()
    bits = noise.bitwise_and_(0xFFFF).add_(x.view(torch.int32)).bitwise_and_(-(1 << 16))
    rounded = bits.view(torch.float32).to(torch.bfloat16)  # exact: the 16 low bits are zero
    # a nan whose payload has its high bits set could carry into the sign: keep every nan
    return rounded.masked_fill_(x.isnan(), float("nan"))
