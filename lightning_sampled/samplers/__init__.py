"""Proposals ``q(i | z)``: draw negatives and report their normalised log-probabilities."""

from .._random import DrawStream
from .base import Sample, Sampler
from .midx import MIDXSampler
from .mixture import MixtureSampler
from .static import LogUniformSampler, UniformSampler, UnigramSampler

__all__ = ["LogUniformSampler", "Sample", "Sampler", "UniformSampler", "UnigramSampler"]
__all__ += ["DrawStream", "MIDXSampler", "MixtureSampler"]
