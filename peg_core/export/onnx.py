"""ONNX export shared by the packages' ``export`` commands: flags, the dynamo export, the onnxruntime check.

Model-agnostic: a task's ``export.py`` supplies its wrapper module, example input and
dynamic axes.  ``onnx`` and ``onnxruntime`` are imported only when a function needs them.
:func:`add_export_args` / :func:`check_output_path` are the commands' side (argparse types,
:class:`~peg_core.engine.UserError`); :func:`compare_onnxruntime` raises
:class:`OnnxCheckError`, an :class:`~peg_core.errors.InputError` the command line prints
as one line.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..engine.cli import add_overwrite_arg, positive_int
from ..engine.errors import UserError
from ..engine.outputs import ONNX, check_output_file
from ..errors import InputError, require

__all__ = [
    "MAX_OPSET",
    "MIN_OPSET",
    "OnnxCheckError",
    "add_export_args",
    "check_output_path",
    "compare_onnxruntime",
    "export_onnx",
    "opset_arg",
]

#: opsets the dynamo exporter of torch 2.x writes
MIN_OPSET, MAX_OPSET = 18, 23
#: largest difference between onnxruntime's and PyTorch's outputs that ``--check`` accepts
CHECK_TOLERANCE = 1e-4


class OnnxCheckError(InputError):
    """onnxruntime's outputs for the example differ from PyTorch's (shape, or values beyond the tolerance)."""


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


def export_onnx(
    model: nn.Module,
    example: Tensor,
    out: Path,
    dynamic_shapes: tuple[dict[int, Any], ...],
    input_name: str,
    output_names: Sequence[str],
    opset: int,
    metadata: Mapping[str, str],
) -> None:
    """``torch.onnx.export(dynamo=True)`` of ``model`` on ``example``, saved to ``out`` with ``metadata``.

    The exporter's progress lines are kept off the console (shown only if it fails).
    A missing ``onnx`` / ``onnxscript`` (the dynamo exporter's) is a one-line
    :class:`~peg_core.errors.MissingDependency` before any tracing.
    """
    onnx = require("onnx", "onnx", what="export")
    require("onnxscript", "onnx", what="export")

    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                model,
                (example,),
                dynamo=True,
                dynamic_shapes=dynamic_shapes,
                input_names=[input_name],
                output_names=list(output_names),
                opset_version=opset,
                verbose=False,
            )
            program.save(str(out))
    except Exception:
        sys.stderr.write(log.getvalue())
        raise
    proto = onnx.load(str(out))
    onnx.helper.set_model_props(proto, dict(metadata))
    onnx.save(proto, str(out))


def compare_onnxruntime(out: Path, feed: Mapping[str, Tensor], expected: Sequence[Tensor]) -> float:
    """Largest absolute difference between onnxruntime's outputs for ``feed`` and ``expected``.

    A shape mismatch or a difference above :data:`CHECK_TOLERANCE` is an :class:`OnnxCheckError` naming ``out``.
    """
    ort = require("onnxruntime", "onnx", what="export --check")

    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    got = session.run(None, {k: v.numpy() for k, v in feed.items()})
    diffs = []
    for g, e in zip(got, expected):
        if tuple(g.shape) != tuple(e.shape):
            raise OnnxCheckError(
                f"onnxruntime output shape {tuple(g.shape)} differs from PyTorch's {tuple(e.shape)}", out
            )
        diffs.append(float((torch.from_numpy(g) - e).abs().max()) if e.numel() else 0.0)
    diff = max(diffs)
    if diff > CHECK_TOLERANCE:
        raise OnnxCheckError(
            f"onnxruntime outputs differ from PyTorch's by {diff:.2e} (> {CHECK_TOLERANCE:g})", out
        )
    return diff
