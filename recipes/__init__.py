"""Recipes: a LightningCLI entry point, data modules, SASRec / GRU4Rec / LSTM LM and YAML configs.

Run ``python -m recipes fit --config recipes/configs/sasrec_ml-100k.yaml --config
recipes/configs/heads/midx_rq.yaml`` (a model config, then a head config).
"""

import os

# Offline unless the user says otherwise; set before ``datasets`` and ``wandb`` are imported.
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")

from .data import GCIDE, MovieLens, PennTreebank, RecipeData, SyntheticSequences
from .models import GRU4Rec, LSTMLanguageModel, SASRec
from .module import LanguageModel, SampledModule, SequentialRecommender

__all__ = [
    "GCIDE",
    "GRU4Rec",
    "LSTMLanguageModel",
    "LanguageModel",
    "MovieLens",
    "PennTreebank",
    "RecipeData",
    "SASRec",
    "SampledModule",
    "SequentialRecommender",
    "SyntheticSequences",
]
