"""Heads: the objectives; each owns (or ties) the class table and turns ``(z, target)`` into a
loss."""

from .base import OutputHead
from .cane import CaneHead
from .full import FullSoftmaxHead
from .ove import OneVsEachHead
from .proposal import ProposalHead
from .sampled import SampledSoftmaxHead
from .tapas import TapasHead, TapasSelection

__all__ = ["FullSoftmaxHead", "OutputHead", "ProposalHead", "SampledSoftmaxHead"]
__all__ += ["CaneHead", "OneVsEachHead", "TapasHead", "TapasSelection"]
