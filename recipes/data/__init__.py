"""Offline data modules whose preprocessed splits are cached as Hugging Face ``datasets``."""

from .base import RecipeData
from .movielens import MovieLens
from .ptb import PennTreebank

__all__ = ["MovieLens", "PennTreebank", "RecipeData"]
