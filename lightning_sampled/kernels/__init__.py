"""Triton kernels, each with a plain-torch reference beside it."""
