"""Exact full-ranking metrics and perplexity as torchmetrics Metrics with sum states."""

from .evaluate import RANKING_METRICS, evaluate_ranking, evaluation_sampler
from .perplexity import Perplexity
from .ranking import MAP, MRR, NDCG, Precision, RankingMetric, Recall, ranking_hits

__all__ = [
    "MAP",
    "MRR",
    "NDCG",
    "RANKING_METRICS",
    "Perplexity",
    "Precision",
    "RankingMetric",
    "Recall",
    "evaluate_ranking",
    "evaluation_sampler",
    "ranking_hits",
]
