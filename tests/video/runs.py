"""Shared pieces of the video command tests: the tiny model's flags and small synthetic sets."""

from pathlib import Path

from peg_video.data import SyntheticSpec, make_synthetic_kinetics

#: a 1-block, 32-wide video transformer on 4-frame clips of 32 px: a CPU epoch takes about a second
TINY = [
    "--config", "synthetic_tiny", "--num-frames", "4", "--stride", "2", "--batch-size", "4",
    "--model-opt", "embed_dim=32", "--model-opt", "depth=1", "--num-heads", "2",
    "--num-clips", "2", "--no-progress", "--workers", "0",
]  # fmt: skip


def synthetic_set(root: Path, num_train: int, num_val: int, frames: int = 12, seed: int = 0) -> Path:
    """A moving-shapes set of 64x48 videos under ``root`` (see ``python -m peg_video make-data``)."""
    spec = SyntheticSpec(num_train=num_train, num_val=num_val, width=64, height=48, frames=frames, seed=seed)
    make_synthetic_kinetics(root, spec)
    return root
