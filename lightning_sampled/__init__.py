"""lightning_sampled: sampled-softmax heads, samplers and exact evaluation for PyTorch Lightning.

Everything lives in its subpackage and is imported from there: ``lightning_sampled.heads``,
``samplers``, ``index``, ``callbacks``, ``metrics``, ``optim``, ``inference`` and ``kernels``
(one import path per class, which is also the ``class_path`` a LightningCLI config prints).
"""

__version__ = "0.1.0"
