"""Callbacks: when indexes are rebuilt, temperatures annealed and diagnostics logged."""

from .diagnostics import SamplerDiagnostics
from .index_refresh import IndexRefresh
from .rng import RNGCheckpoint
from .temperature import TemperatureSchedule

__all__ = ["TemperatureSchedule"]
__all__ += ["IndexRefresh", "SamplerDiagnostics"]
__all__ += ["RNGCheckpoint"]
