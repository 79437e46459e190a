"""Offline data modules whose preprocessed splits are cached as Hugging Face ``datasets``."""

from .base import RecipeData
from .gcide import GCIDE
from .gcide_bpe import GCIDEBPE
from .movielens import MovieLens
from .ptb import PennTreebank
from .synthetic import SyntheticSequences

__all__ = ["GCIDE", "GCIDEBPE", "MovieLens", "PennTreebank", "RecipeData", "SyntheticSequences"]
