"""lightning_sampled: sampled-softmax heads, samplers and exact evaluation for PyTorch Lightning.

Heads, samplers, callbacks, metrics and inference live in their subpackages; the heads and
samplers are re-exported here.
"""

from .heads import (
    FullSoftmaxHead,
    OneVsEachHead,
    OutputHead,
    SampledSoftmaxHead,
    TapasHead,
)
from .samplers import (
    LogUniformSampler,
    MIDXSampler,
    Sample,
    Sampler,
    UniformSampler,
    UnigramSampler,
)

__version__ = "0.1.0"

__all__ = [
    "FullSoftmaxHead",
    "LogUniformSampler",
    "MIDXSampler",
    "OneVsEachHead",
    "OutputHead",
    "Sample",
    "SampledSoftmaxHead",
    "Sampler",
    "TapasHead",
    "UniformSampler",
    "UnigramSampler",
]
