"""Inference-time approximations of the exact head methods."""

from .adaptive_reference import ExactTopK, adaptive_success, exact_topk_softmax
from .adaptive_softmax import AdaptiveResult, AdaptiveSoftmax
from .calibration import CalibrationResult

__all__ = [
    "AdaptiveResult",
    "AdaptiveSoftmax",
    "CalibrationResult",
    "ExactTopK",
    "adaptive_success",
    "exact_topk_softmax",
]
