"""Torch-only training utilities shared by peg_video and peg_detr.

Distributed helpers, atomic/resumable checkpoints with RNG state, and a
metrics logger (JSON lines, optional TensorBoard).  Nothing here imports more
than torch at module level; tqdm and tensorboard are used when installed.
"""

from .amp import autocast_context
from .checkpoint import (
    atomic_save,
    capture_rng_state,
    load_checkpoint,
    restore_rng_state,
    save_training_state,
)
from .distributed import (
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
    seed_everything,
)
from .logging import MetricLogger, check_finite, progress

__all__ = [
    "DistInfo",
    "MetricLogger",
    "all_gather_object",
    "atomic_save",
    "autocast_context",
    "barrier",
    "capture_rng_state",
    "check_finite",
    "cleanup_distributed",
    "get_rank",
    "get_world_size",
    "init_distributed",
    "is_main_process",
    "load_checkpoint",
    "progress",
    "reduce_mean",
    "reduce_sum",
    "restore_rng_state",
    "save_training_state",
    "seed_everything",
]
