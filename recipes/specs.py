"""Building heads and samplers from ``{"class_path": ..., "init_args": {...}}`` specs.

A YAML config cannot hold what a head needs from the model and the data (``num_classes``, the
tied class table, the training counts of a unigram proposal), so the model keeps the head and
sampler as small specs and builds them here, injecting those arguments. A ``class_path`` is a bare
class name from :mod:`lightning_sampled.heads` / :mod:`lightning_sampled.samplers` or a dotted
import path.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from lightning_sampled import heads, samplers
from lightning_sampled.heads import OutputHead
from lightning_sampled.samplers import Sampler

_SAMPLER_ARGS = ("sampler", "presampler")


def resolve_class(class_path: str, namespace: Any, base: type) -> type:
    """The class named ``class_path`` (bare name in ``namespace``, or ``module.Class``).

    Raises:
        ValueError: if it cannot be found or is not a subclass of ``base``.
    """
    if not isinstance(class_path, str) or not class_path:
        raise ValueError(f"class_path must be a non-empty string, got {class_path!r}")
    module_name, _, name = class_path.rpartition(".")
    try:
        owner = importlib.import_module(module_name) if module_name else namespace
    except ImportError as err:
        raise ValueError(f"unknown {base.__name__} {class_path!r}: {err}") from None
    cls = getattr(owner, name, None)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        known = sorted(
            n
            for n in getattr(namespace, "__all__", [])
            if n != base.__name__ and issubclass(getattr(namespace, n), base)
        )
        raise ValueError(
            f"unknown {base.__name__} {class_path!r}; use one of {known} or a dotted path to a "
            f"{base.__name__} subclass"
        )
    return cls


def _split(spec: Mapping[str, Any], what: str) -> tuple[str, dict[str, Any]]:
    """``(class_path, init_args)`` of a spec. Keys beside ``class_path`` and ``init_args`` are
    init args too, and win over ``init_args``: that is jsonargparse's flattened form, and what a
    command-line override such as ``--model.init_args.head.init_args.num_negatives=50`` produces
    for these mapping-typed arguments."""
    if callable(getattr(spec, "as_dict", None)):  # a jsonargparse Namespace (nested specs)
        spec = spec.as_dict()
    if not isinstance(spec, Mapping) or "class_path" not in spec:
        raise ValueError(
            f"{what} must be a mapping with a class_path (and init_args), got {spec!r}"
        )
    init_args = spec.get("init_args") or {}
    if not isinstance(init_args, Mapping):
        raise ValueError(f"{what} init_args must be a mapping, got {init_args!r}")
    flattened = {k: v for k, v in spec.items() if k not in ("class_path", "init_args")}
    return spec["class_path"], {**init_args, **flattened}


def _check_arguments(cls: type, kwargs: Mapping[str, Any], what: str) -> None:
    """A clear error for init args that ``cls`` does not take (typos, a head's argument given
    to another head)."""
    params = inspect.signature(cls).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    unknown = sorted(set(kwargs) - set(params))
    if unknown:
        raise ValueError(
            f"{what} {cls.__name__} has no argument {', '.join(map(repr, unknown))}; it takes "
            f"{', '.join(params)}"
        )


def build_sampler(
    spec: Mapping[str, Any],
    num_classes: int,
    dim: int,
    padding_idx: int | None,
    class_counts: Tensor | None,
) -> Sampler:
    """A sampler from its spec, given ``num_classes``, ``padding_idx``, the head's ``dim`` (for
    samplers taking one, e.g. learnable MIDX) and the ``[N]`` training counts of the data module
    (for samplers taking ``counts``, e.g. ``UnigramSampler``). A ``MixtureSampler``'s
    ``components`` are specs themselves, built the same way."""
    class_path, kwargs = _split(spec, "sampler")
    cls = resolve_class(class_path, samplers, Sampler)
    params = inspect.signature(cls).parameters
    if "components" in params and "components" in kwargs:  # MixtureSampler: nested specs
        kwargs["components"] = [
            build_sampler(part, num_classes, dim, padding_idx, class_counts)
            for part in kwargs["components"]
        ]
        _check_arguments(cls, kwargs, "sampler")
        return cls(**kwargs)
    if "counts" in params and kwargs.get("counts") is None:
        if class_counts is None:
            raise ValueError(f"{cls.__name__} needs class_counts from the data module")
        kwargs["counts"] = class_counts
    if "dim" in params:
        kwargs.setdefault("dim", dim)
    if "num_classes" in params:
        kwargs["num_classes"] = num_classes
    kwargs["padding_idx"] = padding_idx
    _check_arguments(cls, kwargs, "sampler")
    return cls(**kwargs)


def build_head(
    spec: Mapping[str, Any],
    num_classes: int,
    dim: int,
    *,
    weight: nn.Parameter | None = None,
    padding_idx: int | None = None,
    sampler: Sampler | None = None,
) -> OutputHead:
    """A head from its spec with ``num_classes``, ``dim``, the tied ``weight`` and ``padding_idx``
    injected; ``sampler`` is passed as the head's ``sampler`` (or TAPAS' ``presampler``).

    Raises:
        ValueError: unknown head, or a sampler given to a head that takes none.
    """
    class_path, kwargs = _split(spec, "head")
    cls = resolve_class(class_path, heads, OutputHead)
    if sampler is not None:
        names = [n for n in _SAMPLER_ARGS if n in inspect.signature(cls).parameters]
        if not names:
            raise ValueError(f"{cls.__name__} takes no sampler; remove the sampler from the config")
        kwargs[names[0]] = sampler
    _check_arguments(cls, kwargs, "head")
    return cls(num_classes, dim, weight=weight, padding_idx=padding_idx, **kwargs)
