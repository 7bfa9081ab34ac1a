"""The ``predict`` verb of the three packages: one set of flags, one output, one treatment of a bad file.

    python -m peg_core predict  --checkpoint CKPT IMAGE... [--output FILE] [--json]
    python -m peg_detr predict  --checkpoint CKPT IMAGE... [--output FILE] [--output-dir DIR]
    python -m peg_video predict --checkpoint CKPT VIDEO... [--output FILE] [--json]

What every ``predict`` shares (a package adds its own model flags, and ``peg_detr`` its
pictures in ``--output-dir``):

* flags (:func:`add_predict_args`): the files, ``--checkpoint``, ``--output FILE``,
  ``--threads N`` (as ``train`` and ``eval``; applied by :func:`predict_device`), ``--overwrite``,
  ``--json``, ``--debug``;
* outputs checked before the model is read (:func:`check_predict_outputs`, the rule of
  :mod:`peg_core.engine.outputs`): an output that is an input or a file of another kind (a
  checkpoint, a training report) is refused without ``--overwrite``;
* a missing or unreadable file is skipped, never an exception: its line says
  ``PATH: skipped (<reason>)``, it is counted in the closing line and listed in the report
  (``broken.predict``);
* one console line per file, then the closing line ``predict done: 2 images, 1 skipped (WHERE)``;
  ``--json`` prints the report instead, and ``--output FILE`` writes the same report
  (:func:`finish_predict`);
* exit status 0 when at least one file was read; 1, with one line ``error: cannot read the image
  (<reason>): PATH`` (one file) or ``error: no image could be read (N skipped; first: <reason>):
  PATH`` (several), when none was.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from .broken import BrokenLog
from .cli import add_json_arg, add_overwrite_arg, positive_int
from .command import UserError
from .memory import add_max_memory_arg
from .outputs import check_output_file, check_output_folder, report_kind
from .predictor import FilePredictor, Prediction
from .summary import done_line, print_closing, stdout_to_stderr
from .trainer import write_json

__all__ = [
    "MISSING_FILE",
    "NOT_A_FILE",
    "add_predict_args",
    "check_predict_outputs",
    "finish_predict",
    "missing_reason",
    "predict_device",
    "predict_paths",
]

#: why a path that is not there, or not a file, is skipped: the same words in every ``predict``
MISSING_FILE = "file not found"
NOT_A_FILE = "not a file"


def add_predict_args(p: argparse.ArgumentParser, *, noun: str) -> None:
    """The flags every ``predict`` takes; ``noun`` names its files in the plural (``images``, ``videos``).

    The files land in ``args.files``.
    """
    singular = noun.removesuffix("s")
    p.add_argument("files", nargs="+", type=Path, metavar=singular.upper(),
                   help=f"{noun} to predict on (a missing or unreadable one is skipped and listed)")  # fmt: skip
    p.add_argument("--checkpoint", type=Path, required=True, help="checkpoint.pth written by train")
    p.add_argument("--output", type=Path, metavar="FILE",
                   help="also write the report (the predictions and the skipped files) as JSON to FILE")  # fmt: skip
    p.add_argument(
        "--threads", type=positive_int, help="torch intra-op CPU threads (default: torch's choice)"
    )
    add_max_memory_arg(p)
    add_overwrite_arg(p)
    p.add_argument("--debug", action="store_true", help="show tracebacks of user errors")
    add_json_arg(p)


def missing_reason(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot be read at all, in the words every ``predict`` uses (None: it is a file)."""
    if os.path.isfile(path):
        return None
    return NOT_A_FILE if os.path.exists(path) else MISSING_FILE


def predict_paths(predictor: FilePredictor, files: Sequence[str | os.PathLike]) -> list[Prediction]:
    """``predictor.predict_files(files)`` with a missing file skipped as :data:`MISSING_FILE` (each
    task's reader words it otherwise), in the order given."""
    present = [f for f in files if missing_reason(f) is None]
    done = iter(predictor.predict_files(present) if present else [])
    return [
        next(done) if (why := missing_reason(f)) is None else predictor.skipped(os.fspath(f), why)
        for f in files
    ]


def predict_device(device: str, threads: int | None = None) -> str:
    """``--device`` of ``predict``: ``auto`` is CUDA when there is one; CUDA without one is a :class:`UserError`.

    ``threads`` (``--threads``): torch's intra-op CPU threads, set here as ``train`` and ``eval`` set them.
    """
    if threads:
        torch.set_num_threads(threads)
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError("CUDA is not available on this machine", f"--device {device}")
    return device


def check_predict_outputs(
    args: argparse.Namespace, folder: str | os.PathLike | None = None, names: Iterable[str] = ()
) -> None:
    """Check ``--output`` (and ``folder``, where the files ``names`` go) before the model is read.

    The inputs are the files and the checkpoint; the rule is :mod:`peg_core.engine.outputs`'.
    """
    inputs = [*args.files, args.checkpoint]
    names = list(names)
    if args.output is not None:
        if folder is not None and any(_same(args.output, Path(folder) / n) for n in names):
            raise UserError(f"--output names a file that --output-dir {folder} also writes", args.output)
        check_output_file(args.output, report_kind("predict"), inputs=inputs, overwrite=args.overwrite)
    if folder is not None:
        check_output_folder(folder, names, command="predict", inputs=inputs, overwrite=args.overwrite)


def _same(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    return os.path.normcase(os.path.abspath(a)) == os.path.normcase(os.path.abspath(b))


def finish_predict(
    args: argparse.Namespace,
    preds: Sequence[Prediction],
    *,
    task: str,
    noun: str,
    folder: str | os.PathLike | None = None,
    extra: Mapping[str, Any] | None = None,
    extra_text: str = "",
) -> dict[str, Any]:
    """Print, write and close a ``predict`` run; returns its report.

    One line per prediction (not under ``--json``), the report written to ``--output`` and to
    ``folder/report.json`` (when given), then the closing line (``--json``: the report).  When no
    file could be read that is a :class:`UserError` naming the first, after the report is written.

    Args:
        preds: one prediction per file, in the order given (skipped ones included).
        task: the checkpoint's task (``classify``, ``detect``, ``video``).
        noun: the files in the plural (``images``, ``videos``).
        folder: the ``--output-dir`` of a task that writes one (its ``report.json`` goes there too).
        extra: more report entries (a task's own outputs).
        extra_text: added to the closing line's counts (``, 3 detections``).
    """
    singular = noun.removesuffix("s")
    log = BrokenLog("predict", len(preds), max_fraction=1.0)
    log.add((str(p.path), p.skipped) for p in preds if p.skipped is not None)
    read = len(preds) - log.count
    report: dict[str, Any] = {
        "task": task,
        "command": "predict",
        "checkpoint": str(args.checkpoint),
        noun: read,
        "broken": {"predict": log.report()},
        **(extra or {}),
        "predictions": [p.to_json() for p in preds],
    }
    if folder is not None:
        report["output_dir"] = str(folder)
    if args.output is not None:
        report["output"] = str(args.output)
    with stdout_to_stderr(args.json):
        for pred in preds:
            print(pred.line(), flush=True)
    for path in ([args.output] if args.output is not None else []) + (
        [Path(folder) / "report.json"] if folder is not None else []
    ):
        try:
            write_json(Path(path), report)
        except OSError as e:
            raise UserError(f"cannot write the predictions ({e.strerror or e})", path) from None
    if read == 0:
        first = next(p for p in preds if p.skipped is not None)
        if len(preds) == 1:
            raise UserError(f"cannot read the {singular} ({first.skipped})", first.path)
        raise UserError(
            f"no {singular} could be read ({len(preds)} skipped; first: {first.skipped})", first.path
        )
    where = args.output or folder or "stdout"
    counted = f"{read} {singular if read == 1 else noun}, {log.count} skipped{extra_text}"
    print_closing(done_line("predict", counted, where), report, args.json)
    return report
