"""Shared test setup.

Triton has no CPU backend: kernels run under its interpreter, which must be switched on before any
kernel module is imported.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
