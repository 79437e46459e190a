"""Speed, memory and quality studies; results are written under ``benchmarks/results/``."""
