"""Nothing the user owns is overwritten: the one rule of every command that writes files.

Every verb of the three packages that writes (``train``, ``eval``, ``predict``, ``export``,
``export-hf``, ``quantize``, ``resize-pos-embed``, ``to-cpvt``, ...) names what it will write,
and what it reads, here, before any long work:

* :func:`check_output_file`: one file (``export``'s ``.onnx``, ``quantize``'s ``.pt2``,
  ``predict --output``, a surgery's ``OUT``);
* :func:`check_output_folder`: files in a folder (``predict --output-dir``, ``eval``'s
  ``report.json``, ``export-hf``'s ``config.json`` + ``model.safetensors``);
* :func:`check_run_folder`: ``train``'s ``--output-dir``.

The rule, the same for all of them:

1. an output that is one of the command's inputs is refused (``export`` onto its checkpoint,
   ``predict``'s annotated copy over the input image);
2. an existing file of another kind than the one written is refused: a training checkpoint
   where an ONNX model or predictions would go, a training report where ``predict``'s or
   ``eval``'s would go, a Hugging Face folder's weights; only what the same verb wrote earlier
   is replaced (an earlier ``export``'s ``.onnx``, an earlier ``eval``'s report, a folder whose
   ``report.json`` says ``predict`` wrote it);
3. a folder holding a training run (``checkpoint.pth`` / ``checkpoint_prev.pth``) is refused
   to a new ``train``;

unless ``--overwrite`` says so (for ``train`` also ``--resume``, which continues the run).  A
refusal is one :class:`UserError` line, ``error: <what>; <the flag that allows it>: <path>``.
:func:`output_names` gives inputs with the same file name (``a/x.jpg``, ``b/x.jpg``) distinct
output names.  The kinds of file are told apart by name and suffix, and a JSON file by its
``command`` key (:func:`file_kind`): nothing is unpickled or run.
"""

from __future__ import annotations

import os
import re
import shutil
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

from ..jsonfile import JsonError, read_json
from .checkpoint import CHECKPOINT_NAME, PREVIOUS_NAME
from .command import UserError

__all__ = [
    "CHECKPOINT",
    "HF_MODEL",
    "ONNX",
    "OVERWRITE_HINT",
    "QUANTIZED",
    "REPORT_NAME",
    "WEIGHTS",
    "check_output_file",
    "check_output_folder",
    "check_run_folder",
    "clear_run_files",
    "ensure_writable",
    "file_kind",
    "output_names",
    "report_command",
    "report_kind",
]

#: the summary a run, an evaluation or a prediction writes in its folder
REPORT_NAME = "report.json"
#: what a refusal suggests
OVERWRITE_HINT = "pass --overwrite to replace it"

# The kinds of file, as the refusals name them.
CHECKPOINT = "a training checkpoint"
WEIGHTS = "a weights file"
ONNX = "an ONNX model"
QUANTIZED = "a quantized model"
HF_MODEL = "a Hugging Face model"
IMAGE = "an image"
VIDEO = "a video"
JSON = "a JSON file"
FOLDER = "a folder"
FILE = "a file"

#: ``checkpoint.pth``, ``checkpoint_prev.pth``, ``checkpoint0004.pth``: what ``train`` writes
_CHECKPOINT_FILE = re.compile(r"checkpoint(_prev|_best|\d{4})?\.pth")
_WEIGHT_SUFFIXES = {".pth", ".pt", ".bin", ".ckpt", ".safetensors"}
_IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm"}
_VIDEO_SUFFIXES = {".mp4", ".avi", ".mkv", ".webm", ".mov"}
_HF_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
#: a JSON larger than this is not a report of ours (and is not read to find out)
_REPORT_MAX_BYTES = 64 << 20
#: the run files :func:`clear_run_files` removes (with ``checkpointNNNN.pth`` and ``tb/``'s event files)
_RUN_FILES = (CHECKPOINT_NAME, PREVIOUS_NAME, REPORT_NAME, "log.jsonl", "args.json")


def report_kind(command: str | None) -> str:
    """How a refusal names a report written by ``command`` (``"a training report"``, ...)."""
    names = {"train": "a training report", "eval": "an eval report", "predict": "a predict report"}
    return names.get(str(command), f"a {command} report" if command else JSON)


def report_command(path: str | os.PathLike) -> str | None:
    """The ``command`` key of the JSON object in ``path``: which verb wrote it (None: not a report of ours)."""
    try:
        obj = read_json(path, max_bytes=_REPORT_MAX_BYTES, kind=dict)
    except JsonError:  # missing, unreadable, not JSON, not an object: not a report of ours
        return None
    command = obj.get("command")
    return command if isinstance(command, str) and command else None


def file_kind(path: str | os.PathLike) -> str | None:
    """What ``path`` holds, in a refusal's words (``"a training checkpoint"``, ...); None when nothing is there.

    Told by the name and suffix (a ``.json`` by its ``command`` key): the file is not loaded.
    """
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        return None
    if p.is_dir():
        return FOLDER
    suffix = p.suffix.lower()
    if _CHECKPOINT_FILE.fullmatch(p.name):
        return CHECKPOINT
    if suffix in _WEIGHT_SUFFIXES:
        return WEIGHTS
    if suffix == ".onnx":
        return ONNX
    if suffix == ".pt2":
        return QUANTIZED
    if suffix == ".json":
        return report_kind(report_command(p))
    if suffix in _IMAGE_SUFFIXES:
        return IMAGE
    if suffix in _VIDEO_SUFFIXES:
        return VIDEO
    return FILE


def _identity(path: Path) -> tuple[int, int] | str:
    """What makes two paths the same file: (device, inode) when it exists, else the absolute path."""
    try:
        st = path.stat()
        return (st.st_dev, st.st_ino)
    except OSError:
        return os.path.normcase(os.path.abspath(path))


def _input_set(inputs: Iterable[str | os.PathLike]) -> set[tuple[int, int] | str]:
    return {_identity(Path(p)) for p in inputs}


def ensure_writable(folder: str | os.PathLike) -> None:
    """Create ``folder`` and check that files can be written there (before any long work)."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise UserError(f"output folder is not writable ({e.strerror or e})", folder) from None


def check_output_file(
    path: str | os.PathLike,
    kind: str,
    *,
    inputs: Iterable[str | os.PathLike] = (),
    overwrite: bool = False,
) -> Path:
    """Check that the command may write ``kind`` (e.g. :data:`ONNX`) at ``path``; create its folder.

    Refused (a :class:`UserError` naming ``path``) unless ``overwrite``: ``path`` is one of
    ``inputs``, or holds a file of another kind than ``kind``.  A file of the same kind (an
    earlier run of the same verb) is replaced.  A folder at ``path`` is always an error.
    """
    path = Path(path)
    if path.is_dir():
        raise UserError(f"output is a folder, expected a file path for {kind}", path)
    if not overwrite:
        existing = file_kind(path)
        if _identity(path) in _input_set(inputs):
            raise UserError(f"output is one of the inputs ({existing or FILE}); {OVERWRITE_HINT}", path)
        if existing is not None and existing != kind:
            raise UserError(f"output would replace {existing}; {OVERWRITE_HINT}", path)
    ensure_writable(path.parent if str(path.parent) else Path("."))
    return path


def _held(folder: Path, names: Sequence[str]) -> str:
    """The files ``names`` (present in ``folder``) in a refusal's words: ``a training report (report.json)``."""
    present = set(os.listdir(folder))
    if "config.json" in present and any(w in present for w in _HF_WEIGHTS):
        held = [n for n in ("config.json", *_HF_WEIGHTS) if n in present]
        return f"{HF_MODEL} ({', '.join(held)})"
    first = names[0]
    more = f" and {len(names) - 1} more file{'s' if len(names) > 2 else ''}" if len(names) > 1 else ""
    return f"{file_kind(folder / first) or FILE} ({first}){more}"


def check_output_folder(
    folder: str | os.PathLike,
    names: Iterable[str],
    *,
    command: str,
    inputs: Iterable[str | os.PathLike] = (),
    overwrite: bool = False,
    hint: str = "",
    create: bool = True,
) -> Path:
    """Check that ``command`` may write the files ``names`` into ``folder``; create it (``create``).

    Refused (a :class:`UserError`) unless ``overwrite``: one of the files is one of ``inputs``
    (named by its path), or ``folder`` already holds one of them and was not written by
    ``command`` (its ``report.json`` says who wrote it; an earlier run of the same verb is
    replaced); a Hugging Face folder (``config.json`` and weights) is named as one.  ``hint``
    is added to the refusal (e.g. where the command writes by default).
    """
    folder = Path(folder)
    names = list(dict.fromkeys(names))
    if folder.exists() and not folder.is_dir():
        raise UserError("output folder is a file", folder)
    if not overwrite and folder.is_dir():
        mine = _input_set(inputs)
        for name in names:
            if _identity(folder / name) in mine:
                kind = file_kind(folder / name) or FILE
                raise UserError(f"an output is one of the inputs ({kind}); {OVERWRITE_HINT}", folder / name)
        if report_command(folder / REPORT_NAME) != command:
            taken = [n for n in names if (folder / n).exists() or (folder / n).is_symlink()]
            if taken:
                them = "it" if len(taken) == 1 else "them"
                raise UserError(
                    f"output folder holds {_held(folder, taken)}; pass --overwrite to replace {them}{hint}",
                    folder,
                )
    if create:
        ensure_writable(folder)
    return folder


def check_run_folder(folder: str | os.PathLike, *, resume: bool, overwrite: bool) -> None:
    """``train``'s ``--output-dir``: a folder holding a training run is refused to a new run.

    A new run (neither ``resume`` nor ``overwrite``) in a folder with ``checkpoint.pth`` or
    ``checkpoint_prev.pth`` would replace them: refused, suggesting ``--resume auto`` (continue
    it) or ``--overwrite`` (start again).  A ``report.json`` of another command (``eval``,
    ``predict``, not ours) is refused unless ``overwrite``.
    """
    folder = Path(folder)
    if overwrite or not folder.is_dir():
        return
    report = folder / REPORT_NAME
    command = report_command(report)
    if not resume:
        held = [n for n in (CHECKPOINT_NAME, PREVIOUS_NAME) if (folder / n).is_file()]
        if held:
            finished = command == "train" and _status(report) == "finished"
            what = "a finished training run" if finished else "a training run"
            raise UserError(
                f"output folder holds {what} ({', '.join(held)}); pass --resume auto to continue it "
                "or --overwrite to start a new run",
                folder,
            )
    if report.exists() and command != "train":
        raise UserError(
            f"output folder holds {report_kind(command)} ({REPORT_NAME}); {OVERWRITE_HINT}", folder
        )


def _status(report: Path) -> str | None:
    try:
        status = read_json(report, max_bytes=_REPORT_MAX_BYTES, kind=dict).get("status")
    except JsonError:
        return None
    return status if isinstance(status, str) else None


def clear_run_files(folder: str | os.PathLike) -> list[Path]:
    """Remove an earlier training run's files from ``folder`` (``train --overwrite``); returns them.

    Its checkpoints (``checkpoint.pth``, ``checkpoint_prev.pth``, ``checkpointNNNN.pth``: else
    ``--resume auto`` could fall back to the old run's), ``report.json``, ``log.jsonl`` (appended
    to), ``args.json`` and TensorBoard's event files in ``tb/``.  Other files stay.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    gone = [folder / n for n in _RUN_FILES if (folder / n).is_file()]
    gone += sorted(p for p in folder.glob("checkpoint*.pth") if _CHECKPOINT_FILE.fullmatch(p.name))
    tb = folder / "tb"
    if tb.is_dir():
        gone += sorted(tb.glob("events.out.tfevents.*"))
    for p in dict.fromkeys(gone):
        p.unlink(missing_ok=True)
    if tb.is_dir() and not any(tb.iterdir()):
        shutil.rmtree(tb, ignore_errors=True)
    return list(dict.fromkeys(gone))


def output_names(inputs: Sequence[str | os.PathLike], suffix: str) -> list[str]:
    """One output file name per input (``NAME`` + ``suffix``), distinct for distinct inputs.

    An input keeps its stem (``a/x.jpg`` -> ``x.png``) unless another input has the same one:
    then the stems take as many of their parent folders as tell them apart (``a/x.jpg``,
    ``b/x.jpg`` -> ``a_x.png``, ``b_x.png``), and files that differ only by their suffix keep
    it (``x.jpg``, ``x.png`` -> ``x_jpg.png``, ``x_png.png``).  The same file given twice gets
    the same name.  Names are deterministic: a function of the input list alone.
    """
    files = [Path(os.path.abspath(p)) for p in inputs]
    unique = list(dict.fromkeys(files))
    # files sharing folder and stem differ by their suffix alone: the suffix is part of their name
    by_stem: dict[tuple[Path, str], list[Path]] = defaultdict(list)
    for f in unique:
        by_stem[(f.parent, f.stem)].append(f)
    with_suffix = {f for group in by_stem.values() if len(group) > 1 for f in group}
    depth = dict.fromkeys(unique, 0)

    def name(f: Path) -> str:
        parents = f.parent.parts[1:]  # without the root / drive
        words = [*parents[len(parents) - depth[f] :], f.stem] if depth[f] else [f.stem]
        if f in with_suffix:
            words.append(f.suffix.lstrip("."))
        return "_".join(words)

    while True:
        groups: dict[str, list[Path]] = defaultdict(list)
        for f in unique:
            groups[name(f)].append(f)
        clashing = [f for group in groups.values() if len(group) > 1 for f in group]
        deeper = [f for f in clashing if depth[f] < len(f.parent.parts) - 1]
        if not deeper:
            break
        for f in deeper:
            depth[f] += 1
    # what the folders cannot tell apart (``a_b/x`` against ``a/b_x``): numbered, in input order
    taken: dict[str, int] = defaultdict(int)
    final: dict[Path, str] = {}
    for f in unique:
        base = name(f)
        taken[base] += 1
        final[f] = base if taken[base] == 1 else f"{base}-{taken[base]}"
    return [final[f] + suffix for f in files]
