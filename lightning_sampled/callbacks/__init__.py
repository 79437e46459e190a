"""Callbacks: when indexes are rebuilt, temperatures annealed, diagnostics and the exact training
loss logged and sparse gradients reduced, or class tables split, across ranks."""

from .diagnostics import SamplerDiagnostics
from .exact_loss import ExactTrainingLoss
from .index_refresh import IndexRefresh
from .rng import RNGCheckpoint
from .sharded_tables import ShardedTables
from .sparse_grad_sync import SparseGradSync
from .temperature import TemperatureSchedule

__all__ = ["TemperatureSchedule"]
__all__ += ["ExactTrainingLoss", "IndexRefresh", "SamplerDiagnostics"]
__all__ += ["RNGCheckpoint", "ShardedTables", "SparseGradSync"]
