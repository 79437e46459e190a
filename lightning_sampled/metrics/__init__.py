"""Exact full-ranking metrics, beyond-accuracy metrics of recommended lists (coverage, popularity,
Gini) and perplexity, as torchmetrics Metrics with sum states."""

from .beyond_accuracy import AveragePopularity, GiniIndex, ItemCoverage, recommended_ids
from .evaluate import RANKING_METRICS, evaluate_ranking, evaluation_sampler
from .perplexity import Perplexity
from .ranking import MAP, MRR, NDCG, Precision, RankingMetric, Recall, ranking_hits

__all__ = [
    "MAP",
    "MRR",
    "NDCG",
    "RANKING_METRICS",
    "AveragePopularity",
    "GiniIndex",
    "ItemCoverage",
    "Perplexity",
    "Precision",
    "RankingMetric",
    "Recall",
    "evaluate_ranking",
    "evaluation_sampler",
    "ranking_hits",
    "recommended_ids",
]
