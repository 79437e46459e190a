"""Optimizers for modules whose class table receives row-sparse gradients.

:class:`LazyAdam` is one optimizer for a whole LightningModule: Adam for dense gradients, the
lazy ``SparseAdam`` update for sparse ones. :func:`clip_grad_norm_` clips norms that include
sparse gradients.
"""

from .lazy_adam import LazyAdam, clip_grad_norm_

__all__ = ["LazyAdam", "clip_grad_norm_"]
