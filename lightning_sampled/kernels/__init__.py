"""Triton kernels, each with a plain-torch reference beside it."""

from .codeword_logits import (
    CodewordLogits,
    codeword_logits,
    codeword_logits_reference,
    codeword_logits_triton,
)

__all__ = [
    "CodewordLogits",
    "codeword_logits",
    "codeword_logits_reference",
    "codeword_logits_triton",
]
