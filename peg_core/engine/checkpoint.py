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
the newest is unreadable.  Files are read with ``torch.load(weights_only=True)``:
a file that needs full unpickling is refused, never executed.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..utils.checkpoint import atomic_save, capture_rng_state, restore_rng_state
from .errors import UserError

__all__ = [
    "CHECKPOINT_FORMAT",
    "CHECKPOINT_KEYS",
    "CHECKPOINT_NAME",
    "PREVIOUS_NAME",
    "CheckpointStore",
    "load_model_state",
    "read_checkpoint",
    "read_state_file",
    "remove_stale_temp_files",
]

CHECKPOINT_FORMAT = "peg-checkpoint/1"
CHECKPOINT_NAME = "checkpoint.pth"
PREVIOUS_NAME = "checkpoint_prev.pth"
CHECKPOINT_KEYS = (
    "format", "task", "model", "model_config", "meta", "optimizer", "scheduler", "scaler",
    "epoch", "step", "args", "metrics", "rng_per_rank",
)  # fmt: skip


def read_state_file(path: str | os.PathLike, what: str = "checkpoint") -> Any:
    """``torch.load(path, weights_only=True)`` on CPU; every failure is a one-line :class:`UserError`.

    Missing, empty, truncated and non-torch files are named as such; a file that holds
    arbitrary pickled objects is refused (it is never unpickled).
    """
    path = Path(path)
    if not path.exists():
        raise UserError(f"{what} not found", path)
    if not path.is_file():
        raise UserError(f"{what} is not a file", path)
    if not os.access(path, os.R_OK):
        raise UserError(f"{what} is not readable (permissions)", path)
    if path.stat().st_size == 0:
        raise UserError(f"{what} is empty (0 bytes)", path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        # torch's message suggests weights_only=False, which would run the file's code: never say that.
        # Every weights-only failure mentions weights_only; a refused class or function names a GLOBAL,
        # garbage bytes give e.g. "Unsupported operand 110".
        if "GLOBAL" in str(e):
            raise UserError(
                f"{what} refused: it holds pickled objects other than tensors and plain containers "
                "(loaded with weights_only=True; nothing in it was executed)",
                path,
            ) from e
        detail = re.search(r"WeightsUnpickler error: *([^\n]+)", str(e))
        reason = detail.group(1)[:120] if detail else "not a pickle"
        raise UserError(f"{what} is truncated or not a torch file ({reason})", path) from e
    except (EOFError, zipfile.BadZipFile) as e:
        raise UserError(f"{what} is truncated or corrupt ({type(e).__name__})", path) from e
    except RuntimeError as e:
        first = str(e).split("\n")[0][:160]
        raise UserError(f"{what} is truncated or not a torch file ({first})", path) from e
    except Exception as e:  # the unpickler fails in many ways on garbage bytes; all mean "not a torch file"
        raise UserError(f"{what} is truncated or not a torch file ({type(e).__name__})", path) from e


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


def load_model_state(model: torch.nn.Module, state: Mapping[str, Any], source: str | os.PathLike) -> None:
    """``model.load_state_dict(state)`` (strict) with a one-line :class:`UserError` on a mismatch."""
    if not isinstance(state, Mapping):
        raise UserError("checkpoint's model entry is not a state dict", source)
    mine = model.state_dict()
    missing = sorted(set(mine) - set(state))
    unexpected = sorted(set(state) - set(mine))
    wrong = sorted(
        k for k in set(mine) & set(state)
        if not isinstance(state[k], torch.Tensor) or tuple(state[k].shape) != tuple(mine[k].shape)
    )  # fmt: skip
    if missing or unexpected or wrong:
        parts = []
        for name, keys in (("missing", missing), ("unexpected", unexpected), ("shape mismatch", wrong)):
            if keys:
                parts.append(f"{len(keys)} {name} (e.g. {keys[0]})")
        raise UserError(f"checkpoint does not fit the model: {', '.join(parts)}", source)
    model.load_state_dict(state)


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

    def save(self, state: Mapping[str, Any], keep_copy: str | None = None) -> Path:
        """Write ``state`` (must hold the :data:`CHECKPOINT_KEYS`) as the newest checkpoint."""
        missing = [k for k in CHECKPOINT_KEYS if k not in state]
        if missing:
            raise KeyError(f"checkpoint state lacks {missing}")
        # The new file is complete and fsynced before the old one becomes checkpoint_prev.pth.
        atomic_save(dict(state), self.path, keep_previous=self.previous)
        if keep_copy:
            atomic_save(dict(state), self.out_dir / keep_copy)
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


def rng_state_all_ranks() -> dict[str, Any]:
    """This rank's RNG state (gathered over ranks by the engine)."""
    return capture_rng_state()


def restore_rank_rng(ckpt: Mapping[str, Any], rank: int, world_size: int) -> bool:
    """Restore this rank's RNG from ``ckpt``; False when the world size changed (not restored)."""
    per_rank = ckpt.get("rng_per_rank") or []
    if len(per_rank) != world_size:
        return False
    restore_rng_state(per_rank[rank])
    return True
