"""Inference-time approximations of the exact head methods."""
