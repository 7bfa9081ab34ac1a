"""The engine's name for :mod:`peg_core.dist`, the torch.distributed helpers (no-ops in one process).

They live outside the engine so that models and losses can reduce across processes without loading
the command line; this module keeps the engine's import path for its callers.
"""

from __future__ import annotations

from ..dist import (
    DistInfo,
    all_gather_object,
    barrier,
    cleanup_distributed,
    get_rank,
    get_world_size,
    init_distributed,
    is_main_process,
    reduce_mean,
    reduce_sum,
    sample_seed,
    seed_everything,
    seeded,
)

__all__ = [
    "DistInfo",
    "all_gather_object",
    "barrier",
    "cleanup_distributed",
    "get_rank",
    "get_world_size",
    "init_distributed",
    "is_main_process",
    "reduce_mean",
    "reduce_sum",
    "sample_seed",
    "seed_everything",
    "seeded",
]
