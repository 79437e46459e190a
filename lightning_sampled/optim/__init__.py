"""Optimizers for modules whose class table receives row-sparse gradients.

:class:`LazyAdam` is one optimizer for a whole LightningModule: Adam for dense gradients, the
lazy ``SparseAdam`` update for sparse ones. :func:`clip_grad_norm_` and :func:`clip_grad_value_`
clip gradients that include sparse ones; :class:`SparseGradientClipping`, mixed into a
LightningModule, makes the Trainer's ``gradient_clip_val`` use them. :func:`grow_state_rows`
extends an optimizer's state to the new rows of a grown class table.
"""

from .clipping import SparseGradientClipping, clip_grad_norm_, clip_grad_value_
from .growth import grow_state_rows
from .lazy_adam import LazyAdam

__all__ = [
    "LazyAdam",
    "SparseGradientClipping",
    "clip_grad_norm_",
    "clip_grad_value_",
    "grow_state_rows",
]
