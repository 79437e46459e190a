"""Argument and input checks shared by heads, samplers and metrics.

Every check raises ``ValueError`` (``IndexError`` for class ids) whose message names the argument
and the offending value, so that bad input never turns into a silently wrong number.

The checks of tensor *values* (:func:`check_finite`, :func:`check_class_ids`) read a result back
from the device for eager CPU tensors. Where a host sync would stall a device or break a graph
(:func:`sync_free`: under ``torch.compile``, and for CUDA tensors) they are ``torch._assert_async``
calls instead: bad input then raises ``RuntimeError`` with a message naming the argument,
without the offending value (on CUDA at the next sync, as a device-side assertion).
"""

from __future__ import annotations

import math
from numbers import Integral

import torch
from torch import Tensor


def sync_free(x: Tensor) -> bool:
    """Whether checks and shapes that depend on ``x``'s values must not read them back to the
    host: under ``torch.compile`` (no graph break) and for CUDA tensors (no stalled stream).
    Eager CPU tensors get the checks that name the offending value."""
    return torch.compiler.is_compiling() or x.is_cuda


def check_async(condition: Tensor, message: str, error: type[Exception] = ValueError) -> None:
    """Raises ``error(message)`` unless the bool scalar ``condition`` holds: at once for eager
    CPU tensors, through ``torch._assert_async`` (``RuntimeError``, no host sync) where
    :func:`sync_free`."""
    if sync_free(condition):
        torch._assert_async(condition, message)
    elif not bool(condition):
        raise error(message)


def is_integer(value: object) -> bool:
    """Whether ``value`` is an integer (``int`` or a NumPy integer), not a ``bool``: a float such as
    ``-1.0``, a string or a tensor is not, so that nothing is silently truncated or parsed."""
    return isinstance(value, Integral) and not isinstance(value, bool)


def check_int(name: str, value: int) -> int:
    """``int(value)`` if :func:`is_integer`, else ``ValueError`` naming ``name`` and the value."""
    if not is_integer(value):
        raise ValueError(f"{name} must be an int, got {value!r}")
    return int(value)


def check_positive_int(name: str, value: int) -> int:
    """``int(value)`` if it is an integer >= 1 (:func:`is_integer`), else ``ValueError`` naming
    ``name`` and the value."""
    if not is_integer(value) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def check_label_smoothing(value: float) -> float:
    """``float(value)`` if it is a number in ``[0, 1)``, else ``ValueError`` naming it (NaN
    included), as ``F.cross_entropy`` refuses it."""
    bad = isinstance(value, bool) or not isinstance(value, (int, float))
    if bad or not 0.0 <= value < 1.0:
        raise ValueError(f"label_smoothing must be a number in [0, 1), got {value!r}")
    return float(value)


def check_finite_number(
    name: str, value: float, *, minimum: float | None = None, strict: bool = False
) -> float:
    """``float(value)`` if it is a finite real number, at least ``minimum`` if given (strictly
    above it when ``strict``); else ``ValueError`` naming ``name`` and the value."""
    bad = (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or (minimum is not None and (value < minimum or (strict and value == minimum)))
    )
    if bad:
        bound = "" if minimum is None else (f" > {minimum:g}" if strict else f" >= {minimum:g}")
        raise ValueError(f"{name} must be a finite number{bound}, got {value!r}")
    return float(value)


def check_padding_idx(padding_idx: int | None, num_classes: int) -> int | None:
    """``None``, or ``int(padding_idx)`` if it is a class id in ``[0, num_classes)``."""
    if padding_idx is None:
        return None
    if not is_integer(padding_idx):
        raise ValueError(f"padding_idx must be an int or None, got {padding_idx!r}")
    if not 0 <= padding_idx < num_classes:
        raise ValueError(f"padding_idx must be in [0, {num_classes}), got {padding_idx}")
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2 when padding_idx is set, got {num_classes}")
    return int(padding_idx)


def check_finite(name: str, x: Tensor) -> None:
    """Raises ``ValueError`` if ``x`` holds NaN or infinite entries (eager CPU; where
    :func:`sync_free`, ``torch._assert_async``: ``RuntimeError``)."""
    if not x.is_floating_point():
        return
    if sync_free(x):
        torch._assert_async(torch.isfinite(x).all(), f"{name} contains NaN or inf values")
    elif not bool(torch.isfinite(x).all()):
        bad = "NaN" if bool(torch.isnan(x).any()) else "inf"
        raise ValueError(f"{name} contains {bad} values (shape {tuple(x.shape)})")


def check_class_ids(
    name: str,
    ids: Tensor,
    num_classes: int,
    *,
    ignore_index: int | None = None,
    padding_idx: int | None = None,
) -> None:
    """Checks that ``ids`` is an integer tensor of ids in ``[0, num_classes)``.

    Entries equal to ``ignore_index`` are allowed; entries equal to ``padding_idx`` are not (the
    padding class is never a valid target: mark such positions with ``ignore_index``).

    Raises:
        ValueError: if ``ids`` is not an integer tensor.
        IndexError: if an id is out of range or is the padding class (eager CPU; where
            :func:`sync_free`, ``torch._assert_async``: ``RuntimeError``).
    """
    if ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8):
        raise ValueError(f"{name} must be an integer tensor, got dtype {ids.dtype}")
    extra = "" if ignore_index is None else f" (or ignore_index={ignore_index})"
    if sync_free(ids):
        ok = (ids >= 0) & (ids < num_classes)
        if padding_idx is not None:
            ok = ok & (ids != padding_idx)
        if ignore_index is not None:
            ok = ok | (ids == ignore_index)
        padding = "" if padding_idx is None else f", other than padding_idx={padding_idx}"
        torch._assert_async(ok.all(), f"{name} must be in [0, {num_classes}){extra}{padding}")
        return
    valid = ids if ignore_index is None else ids[ids != ignore_index]
    if valid.numel() == 0:
        return
    lo, hi = int(valid.min()), int(valid.max())
    if lo < 0 or hi >= num_classes:
        bad = lo if lo < 0 else hi
        raise IndexError(f"{name} must be in [0, {num_classes}){extra}, got {bad}")
    if padding_idx is not None and bool((valid == padding_idx).any()):
        raise IndexError(
            f"{name} contains padding_idx={padding_idx}, which is never predicted; "
            f"mark padded positions with ignore_index instead"
        )
