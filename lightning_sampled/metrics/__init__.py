"""Exact full-ranking metrics, beyond-accuracy metrics of recommended lists (coverage, popularity,
Gini, entropy, long-tail share) and perplexity, as torchmetrics Metrics with sum states; the
sampled-metrics protocol of papers that rank among sampled items, labelled as such."""

from .beyond_accuracy import (
    AveragePopularity,
    GiniIndex,
    ItemCoverage,
    ShannonEntropy,
    TailPercentage,
    recommended_ids,
    tail_classes,
)
from .evaluate import RANKING_METRICS, evaluate_ranking, evaluation_sampler
from .perplexity import Perplexity
from .ranking import MAP, MRR, NDCG, Hit, Precision, RankingMetric, Recall, ranking_hits
from .sampled_ranking import evaluate_sampled_ranking, sampled_candidates_topk

__all__ = [
    "MAP",
    "MRR",
    "NDCG",
    "RANKING_METRICS",
    "AveragePopularity",
    "GiniIndex",
    "Hit",
    "ItemCoverage",
    "Perplexity",
    "Precision",
    "RankingMetric",
    "Recall",
    "ShannonEntropy",
    "TailPercentage",
    "evaluate_ranking",
    "evaluate_sampled_ranking",
    "evaluation_sampler",
    "ranking_hits",
    "recommended_ids",
    "sampled_candidates_topk",
    "tail_classes",
]
