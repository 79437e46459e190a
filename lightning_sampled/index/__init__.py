"""Index structures that samplers and heads search: k-means, PQ / RQ codebooks, class trees."""

from .cells import Cells, build_cells, cell_of
from .kmeans import check_norms, kmeans, nearest_centroid
from .quantizers import ProductQuantizer, Quantizer, ResidualQuantizer, make_quantizer
from .tree import (
    ClassTree,
    beam_search,
    fit_node_vectors,
    frequency_subsets,
    whole_level_start,
)

__all__ = [
    "Cells",
    "ClassTree",
    "ProductQuantizer",
    "Quantizer",
    "ResidualQuantizer",
    "beam_search",
    "build_cells",
    "check_norms",
    "cell_of",
    "fit_node_vectors",
    "frequency_subsets",
    "kmeans",
    "make_quantizer",
    "nearest_centroid",
    "whole_level_start",
]
