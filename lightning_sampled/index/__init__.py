"""Index structures that samplers and heads search: k-means, PQ / RQ codebooks, class trees."""

from .cells import Cells, build_cells, cell_of
from .kmeans import check_norms, kmeans, nearest_centroid
from .quantizers import ProductQuantizer, Quantizer, ResidualQuantizer, make_quantizer

__all__ = [
    "Cells",
    "ProductQuantizer",
    "Quantizer",
    "ResidualQuantizer",
    "build_cells",
    "check_norms",
    "cell_of",
    "kmeans",
    "make_quantizer",
    "nearest_centroid",
]
