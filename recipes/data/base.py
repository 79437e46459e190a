"""``RecipeData``: what every recipe data module gives the model, and the Arrow cache."""

from __future__ import annotations

import hashlib
import importlib.util
import os
from collections.abc import Callable
from pathlib import Path

import lightning as L
from datasets import DatasetDict, load_from_disk

CACHE_ENV = "LIGHTNING_SAMPLED_CACHE"


def default_cache_dir() -> Path:
    """``$LIGHTNING_SAMPLED_CACHE`` or ``~/.cache/lightning_sampled/recipes``."""
    root = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "lightning_sampled" / "recipes"
    return Path(root)


def package_file(package: str, relative: str, install: str) -> Path:
    """A data file shipped inside an installed package.

    Raises:
        FileNotFoundError: naming the pip command that installs the package.
    """
    spec = importlib.util.find_spec(package)
    path = None
    if spec is not None and spec.origin is not None:
        path = Path(spec.origin).parent / relative
    if path is None or not path.is_file():
        raise FileNotFoundError(
            f"{relative} not found: it comes from the {package!r} package; install it with "
            f"`{install}` (make setup does this)"
        )
    return path


def file_digest(path: Path) -> str:
    """The first 12 hex digits of the file's SHA-1 (names the cache entry of a source file)."""
    return hashlib.sha1(path.read_bytes()).hexdigest()[:12]


def cached(path: Path, build: Callable[[], DatasetDict]) -> DatasetDict:
    """Loads the Arrow ``DatasetDict`` saved at ``path``, building and saving it on a miss."""
    if (path / "dataset_dict.json").is_file():
        return load_from_disk(str(path))
    splits = build()
    splits.save_to_disk(str(path))
    return splits


class RecipeData(L.LightningDataModule):
    """Base of the recipe data modules. ``num_classes`` and ``class_counts`` are available right
    after construction (the CLI links them into the model), so subclasses load their cached splits
    in ``__init__``.
    """

    @property
    def num_classes(self) -> int:
        """``N``, the number of classes the head scores (padding included)."""
        raise NotImplementedError

    @property
    def class_counts(self) -> list[int]:
        """``[N]`` class counts in the training split (for unigram proposals)."""
        raise NotImplementedError
