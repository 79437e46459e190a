"""Offline data modules whose preprocessed splits are cached as Hugging Face ``datasets``."""

from .base import RecipeData
from .gcide import GCIDE
from .movielens import MovieLens
from .ptb import PennTreebank
from .synthetic import SyntheticSequences

__all__ = ["GCIDE", "MovieLens", "PennTreebank", "RecipeData", "SyntheticSequences"]
