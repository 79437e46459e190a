"""Inference-time approximations of the exact head methods."""

from .adaptive_reference import ExactTopK, adaptive_success, exact_topk_softmax
from .adaptive_softmax import AdaptiveResult, AdaptiveSoftmax
from .calibration import CalibrationResult
from .faiss_export import class_table_index, export_head, faiss_queries, faiss_topk

__all__ = [
    "AdaptiveResult",
    "AdaptiveSoftmax",
    "CalibrationResult",
    "ExactTopK",
    "adaptive_success",
    "class_table_index",
    "exact_topk_softmax",
    "export_head",
    "faiss_queries",
    "faiss_topk",
]
