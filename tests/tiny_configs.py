"""The recipe head configs (:mod:`recipes.registry`) built at the tests' tiny sizes, shared by
``tests/recipes/test_registry.py`` and the head contract's coverage check (importable:
``tests`` is on the pytest ``pythonpath``)."""

from __future__ import annotations

from typing import Any

from lightning_sampled.heads import OutputHead
from recipes.registry import entry

#: the largest value a tiny head takes of each size option its config sets (a config's smaller
#: value, e.g. ``in_batch``'s ``num_negatives: 0``, is kept)
TINY_HEAD = {
    "num_negatives": 6,
    "num_candidates": 4,
    "num_noise": 6,
    "beam": 4,
    "branching": 4,
    "num_subsets": 3,
}
TINY_SAMPLER = {"codebook_size": 4}


def shrunk(factory: Any, sizes: dict[str, int]) -> dict[str, int]:
    """``sizes`` capped by the factory's values, for the options its config sets."""
    keywords = getattr(factory, "keywords", {})
    return {k: min(v, keywords[k]) for k, v in sizes.items() if k in keywords}


def tiny_head(name: str, num_classes: int, dim: int, **options: Any) -> OutputHead:
    """The head of config ``name`` over ``num_classes`` classes of width ``dim``, its sizes
    capped by :data:`TINY_HEAD` / :data:`TINY_SAMPLER` and ``options`` added (``weight``,
    ``padding_idx``, ``class_counts``, any head option)."""
    config = entry(name)
    return config.head(
        num_classes,
        dim,
        sampler_options=shrunk(config.sampler_factory, TINY_SAMPLER),
        **{**shrunk(config.head_factory, TINY_HEAD), **options},
    )


def synthetic_cli(config: str, head: str, tmp_path: Any, sizes: dict[str, int], *extra: str):
    """``recipes/configs/<config>`` with ``heads/<head>.yaml``, its synthetic data shrunk to
    ``sizes`` (inputs of 10 items, cached under ``tmp_path``), two training steps and a
    validation (``fast_dev_run``), built but not run."""
    from pathlib import Path

    from recipes.cli import main

    configs = Path(__file__).parents[1] / "recipes" / "configs"
    return main(
        [
            f"--config={configs / config}",
            f"--config={configs / 'heads' / f'{head}.yaml'}",
            *(f"--data.init_args.{k}={v}" for k, v in sizes.items()),
            "--data.init_args.max_len=10",
            f"--data.init_args.cache_dir={tmp_path / 'cache'}",
            "--trainer.fast_dev_run=2",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            f"--trainer.default_root_dir={tmp_path}",
            *extra,
        ],
        run=False,
    )
