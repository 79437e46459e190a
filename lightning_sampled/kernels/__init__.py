"""Triton kernels, each with a plain-torch reference beside it."""

from .codeword_logits import (
    BACKENDS,
    CodewordLogits,
    codeword_logits,
    codeword_logits_reference,
    codeword_logits_triton,
)

__all__ = [
    "BACKENDS",
    "CodewordLogits",
    "codeword_logits",
    "codeword_logits_reference",
    "codeword_logits_triton",
]
