"""The command side of every ``export`` verb: its flags and the check of its output path.

This is the command line's layer (it raises :class:`~peg_core.engine.UserError` and takes
the engine's argparse types); the export itself is library code in :mod:`peg_core.export.onnx`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..engine.cli import add_overwrite_arg, positive_int
from ..engine.command import UserError
from ..engine.outputs import ONNX, check_output_file
from .onnx import MAX_OPSET, MIN_OPSET

__all__ = ["add_export_args", "check_output_path", "opset_arg"]


def opset_arg(text: str) -> int:
    """``argparse`` type: an ONNX opset the dynamo exporter writes."""
    value = positive_int(text)
    if not MIN_OPSET <= value <= MAX_OPSET:
        raise argparse.ArgumentTypeError(f"expected an opset in {MIN_OPSET}..{MAX_OPSET}, got {text!r}")
    return value


def add_export_args(p: argparse.ArgumentParser) -> None:
    """The flags every ``export`` command takes: ``CKPT OUT --opset --check --overwrite --debug``."""
    p.add_argument("checkpoint", type=Path, help="checkpoint.pth written by train")
    p.add_argument("out", type=Path, help="the .onnx file to write")
    p.add_argument(
        "--opset", type=opset_arg, default=MAX_OPSET - 3, help=f"ONNX opset ({MIN_OPSET}..{MAX_OPSET})"
    )
    p.add_argument("--check", action="store_true", help="run onnxruntime on the example and compare")
    add_overwrite_arg(p)
    p.add_argument("--debug", action="store_true", help="show tracebacks of user errors")


def check_output_path(out: Path, checkpoint: Path | None = None, overwrite: bool = False) -> None:
    """The output must be a file in a writable folder (a :class:`UserError` before any tracing).

    Nor may it replace its own ``checkpoint`` or an existing file other than an ONNX model
    (:func:`peg_core.engine.outputs.check_output_file`), unless ``overwrite``.
    """
    if out.is_dir():
        raise UserError("output is a folder, expected an .onnx file path", out)
    inputs = [checkpoint] if checkpoint is not None else []
    check_output_file(out, ONNX, inputs=inputs, overwrite=overwrite)
