"""Heads and samplers by dependency injection: the config names the class, the model builds it.

A YAML config cannot hold what a head needs from the model and the data (``num_classes``, the
tied class table, the training counts of a unigram proposal), so the model's ``head`` and
``sampler`` arguments are *factories*: typed with the protocols :class:`HeadFactory` and
:class:`SamplerFactory`, they take a ``class_path`` (a subclass of
:class:`~lightning_sampled.heads.OutputHead` / :class:`~lightning_sampled.samplers.Sampler`) and
the ``init_args`` of that class *except* the parameters the protocol names. jsonargparse (under
LightningCLI) checks those init args at parse time, documents them in ``--help`` and writes them
in ``--print_config``; it hands the model a callable that the model calls with the injected
arguments (:func:`build_head`, :func:`build_sampler`). ``padding_idx`` is given once, by the
model, to both the head and its sampler. In Python any class (or ``functools.partial`` of one)
is a factory: ``SequentialRecommender(..., head=partial(SampledSoftmaxHead, num_negatives=20))``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from torch import Tensor, nn

from lightning_sampled.heads import OutputHead, ProposalHead
from lightning_sampled.samplers import MixtureSampler, Sampler


class HeadFactory(Protocol):
    """A head class (or partial) called as ``factory(num_classes, dim, weight=, padding_idx=[,
    sampler=][, class_counts=])`` (the last two where the class takes them); a config gives every
    other argument."""

    def __call__(
        self,
        num_classes: int,
        dim: int,
        /,
        *,
        weight: nn.Parameter | None,
        padding_idx: int | None,
        sampler: Sampler | None,
        class_counts: Tensor | None,
    ) -> OutputHead: ...


class SamplerFactory(Protocol):
    """A sampler class (or partial) called with those of ``num_classes``, ``padding_idx``,
    ``dim`` and ``counts`` that the class takes; a config gives every other argument."""

    def __call__(
        self,
        *,
        num_classes: int,
        padding_idx: int | None,
        dim: int,
        counts: Tensor,
    ) -> Sampler: ...


def factory_class(factory: Callable) -> type:
    """The class a factory instantiates: the factory itself, or the class inside a
    ``functools.partial`` (jsonargparse's factories are ``partial(instantiator, cls, **args)``).

    Raises:
        ValueError: if ``factory`` names no class.
    """
    if isinstance(factory, type):
        return factory
    if isinstance(factory, functools.partial):
        for part in (factory.func, *factory.args):
            if isinstance(part, type):
                return part
    raise ValueError(f"a head or sampler must be a class or a partial of one, got {factory!r}")


def factory_option(factory: Callable, name: str, default: Any = None) -> Any:
    """The value a factory passes for its class's argument ``name`` (a ``functools.partial``'s
    keyword, as a config's ``init_args`` give it), else ``default``."""
    if isinstance(factory, functools.partial):
        return factory.keywords.get(name, default)
    return default


def build_sampler(
    factory: SamplerFactory,
    num_classes: int,
    dim: int,
    padding_idx: int | None,
    class_counts: Tensor | None,
) -> Sampler:
    """A sampler from its factory, given those of ``num_classes``, ``padding_idx``, the head's
    ``dim`` (learnable MIDX) and the data module's ``[N]`` training counts (``UnigramSampler``'s
    ``counts``) that its class takes.

    Raises:
        ValueError: the class takes ``counts`` and the data module gave none.
    """
    cls = factory_class(factory)
    params = inspect.signature(cls).parameters
    counts = params.get("counts")
    if counts is not None and counts.default is inspect.Parameter.empty and class_counts is None:
        raise ValueError(f"{cls.__name__} needs class_counts from the data module")
    injected = {
        "num_classes": num_classes,
        "padding_idx": padding_idx,
        "dim": dim,
        "counts": class_counts,
    }
    return factory(**{name: value for name, value in injected.items() if name in params})


def build_head(
    factory: HeadFactory,
    num_classes: int,
    dim: int,
    *,
    weight: nn.Parameter | None = None,
    padding_idx: int | None = None,
    sampler: Sampler | None = None,
    class_counts: Tensor | None = None,
    **options: Any,
) -> OutputHead:
    """A head from its factory with ``num_classes``, ``dim``, the tied ``weight``,
    ``padding_idx`` and any other keyword ``options`` injected; ``sampler`` goes to the head's
    ``sampler`` (every :class:`~lightning_sampled.heads.ProposalHead` takes one), the data
    module's ``[N]`` training ``class_counts`` to a head class that takes them (CANE's frequency
    tree).

    Raises:
        ValueError: a sampler given to a head that takes none.
    """
    kwargs = {"weight": weight, "padding_idx": padding_idx, **options}
    if sampler is not None:
        cls = factory_class(factory)
        if not issubclass(cls, ProposalHead):
            raise ValueError(f"{cls.__name__} takes no sampler; remove the sampler from the config")
        kwargs["sampler"] = sampler
    if "class_counts" in inspect.signature(factory_class(factory)).parameters:
        kwargs["class_counts"] = class_counts
    return factory(num_classes, dim, **kwargs)


class SamplerMixture(MixtureSampler):
    """:class:`~lightning_sampled.samplers.MixtureSampler` whose components are sampler
    factories, each built with the injected arguments it takes: the form a config can give.

    Args:
        components: two or more sampler factories (``class_path`` and ``init_args``).
        weights: the share of the draws of each component, as in ``MixtureSampler``.
        num_classes, padding_idx, dim, counts: injected by the model (see :func:`build_sampler`).
    """

    def __init__(
        self,
        components: Sequence[SamplerFactory],
        weights: Sequence[float] | None = None,
        *,
        num_classes: int,
        padding_idx: int | None = None,
        dim: int | None = None,
        counts: Tensor | None = None,
    ) -> None:
        super().__init__(
            [build_sampler(part, num_classes, dim, padding_idx, counts) for part in components],
            weights,
        )
