"""The heads and samplers of the library by the names of their recipe configs.

Every YAML under ``recipes/configs/heads/`` is one :class:`Entry`, keyed by its file stem
(``uniform``, ``mixed``, ``ove``, ``tapas``, ``sparse_midx_rq_mixed``, ...): the YAML stays the
one place its options are written. Its ``model.init_args.head`` and ``model.init_args.sampler``
(``class_path`` and ``init_args``) become the factories the recipes' command line gives the model
(:mod:`recipes.specs`), which :meth:`Entry.head` builds through
:func:`recipes.specs.build_head` and :func:`recipes.specs.build_sampler` with ``num_classes``,
``dim`` and overrides (``num_negatives=6`` for a test, the benchmark's own sizes);
``trainer.callbacks+`` is kept as :attr:`Entry.callbacks`. :data:`LABELS` gives every entry its
readable name for tables and plots: a YAML without a label is an error
(``tests/recipes/test_registry.py``). It reads the YAML with PyYAML alone, not jsonargparse,
which the benchmarks run on a GPU machine do without.

Users: the recipes' tests (``tests/recipes``), the head contract's coverage check
(``tests/heads/test_contract.py``), ``benchmarks/head_step.py``, ``benchmarks/sampler_time.py``
and the report's labels (``benchmarks/report/common.py``).
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from torch import Tensor, nn

from lightning_sampled.heads import OutputHead
from lightning_sampled.samplers import Sampler

from .specs import build_head, build_sampler

#: the folder of the head configs, one :class:`Entry` per YAML in it
HEAD_CONFIGS = Path(__file__).parent / "configs" / "heads"

#: config stem -> readable label (reports, plots); one per YAML in :data:`HEAD_CONFIGS`
LABELS = {
    "full": "full softmax",
    "uniform": "uniform",
    "unigram": "unigram",
    "log_uniform": "log-uniform",
    "in_batch": "in-batch",
    "mixed": "mixed: in-batch + uniform",
    "midx_pq": "MIDX-pq",
    "midx_rq": "MIDX-rq",
    "midx_learn": "MIDX-learn",
    "tapas": "TAPAS",
    "ove": "One-vs-Each",
    "cane": "CANE",
    "cane_frequency": "CANE, frequency tree (Section 5)",
    "sparse_uniform": "uniform, 20 negatives, row-sparse",
    "sparse_log_uniform": "log-uniform, 20 negatives, row-sparse",
    "sparse_midx_pq": "MIDX-pq, 20 negatives, row-sparse",
    "sparse_midx_rq": "MIDX-rq, 20 negatives, row-sparse",
    "sparse_midx_rq_log_uniform": "MIDX-rq + log-uniform",
    "sparse_midx_rq_mixed": "default: MIDX-rq + in-batch, row-sparse",
}


@dataclass(frozen=True)
class Entry:
    """One head config: its factories as the recipes' command line builds them.

    Attributes:
        name: the config's file stem (``recipes/configs/heads/<name>.yaml``).
        label: its readable name (:data:`LABELS`).
        head_factory: the head class with the config's ``init_args`` (a ``functools.partial``).
        sampler_factory: the sampler class with its ``init_args``, or ``None`` where the
            config gives none (the head's default proposal, or no sampler at all).
        callbacks: the ``trainer.callbacks+`` specs the config adds (``class_path`` and
            ``init_args``, as written), e.g. ``IndexRefresh`` for an index.
    """

    name: str
    label: str
    head_factory: functools.partial
    sampler_factory: functools.partial | None
    callbacks: tuple[dict[str, Any], ...] = field(default=())

    def sampler(
        self,
        num_classes: int,
        dim: int,
        *,
        padding_idx: int | None = None,
        class_counts: Tensor | None = None,
        **options: Any,
    ) -> Sampler | None:
        """The config's sampler over ``num_classes`` classes (``None`` where it gives none),
        with ``options`` replacing its ``init_args`` (e.g. ``codebook_size=8``) and the
        arguments :func:`~recipes.specs.build_sampler` injects (``dim``, ``padding_idx``,
        ``[N]`` training ``class_counts`` for a unigram proposal). A MIDX index is empty until
        the head's ``refresh_index()``."""
        if self.sampler_factory is None:
            return None
        factory = functools.partial(self.sampler_factory, **options)
        return build_sampler(factory, num_classes, dim, padding_idx, class_counts)

    def head(
        self,
        num_classes: int,
        dim: int,
        *,
        weight: nn.Parameter | None = None,
        padding_idx: int | None = None,
        class_counts: Tensor | None = None,
        sampler_options: dict[str, Any] | None = None,
        **options: Any,
    ) -> OutputHead:
        """The config's head over ``num_classes`` classes of width ``dim`` with its sampler
        (:meth:`sampler` with ``sampler_options``), built by :func:`~recipes.specs.build_head`:
        ``options`` replace or add to the head's ``init_args`` (``num_negatives=6``,
        ``sparse_grad=True``, ``shared_negatives=True``), ``weight`` ties the class table,
        ``class_counts`` reach the sampler and a head that takes them (CANE's frequency tree)."""
        sampler = self.sampler(
            num_classes,
            dim,
            padding_idx=padding_idx,
            class_counts=class_counts,
            **(sampler_options or {}),
        )
        return build_head(
            self.head_factory,
            num_classes,
            dim,
            weight=weight,
            padding_idx=padding_idx,
            sampler=sampler,
            class_counts=class_counts,
            **options,
        )


def factory(spec: dict[str, Any]) -> functools.partial:
    """The factory a ``{class_path, init_args}`` spec stands for, as the recipes' command line
    hands it to the model: the class with its ``init_args`` bound (a nested spec, such as a
    mixture's ``components``, made a factory too)."""
    module, _, name = spec["class_path"].rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    return functools.partial(cls, **{k: _made(v) for k, v in spec.get("init_args", {}).items()})


def _made(value: Any) -> Any:
    """``value`` with every spec in it (:func:`factory`), in lists too, made a factory."""
    if isinstance(value, dict) and "class_path" in value:
        return factory(value)
    if isinstance(value, list):
        return [_made(v) for v in value]
    return value


def parse(path: Path) -> Entry:
    """The :class:`Entry` of one head config.

    Raises:
        ValueError: the config's stem has no label in :data:`LABELS`, or it names no head.
    """
    if path.stem not in LABELS:
        raise ValueError(f"{path.name} has no label: add {path.stem!r} to recipes.registry.LABELS")
    config = yaml.safe_load(path.read_text())
    model = config.get("model", {}).get("init_args", {})
    if "head" not in model:
        raise ValueError(f"{path} names no head (model.init_args.head)")
    sampler = model.get("sampler")
    return Entry(
        path.stem,
        LABELS[path.stem],
        factory(model["head"]),
        None if sampler is None else factory(sampler),
        tuple(config.get("trainer", {}).get("callbacks+", [])),
    )


@functools.cache
def entries() -> dict[str, Entry]:
    """Every head config by name, in :data:`LABELS`' order (parsed once per process)."""
    parsed = {path.stem: parse(path) for path in HEAD_CONFIGS.glob("*.yaml")}
    return {name: parsed[name] for name in LABELS if name in parsed}


def entry(name: str) -> Entry:
    """The head config ``name``.

    Raises:
        ValueError: no config has that name; the message lists the known ones.
    """
    known = entries()
    if name not in known:
        raise ValueError(f"unknown head config {name!r}; known: {', '.join(known)}")
    return known[name]
