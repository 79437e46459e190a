"""Heads: the objectives. Each owns (or ties) the class table and turns ``(z, target)`` into a loss."""

from .base import OutputHead
from .full import FullSoftmaxHead
from .sampled import SampledSoftmaxHead

__all__ = ["FullSoftmaxHead", "OutputHead", "SampledSoftmaxHead"]
