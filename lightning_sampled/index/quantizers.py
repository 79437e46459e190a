"""Two-codebook quantisers of the inverted multi-index (MIDX paper, Section 4.1).

A class embedding ``q`` ``[D]`` gets two codes ``(k1, k2)`` in ``[0, K)^2``:

- :class:`ProductQuantizer` splits ``q = [q^1, q^2]`` into halves (``D`` must be even) and clusters
  each half on its own; the reconstruction is the concatenation ``[c1[k1], c2[k2]]``.
- :class:`ResidualQuantizer` clusters ``q`` into ``c1`` and then the residuals ``q - c1[k1]`` into
  ``c2``; both codebooks live in ``R^D`` and the reconstruction is the sum ``c1[k1] + c2[k2]``.

Queries are split the same way (:meth:`Quantizer.query_parts`), so that
``z . reconstruction = z1 . c1[k1] + z2 . c2[k2]``. Codes are nearest codewords (the quantiser
function ``f_q`` of Section 4.1); :meth:`Quantizer.soft_decode` is the differentiable encoder of
MIDX-Learn (Section 6.2.3), where codeword weights are ``softmax(q . c)``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch
from torch import Tensor

from .kmeans import Points, kmeans, nearest_centroid, reseed_empty

_ROW_CHUNK = 1 << 18


class Quantizer(ABC):
    """Two codebooks of ``codebook_size`` codewords; stateless (codebooks are passed in).

    Codebooks are one tensor ``[2, K, D']``: ``D' = D / 2`` for PQ and ``D`` for RQ.
    """

    name: str

    def __init__(self, codebook_size: int) -> None:
        self.codebook_size = codebook_size

    @abstractmethod
    def codeword_dim(self, dim: int) -> int:
        """``D'``, the size of a codeword for embeddings of size ``dim``."""

    def check_dim(self, dim: int) -> None:  # noqa: B027 (optional hook: RQ takes any size)
        """Raises ``ValueError`` if embeddings of size ``dim`` cannot be quantised."""

    @abstractmethod
    def query_parts(self, z: Tensor) -> tuple[Tensor, Tensor]:
        """The parts ``(z1 [..., D'], z2 [..., D'])`` of queries ``z`` ``[..., D]`` that score the
        first and second codebooks."""

    def fit(
        self, x: Tensor, *, init: Tensor | None = None, niter: int = 25, seed: int = 0
    ) -> tuple[Tensor, Tensor]:
        """Learns codebooks by k-means (codebook ``j`` with seed ``seed + j``).

        Args:
            x: ``[n, D]`` class embeddings (``n >= K``).
            init: ``[2, K, D']`` previous codebooks for a warm start, or ``None``.
            niter: k-means iterations per codebook.
            seed: k-means seed.

        Returns:
            ``(codebooks [2, K, D'], codes [n, 2])``.
        """
        return self._by_codebook(
            x,
            lambda points, j: kmeans(
                points, self.codebook_size, init=_part(init, j), niter=niter, seed=seed + j
            ),
        )

    def reassign(self, x: Tensor, codebooks: Tensor) -> tuple[Tensor, Tensor]:
        """Codes of ``x`` ``[n, D]`` under given codebooks, with dead codewords re-seeded.

        Codebook by codebook, every row takes its nearest codeword; a codeword that no row takes
        is moved onto the row that its codebook represents worst
        (:func:`~lightning_sampled.index.kmeans.reseed_empty`), so that learned codebooks
        (MIDX-Learn) do not collapse onto fewer codewords. No Lloyd iteration moves the others.

        Returns:
            ``(codebooks [2, K, D'], codes [n, 2])``; ``codebooks`` is a new tensor.
        """
        codebooks = codebooks.detach().float()
        return self._by_codebook(
            x,
            lambda points, j: reseed_empty(
                points, codebooks[j].clone(), nearest_centroid(points, codebooks[j])
            ),
        )

    @abstractmethod
    def _by_codebook(
        self, x: Tensor, cluster: Callable[[Tensor | Points, int], tuple[Tensor, Tensor]]
    ) -> tuple[Tensor, Tensor]:
        """Builds both codebooks with ``cluster(points [n, D'], j) -> (codebook [K, D'],
        assignment [n])`` on the points that codebook ``j`` quantises (a table, or
        :class:`~lightning_sampled.index.kmeans.Points` for residuals).

        Returns:
            ``(codebooks [2, K, D'], codes [n, 2])``.
        """

    @abstractmethod
    def decode(self, codes: Tensor, codebooks: Tensor) -> Tensor:
        """Reconstructions ``[n, D]`` of codes ``[n, 2]``."""

    @abstractmethod
    def _encode_rows(self, x: Tensor, codebooks: Tensor) -> Tensor:
        """Nearest-codeword codes ``[n, 2]`` of a chunk of rows ``[n, D]``."""

    @abstractmethod
    def soft_decode(self, x: Tensor, codebooks: Tensor) -> Tensor:
        """Differentiable (in ``codebooks``) soft reconstructions ``[n, D]`` of ``x`` ``[n, D]``."""

    def encode(self, x: Tensor, codebooks: Tensor) -> Tensor:
        """Nearest-codeword codes ``[n, 2]`` of ``x`` ``[n, D]``, in row chunks."""
        parts = [
            self._encode_rows(x[start : start + _ROW_CHUNK], codebooks)
            for start in range(0, x.shape[0], _ROW_CHUNK)
        ]
        return torch.cat(parts)

    def squared_error(self, x: Tensor, codes: Tensor, codebooks: Tensor) -> Tensor:
        """Mean over rows of ``||x - decode(codes)||^2`` (fp64 scalar), in row chunks."""
        total = torch.zeros((), dtype=torch.float64, device=x.device)
        for start in range(0, x.shape[0], _ROW_CHUNK):
            rows = x[start : start + _ROW_CHUNK].float()
            residual = rows - self.decode(codes[start : start + _ROW_CHUNK], codebooks)
            total += (residual * residual).sum(dtype=torch.float64)
        return total / max(x.shape[0], 1)


class ProductQuantizer(Quantizer):
    """Product quantisation: each half of the embedding has its own codebook (``D`` even)."""

    name = "pq"

    def codeword_dim(self, dim: int) -> int:
        return dim // 2

    def check_dim(self, dim: int) -> None:
        if dim % 2:
            raise ValueError(
                f"product quantisation splits embeddings into two halves: the embedding size "
                f"must be even, got {dim} (use quantizer='rq' for odd sizes)"
            )

    def query_parts(self, z: Tensor) -> tuple[Tensor, Tensor]:
        half = z.shape[-1] // 2
        return z[..., :half], z[..., half:]

    def _by_codebook(self, x, cluster):
        x1, x2 = self.query_parts(x)
        c1, a1 = cluster(x1, 0)
        c2, a2 = cluster(x2, 1)
        return torch.stack([c1, c2]), torch.stack([a1, a2], dim=1)

    def decode(self, codes: Tensor, codebooks: Tensor) -> Tensor:
        return torch.cat(
            [codebooks[0].index_select(0, codes[:, 0]), codebooks[1].index_select(0, codes[:, 1])],
            dim=-1,
        )

    def _encode_rows(self, x: Tensor, codebooks: Tensor) -> Tensor:
        x1, x2 = self.query_parts(x)
        return torch.stack(
            [nearest_centroid(x1, codebooks[0]), nearest_centroid(x2, codebooks[1])], dim=1
        )

    def soft_decode(self, x: Tensor, codebooks: Tensor) -> Tensor:
        x1, x2 = self.query_parts(x)
        return torch.cat([_soft_codeword(x1, codebooks[0]), _soft_codeword(x2, codebooks[1])], -1)


class ResidualQuantizer(Quantizer):
    """Residual quantisation: the second codebook quantises what the first leaves."""

    name = "rq"

    def codeword_dim(self, dim: int) -> int:
        return dim

    def query_parts(self, z: Tensor) -> tuple[Tensor, Tensor]:
        return z, z

    def _by_codebook(self, x, cluster):
        c1, a1 = cluster(x, 0)
        c2, a2 = cluster(Points(x, c1, a1), 1)  # the residuals x - c1[a1], chunk by chunk
        return torch.stack([c1, c2]), torch.stack([a1, a2], dim=1)

    def decode(self, codes: Tensor, codebooks: Tensor) -> Tensor:
        return codebooks[0].index_select(0, codes[:, 0]) + codebooks[1].index_select(0, codes[:, 1])

    def _encode_rows(self, x: Tensor, codebooks: Tensor) -> Tensor:
        a1 = nearest_centroid(x, codebooks[0])
        a2 = nearest_centroid(x.float() - codebooks[0].index_select(0, a1), codebooks[1])
        return torch.stack([a1, a2], dim=1)

    def soft_decode(self, x: Tensor, codebooks: Tensor) -> Tensor:
        first = _soft_codeword(x, codebooks[0])
        return first + _soft_codeword(x.float() - first, codebooks[1])


def make_quantizer(name: str, codebook_size: int) -> Quantizer:
    """The quantiser called ``name`` (``"pq"`` or ``"rq"``) with ``codebook_size`` codewords."""
    kinds = {cls.name: cls for cls in (ProductQuantizer, ResidualQuantizer)}
    if name not in kinds:
        raise ValueError(f"quantizer must be one of {sorted(kinds)}, got {name!r}")
    return kinds[name](codebook_size)


def _soft_codeword(x: Tensor, codebook: Tensor) -> Tensor:
    """``softmax(x c^T) c``: the weighted codeword of each row (MIDX-Learn's encoder)."""
    return torch.softmax(x.float() @ codebook.T, dim=-1) @ codebook


def _part(codebooks: Tensor | None, index: int) -> Tensor | None:
    return None if codebooks is None else codebooks[index]
