"""The one reader and writer of weights files, and the one way to find the state dict inside them.

Every loader of the suite (checkpoint surgery, the timm registry, DETR backbone / official /
Hugging Face weights, the video model's 2D initialisation, the engine's training checkpoints)
reads files through :func:`read_state_file` and finds the tensors with
:func:`unwrap_state_dict` + :func:`strip_prefixes`:

* ``.pth`` / ``.pt`` / ``.bin`` / anything else: ``torch.load(weights_only=True)`` on the CPU.
  A file that needs full unpickling is refused, never executed.
* ``.safetensors``: ``safetensors.torch.load_file`` (safetensors is imported only then).

Errors: a file that cannot be used is a :class:`WeightsError` (a ``ValueError``) whose
``what`` says why (missing, empty, truncated, not in its format, refused pickle, no tensors)
and whose ``where`` names the file or key.  Only the command-line layer turns it into the
one-line ``error: <what>: <where>`` (the engine's :func:`~peg_core.engine.read_state_file`
and :func:`~peg_core.engine.run_command`); a missing ``safetensors`` package is a
:class:`~peg_core.errors.MissingDependency` (an ``InputError`` and an ``ImportError``) naming
the file and the extra: ``pip install 'peg-core[safetensors]'``.
"""

from __future__ import annotations

import os
import pickle
import re
import tempfile
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ..errors import InputError, require

if TYPE_CHECKING:  # classes.py builds LoadReports: the type only, for the annotation
    from .classes import ClassTransfer

__all__ = [
    "PREFIXES",
    "WEIGHTS_AS_TYPED",
    "WRAPPER_KEYS",
    "LoadReport",
    "WeightsError",
    "atomic_save",
    "load_state_strict",
    "locate_state_dict",
    "new_file_mode",
    "read_state_file",
    "strip_prefixes",
    "unwrap_state_dict",
    "write_state_file",
]

#: the parsed arguments' attribute ``{dest: text as typed}`` of the weights options that named remote
#: weights (``--init org/name@rev``): :func:`peg_core.interop.resolve.resolve_weights_arg` fills it,
#: :func:`peg_core.engine.cli.json_safe` records the text under ``dest`` and the path under ``dest_path``
WEIGHTS_AS_TYPED = "weights_as_typed"
#: entries a checkpoint keeps its state dict under, tried in this order (outermost first)
WRAPPER_KEYS = ("model", "state_dict", "model_state", "model_ema", "module")
#: key prefixes of wrapped models: DataParallel / DDP, ``torch.compile``
PREFIXES = ("module.", "_orig_mod.")

StateDict = dict[str, Any]


class WeightsError(InputError):
    """A weights file or state dict that cannot be used: ``what`` says why, ``where`` names the file or key."""


# ------------------------------------------------------------------------------------------ read


def _check_file(path: Path, what: str) -> None:
    """Missing, not a file, unreadable or empty: a :class:`WeightsError` naming ``path``."""
    if not path.exists():
        raise WeightsError(f"{what} not found", path)
    if not path.is_file():
        raise WeightsError(f"{what} is not a file", path)
    if not os.access(path, os.R_OK):
        raise WeightsError(f"{what} is not readable (permissions)", path)
    if path.stat().st_size == 0:
        raise WeightsError(f"{what} is empty (0 bytes)", path)


def _read_torch(path: Path, what: str, map_location: str | torch.device) -> Any:
    """``torch.load(path, weights_only=True)``; each way it fails is a :class:`WeightsError` saying which."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as e:
        # torch's message suggests weights_only=False, which would run the file's code: never say that.
        # A refused class or function names a GLOBAL; garbage bytes give e.g. "Unsupported operand 110".
        if "GLOBAL" in str(e):
            raise WeightsError(
                f"{what} refused: it holds pickled objects other than tensors and plain containers "
                "(loaded with weights_only=True; nothing in it was executed)",
                path,
            ) from e
        detail = re.search(r"WeightsUnpickler error:\s*([^\n]+)", str(e))  # the reason may start a new line
        reason = detail.group(1)[:120] if detail else "not a pickle"
        raise WeightsError(f"{what} is truncated or not a torch file ({reason})", path) from e
    except (EOFError, zipfile.BadZipFile) as e:
        raise WeightsError(f"{what} is truncated or corrupt ({type(e).__name__})", path) from e
    except RuntimeError as e:
        first = str(e).split("\n")[0][:160]
        raise WeightsError(f"{what} is truncated or not a torch file ({first})", path) from e
    except Exception as e:  # the unpickler fails in many ways on garbage bytes; all mean "not a torch file"
        raise WeightsError(f"{what} is truncated or not a torch file ({type(e).__name__})", path) from e


def _read_safetensors(path: Path, what: str, map_location: str | torch.device) -> dict[str, Tensor]:
    """``safetensors.torch.load_file``; a missing package is said first, a file it cannot parse is a :class:`WeightsError`."""
    require("safetensors.torch", "safetensors", what=f"reading {path}")
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    _check_file(path, what)
    try:
        return load_file(str(path), device=str(map_location))
    except (SafetensorError, OSError, ValueError) as e:
        first = " ".join(str(e).split())[:160]
        raise WeightsError(f"{what} is not a readable safetensors file ({first})", path) from None


def read_state_file(
    path: str | os.PathLike, what: str = "checkpoint", map_location: str | torch.device = "cpu"
) -> Any:
    """The object stored in a ``.safetensors`` file (a flat tensor dict) or a torch file (any container).

    Args:
        path: the file; ``.safetensors`` by its suffix, anything else is a torch file.
        what: how messages name the file, e.g. ``"backbone weights"``.
        map_location: device the tensors are loaded to.

    Raises:
        WeightsError: missing, not a file, unreadable, empty, truncated, not in its format, or (torch)
            holding pickled objects other than tensors and plain containers (refused, never run).
        MissingDependency: a ``.safetensors`` file without the ``safetensors`` package.
    """
    path = Path(path)
    if path.suffix == ".safetensors":
        return _read_safetensors(path, what, map_location)
    _check_file(path, what)
    return _read_torch(path, what, map_location)


# ---------------------------------------------------------------------------------------- unwrap


def locate_state_dict(
    obj: Any, keys: Sequence[str] = WRAPPER_KEYS, where: Any = None
) -> tuple[StateDict, Callable[[StateDict], Any]]:
    """The tensor dict inside a checkpoint, and a function that puts a new one back in its place.

    A mapping that holds any tensor is the state dict; otherwise the entries ``keys`` are
    searched in order (outermost first, recursively), e.g. ``{"model": sd, "args": ...}``.

    Raises:
        WeightsError: ``obj`` is not a mapping, or no mapping of tensors is found (names ``where``).
    """
    if not isinstance(obj, Mapping):
        raise WeightsError(
            f"weights must be a dict of tensors (or wrap one under {tuple(keys)}); got {type(obj).__name__}",
            where,
        )
    if any(isinstance(v, Tensor) for v in obj.values()):
        return dict(obj), lambda new: new
    for k in keys:
        if isinstance(obj.get(k), Mapping):
            inner, put = locate_state_dict(obj[k], keys, where)

            def rewrap(new: StateDict, k: str = k, put: Callable = put) -> Any:
                return {**obj, k: put(new)}

            return inner, rewrap
    raise WeightsError(
        f"no tensors found in the weights; top-level keys are {sorted(map(str, obj))[:20]} "
        f"(looked inside {tuple(keys)})",
        where,
    )


def unwrap_state_dict(obj: Any, keys: Sequence[str] = WRAPPER_KEYS, where: Any = None) -> StateDict:
    """The tensor dict inside ``obj`` (a copy of the mapping; see :func:`locate_state_dict`)."""
    return locate_state_dict(obj, keys, where)[0]


def strip_prefixes(state: Mapping[str, Any], prefixes: Sequence[str] = PREFIXES) -> StateDict:
    """Remove the wrapper prefixes (``module.``, ``_orig_mod.``) that every key of ``state`` carries.

    A prefix is removed, repeatedly and in any order, only while *every* key has it: a
    wrapper prefixes all keys, while a model may well own a submodule called ``module``.
    """
    out = dict(state)
    changed = True
    while out and changed:
        changed = False
        for prefix in prefixes:
            if all(isinstance(k, str) and k.startswith(prefix) for k in out):
                out = {k[len(prefix) :]: v for k, v in out.items()}
                changed = True
    return out


def load_state_strict(model: torch.nn.Module, state: Mapping[str, Any], where: Any = None) -> LoadReport:
    """``model.load_state_dict(state)`` (strict), or a one-line :class:`WeightsError` counting the mismatches.

    Nothing is loaded when a key is missing, unexpected or of another shape; the message
    gives the count of each and one example key, and names ``where`` (the file).  Returns the
    :class:`LoadReport` (every key copied).
    """
    if not isinstance(state, Mapping):
        raise WeightsError("checkpoint's model entry is not a state dict", where)
    mine = model.state_dict()
    missing = sorted(set(mine) - set(state))
    unexpected = sorted(set(state) - set(mine))
    wrong = sorted(
        k for k in set(mine) & set(state)
        if not isinstance(state[k], Tensor) or tuple(state[k].shape) != tuple(mine[k].shape)
    )  # fmt: skip
    if missing or unexpected or wrong:
        parts = []
        for name, keys in (("missing", missing), ("unexpected", unexpected), ("shape mismatch", wrong)):
            if keys:
                parts.append(f"{len(keys)} {name} (e.g. {keys[0]})")
        raise WeightsError(f"checkpoint does not fit the model: {', '.join(parts)}", where)
    model.load_state_dict(state)
    return LoadReport(source="" if where is None else str(where), copied=list(state))


# ----------------------------------------------------------------------------------------- write


def _umask() -> int:
    """The process's umask, read without changing it where the system says it (Linux: /proc).

    Elsewhere it is set and restored at once (``os.umask`` has no read-only form), which another
    thread creating a file at that instant could notice.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def new_file_mode() -> int:
    """The mode of a file the user creates: ``0o666`` less the umask (0644 under 022, 0664 under 002)."""
    return 0o666 & ~_umask()


def atomic_save(obj: Any, path: str | os.PathLike, keep_previous: str | os.PathLike | None = None) -> Path:
    """``torch.save`` to ``path`` through a temporary file and an atomic rename.

    A run killed while saving leaves the previous file intact.  With ``keep_previous``, an
    existing ``path`` is renamed to it once the new file is fully written (a kill at any
    moment leaves at least one complete file).  The file gets the mode of any new file under
    the user's umask (0644 under umask 022, 0664 under 002: readable by the group on a shared
    cluster: :func:`new_file_mode`), not ``tempfile.mkstemp``'s private 0600.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, new_file_mode())  # mkstemp's 0600 would hide it from the group
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


def write_state_file(
    obj: Any, path: str | os.PathLike, metadata: Mapping[str, str] | None = None
) -> list[str]:
    """Write ``obj`` in the format the suffix of ``path`` names; returns the entries that could not be kept.

    ``.safetensors`` holds a flat dict of tensors only: a wrapped checkpoint is written as its
    inner state dict and any non-tensor entries are left out (returned so the caller can say
    so); ``metadata`` goes into its header (e.g. ``{"format": "pt"}`` for transformers).
    Both formats are written through a temporary file and a rename.
    """
    path = Path(path)
    if path.suffix != ".safetensors":
        atomic_save(obj, path)
        return []
    require("safetensors.torch", "safetensors", what=f"writing {path}")
    from safetensors.torch import save_file

    sd = unwrap_state_dict(obj, where=path)
    dropped = [k for k, v in sd.items() if not isinstance(v, Tensor)]
    if not any(isinstance(v, Tensor) for v in obj.values()):
        dropped += [f"{k} (checkpoint entry outside the state dict)" for k in obj if k not in WRAPPER_KEYS]
    tensors, seen = {}, set()
    for k, v in sd.items():
        if isinstance(v, Tensor):
            # safetensors refuses tensors that share memory (tied weights): give each its own copy.
            ptr = v.untyped_storage().data_ptr()
            tensors[k] = v.contiguous().clone() if ptr in seen else v.contiguous()
            seen.add(ptr)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    save_file(tensors, str(tmp), metadata=dict(metadata) if metadata else None)
    os.chmod(tmp, new_file_mode())  # safetensors writes 0600
    os.replace(tmp, path)
    return dropped


# ---------------------------------------------------------------------------------------- report


@dataclass
class LoadReport:
    """What a loader did with a weights file, key by key (the one report of every loader).

    Attributes:
        source: the file (or ``""`` for an in-memory state dict).
        copied: model keys loaded unchanged.
        converted: model key -> how it was made (inflated, resized, folded, zero-initialised, ...).
        skipped: source key -> why it was not used.
        missing: model keys left at their initial values.
        args: settings stored with the weights (an official DETR file's ``args``, a Hugging
            Face ``config.json``), or ``None``.
        classes: which of the start's classes the model kept by name and which start fresh
            (:class:`~peg_core.interop.classes.ClassTransfer`), when the load changed the label set.
    """

    source: str = ""
    copied: list[str] = field(default_factory=list)
    converted: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    args: dict[str, Any] | None = None
    classes: ClassTransfer | None = None

    def _counts(self) -> str:
        return (
            f"{len(self.copied)} copied, {len(self.converted)} converted, {len(self.skipped)} source keys "
            f"skipped, {len(self.missing)} model keys left at init"
        )

    def line(self) -> str:
        """One log line: the counts, then each converted and skipped key with why.

        e.g. ``52 copied, 1 converted, 0 source keys skipped, 0 model keys left at init; converted
        pos_enc.pos_embed: resized (1, 5, 16) -> (1, 17, 16)``.
        """
        details = [f"classes: {self.classes.line()}"] if self.classes is not None else []
        details += [f"converted {k}: {v}" for k, v in self.converted.items()]
        details += [f"skipped {k}: {v}" for k, v in self.skipped.items()]
        return "; ".join([self._counts(), *details])

    def __str__(self) -> str:
        lines = [f"{self.source + ': ' if self.source else ''}{self._counts()}"]
        lines += [f"  classes: {self.classes.line()}"] if self.classes is not None else []
        lines += [f"  converted {k}: {v}" for k, v in self.converted.items()]
        lines += [f"  skipped {k}: {v}" for k, v in self.skipped.items()]
        lines += [f"  missing {k}" for k in self.missing]
        return "\n".join(lines)
