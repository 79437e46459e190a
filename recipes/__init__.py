"""Recipes: LightningCLI entry point, data modules, SASRec / GRU4Rec / LSTM LM / GPT, YAML configs.

Run ``python -m recipes fit --config recipes/configs/sasrec_ml-100k.yaml --config
recipes/configs/heads/midx_rq.yaml`` (a model config, then a head config).
"""

import os

# Offline unless the user says otherwise; set before ``datasets`` and ``wandb`` are imported.
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")

import importlib

#: the public names and the submodule that holds each: imported on first use (PEP 562), so that
#: ``recipes.models`` and ``recipes.memory`` import where Hugging Face ``datasets``, which only the
#: data modules need, is missing (the GPU machine of scripts/gpu_check.sh)
_SUBMODULE = {
    "GCIDE": ".data",
    "GCIDEBPE": ".data",
    "MovieLens": ".data",
    "PennTreebank": ".data",
    "RecipeData": ".data",
    "SyntheticSequences": ".data",
    "GPTLanguageModel": ".models",
    "GRU4Rec": ".models",
    "LSTMLanguageModel": ".models",
    "SASRec": ".models",
    "LanguageModel": ".module",
    "SampledModule": ".module",
    "SequentialRecommender": ".module",
}
__all__ = sorted(_SUBMODULE)


def __getattr__(name: str):
    if name not in _SUBMODULE:
        raise AttributeError(f"module 'recipes' has no attribute {name!r}")
    return getattr(importlib.import_module(_SUBMODULE[name], __name__), name)
