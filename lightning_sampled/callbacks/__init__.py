"""Callbacks: when indexes are rebuilt, temperatures annealed, diagnostics logged and sparse
gradients reduced, or class tables split, across ranks."""

from .diagnostics import SamplerDiagnostics
from .index_refresh import IndexRefresh
from .rng import RNGCheckpoint
from .sharded_tables import ShardedTables
from .sparse_grad_sync import SparseGradSync
from .temperature import TemperatureSchedule

__all__ = ["TemperatureSchedule"]
__all__ += ["IndexRefresh", "SamplerDiagnostics"]
__all__ += ["RNGCheckpoint", "ShardedTables", "SparseGradSync"]
