"""Exact full-ranking metrics and perplexity as torchmetrics Metrics with sum states."""
