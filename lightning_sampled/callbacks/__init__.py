"""Callbacks: when indexes are rebuilt, temperatures annealed and diagnostics logged."""
