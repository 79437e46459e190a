"""lightning_sampled: sampled-softmax heads, samplers and exact evaluation for PyTorch Lightning."""

from .heads import FullSoftmaxHead, OutputHead, SampledSoftmaxHead
from .samplers import LogUniformSampler, Sample, Sampler, UniformSampler, UnigramSampler

__version__ = "0.1.0"

__all__ = [
    "FullSoftmaxHead",
    "LogUniformSampler",
    "OutputHead",
    "Sample",
    "SampledSoftmaxHead",
    "Sampler",
    "UniformSampler",
    "UnigramSampler",
]
