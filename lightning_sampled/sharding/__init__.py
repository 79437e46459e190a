"""Class tables split across the ranks of a process group.

:class:`ShardMap` says which rank holds which rows (strided: class ``c`` on rank ``c mod W``);
:mod:`.collectives` holds the differentiable gathers and reductions the sharded heads use, and
the agreement that makes one rank's bad input every rank's error (:class:`RankInputError`). The
heads themselves take ``sharded=True`` (:class:`~lightning_sampled.heads.OutputHead`).
"""

from .collectives import (
    RankInputError,
    combined_logsumexp,
    gather_rows,
    whole_rows,
    whole_rows_on_first_rank,
)
from .shard_map import ShardMap

__all__ = [
    "RankInputError",
    "ShardMap",
    "combined_logsumexp",
    "gather_rows",
    "whole_rows",
    "whole_rows_on_first_rank",
]
