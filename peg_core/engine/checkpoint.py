"""Training checkpoints: one file name, one layout, atomic writes, resume with fall-back.

Layout (the same top-level keys for every task)::

    {"format": "peg-checkpoint/1", "task": "detect" | "video" | "classify",
     "model": state_dict, "model_config": {...},      # rebuilds the model (eval, predict)
     "meta": {...},                                   # classes / categories / sizes of the task
     "optimizer": ..., "scheduler": ..., "scaler": ...,
     "epoch": last finished epoch (0-based), "step": optimizer steps so far,
     "args": the run's arguments, "metrics": last evaluation,
     "rng_per_rank": [RNG state of every rank]}

``OUTPUT_DIR/checkpoint.pth`` is the newest; before it is replaced the previous
one becomes ``checkpoint_prev.pth``, so ``--resume auto`` can fall back to it when
the newest is unreadable.  Files are read and written by :mod:`peg_core.interop.io`
(``torch.load(weights_only=True)``: a file that needs full unpickling is refused, never
executed); this module is the command line's side of it and raises :class:`UserError`.
The RNG states are stored as tensors and lists so that ``weights_only`` reads them back.
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..interop import io
from ..interop.io import WeightsError, atomic_save
from .command import UserError

__all__ = [
    "BEST_NAME",
    "CHECKPOINT_FORMAT",
    "CHECKPOINT_KEYS",
    "CHECKPOINT_NAME",
    "PREVIOUS_NAME",
    "CheckpointStore",
    "LoadedModel",
    "atomic_save",
    "capture_rng_state",
    "load_model_state",
    "read_checkpoint",
    "read_state_file",
    "remove_stale_temp_files",
    "restore_rng_state",
]

CHECKPOINT_FORMAT = "peg-checkpoint/1"
CHECKPOINT_NAME = "checkpoint.pth"
PREVIOUS_NAME = "checkpoint_prev.pth"
#: the best evaluation's checkpoint of a run with ``--early-stopping-patience``, beside the last
BEST_NAME = "checkpoint_best.pth"
CHECKPOINT_KEYS = (
    "format", "task", "model", "model_config", "meta", "optimizer", "scheduler", "scaler",
    "epoch", "step", "args", "metrics", "rng_per_rank",
)  # fmt: skip


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


def read_state_file(path: str | os.PathLike, what: str = "checkpoint") -> Any:
    """:func:`peg_core.interop.read_state_file` on CPU, at the command line's boundary.

    The bytes are read by the one reader of :mod:`peg_core.interop.io`; its
    :class:`~peg_core.interop.WeightsError` (missing, empty, truncated, refused, ...) becomes a
    one-line :class:`UserError` with the same ``what`` and ``where``.
    """
    try:
        return io.read_state_file(path, what=what)
    except WeightsError as e:
        raise UserError(e.what, e.where) from e


def read_checkpoint(path: str | os.PathLike, task: str | None = None) -> dict[str, Any]:
    """Read a training checkpoint and check that it is one, written for ``task``.

    Raises :class:`UserError` naming the file when it is unreadable (see :func:`read_state_file`),
    not a peg training checkpoint (e.g. a bare state dict or a timm file), or one of another task.
    """
    ckpt = read_state_file(path)
    if not isinstance(ckpt, Mapping) or "model" not in ckpt or "task" not in ckpt:
        keys = sorted(ckpt)[:6] if isinstance(ckpt, Mapping) else type(ckpt).__name__
        raise UserError(f"not a peg training checkpoint (no 'task'/'model' keys; it holds {keys})", path)
    if task is not None and ckpt["task"] != task:
        raise UserError(
            f"wrong model: checkpoint is for task {ckpt['task']!r}, this command needs {task!r}", path
        )
    return dict(ckpt)


def load_model_state(
    model: torch.nn.Module, state: Mapping[str, Any], source: str | os.PathLike
) -> io.LoadReport:
    """``model.load_state_dict(state)`` (strict) with a one-line :class:`UserError` on a mismatch.

    The check and the returned :class:`~peg_core.interop.io.LoadReport` are
    :func:`peg_core.interop.io.load_state_strict`'s; only the error type changes here.
    """
    try:
        return io.load_state_strict(model, state, source)
    except WeightsError as e:
        raise UserError(e.what, e.where) from e


def remove_stale_temp_files(folder: str | os.PathLike) -> list[Path]:
    """Delete ``.checkpoint*.tmp`` files that a run killed while saving left behind; return them."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    stale = sorted(folder.glob(".checkpoint*.tmp"))
    for f in stale:
        with contextlib.suppress(OSError):
            f.unlink()
    return stale


class CheckpointStore:
    """The checkpoints of one output folder.

    ``save`` writes ``checkpoint.pth`` atomically and keeps the one it replaces as
    ``checkpoint_prev.pth``; ``find_resume`` reads the newest readable one.
    """

    def __init__(self, out_dir: str | os.PathLike, task: str) -> None:
        self.out_dir = Path(out_dir)
        self.task = task
        self.path = self.out_dir / CHECKPOINT_NAME
        self.previous = self.out_dir / PREVIOUS_NAME

    def save(self, state: Mapping[str, Any], keep_copy: str | None = None, best: bool = False) -> Path:
        """Write ``state`` (must hold the :data:`CHECKPOINT_KEYS`) as the newest checkpoint.

        ``keep_copy``: also keep it under this name; ``best``: also as :data:`BEST_NAME`.
        """
        missing = [k for k in CHECKPOINT_KEYS if k not in state]
        if missing:
            raise KeyError(f"checkpoint state lacks {missing}")
        # The new file is complete and fsynced before the old one becomes checkpoint_prev.pth.
        atomic_save(dict(state), self.path, keep_previous=self.previous)
        if keep_copy:
            atomic_save(dict(state), self.out_dir / keep_copy)
        if best:
            atomic_save(dict(state), self.out_dir / BEST_NAME)
        return self.path

    def find_resume(self, log=print) -> tuple[dict[str, Any] | None, Path | None]:
        """The newest readable checkpoint of the folder and its path (``(None, None)`` when there is none).

        An unreadable newest file is reported through ``log`` and the previous one is tried.
        All files unreadable is a :class:`UserError`.
        """
        candidates = [p for p in (self.path, self.previous) if p.is_file()]
        errors = []
        for p in candidates:
            try:
                ckpt = read_checkpoint(p, self.task)
            except UserError as e:
                errors.append(e)
                log(f"warning: {e.what}: {p}; trying the previous checkpoint")
                continue
            if errors:
                log(f"resuming from the previous checkpoint {p} (epoch {ckpt.get('epoch')})")
            return ckpt, p
        if errors:
            raise UserError(
                f"no readable checkpoint for --resume auto ({len(errors)} unreadable)", self.out_dir
            )
        return None, None


def restore_rank_rng(ckpt: Mapping[str, Any], rank: int, world_size: int) -> bool:
    """Restore this rank's RNG from ``ckpt``; False when the world size changed (not restored)."""
    per_rank = ckpt.get("rng_per_rank") or []
    if len(per_rank) != world_size:
        return False
    restore_rng_state(per_rank[rank])
    return True


@dataclass(frozen=True)
class LoadedModel:
    """A model rebuilt from a training checkpoint, with what the run recorded about it.

    Every task package returns this from ``model.load_model(checkpoint, where=None, **overrides)``
    (``peg_core.classify.model``, ``peg_detr.model``, ``peg_video.model``), so a tool or a
    ``Predictor`` loads any task the same way.
    """

    model: nn.Module  # with the checkpoint's weights, on the CPU
    config: dict[str, Any]  # the builder keywords it was made from (overrides included)
    classes: list[str]  # class names, in the head's order
    meta: dict[str, Any] = field(default_factory=dict)  # the checkpoint's ``meta`` (data sizes, ...)
    args: dict[str, Any] = field(default_factory=dict)  # the training run's arguments (today's names)
    postprocess: nn.Module | None = None  # task-specific output decoding (DETR's boxes); None: logits


def checkpoint_and_where(
    checkpoint: str | os.PathLike | Mapping[str, Any], where: str | os.PathLike | None, task: str
) -> tuple[Mapping[str, Any], str | os.PathLike]:
    """A task's checkpoint given as a path (read with :func:`read_checkpoint`) or already read.

    Returns the checkpoint dict and what messages name it by: the path, or ``where`` (default
    ``"checkpoint"``) for a dict.  The ``load_model`` of every task package starts here.
    """
    if isinstance(checkpoint, Mapping):
        return checkpoint, where if where is not None else "checkpoint"
    return read_checkpoint(checkpoint, task=task), checkpoint
