"""Atomic, resumable checkpoints.

A checkpoint is written to a temporary file in the same folder, flushed to
disk and renamed over the target, so a run killed while saving leaves the
previous checkpoint intact.  Loading keeps ``torch.load(weights_only=True)``:
only tensors, plain containers and numbers are read back, which is why the RNG
states are stored as tensors and lists rather than pickled objects.
"""

from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path
from typing import Any

import torch

__all__ = ["atomic_save", "capture_rng_state", "load_checkpoint", "restore_rng_state", "save_training_state"]


def atomic_save(obj: Any, path: str | os.PathLike, keep_previous: str | os.PathLike | None = None) -> Path:
    """``torch.save`` to ``path`` through a temporary file and an atomic rename.

    With ``keep_previous``, an existing ``path`` is renamed to it once the new file is
    fully written (a kill at any moment leaves at least one complete file).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        if keep_previous is not None and path.exists():
            os.replace(path, keep_previous)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def capture_rng_state() -> dict[str, Any]:
    """RNG states of python, numpy and torch (CPU and CUDA) in a ``weights_only``-safe form."""
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    py = random.getstate()
    state["python"] = [py[0], list(py[1]), py[2]]
    try:
        import numpy as np

        kind, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = [kind, torch.from_numpy(keys.astype("int64")), pos, has_gauss, cached]
    except ImportError:  # pragma: no cover
        pass
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of :func:`capture_rng_state`."""
    torch.set_rng_state(state["torch"])
    if "python" in state:
        v, s, g = state["python"]
        random.setstate((v, tuple(s), g))
    if "numpy" in state:
        import numpy as np

        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype("uint32"), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_training_state(path: str | os.PathLike, **state: Any) -> Path:
    """Atomically save a training state (model, optimizer, scheduler, epoch, ...) plus the RNG states."""
    state.setdefault("rng", capture_rng_state())
    return atomic_save(state, path)


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """``torch.load(path, weights_only=True)`` with an error that names the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:
        raise RuntimeError(f"could not load checkpoint {path}: {e}") from e
