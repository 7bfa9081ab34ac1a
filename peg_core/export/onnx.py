"""ONNX export of any model of the suite: the dynamo export with metadata, the onnxruntime check.

Model-agnostic: a task's ``export.py`` supplies its wrapper module, example input and
dynamic axes.  ``onnx`` and ``onnxruntime`` are imported only when a function needs them.
This is library code: a bad input is an :class:`ExportError` (an
:class:`~peg_core.errors.InputError` naming the file or value), onnxruntime's disagreement an
:class:`OnnxCheckError`; the command line prints either as one line.  The ``export``
commands' flags and output checks are in :mod:`peg_core.export.cli`.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import InputError, require

__all__ = [
    "CHECK_TOLERANCE",
    "MAX_OPSET",
    "MIN_OPSET",
    "ExportError",
    "OnnxCheckError",
    "compare_onnxruntime",
    "export_onnx",
]

#: opsets the dynamo exporter of torch 2.x writes
MIN_OPSET, MAX_OPSET = 18, 23
#: largest difference between onnxruntime's and PyTorch's outputs that ``--check`` accepts
CHECK_TOLERANCE = 1e-4


class ExportError(InputError):
    """An export that cannot be made from its input: ``what`` says why, ``where`` names the file or value."""


class OnnxCheckError(ExportError):
    """onnxruntime's outputs for the example differ from PyTorch's (shape, or values beyond the tolerance)."""


def export_onnx(
    model: nn.Module,
    example: Tensor,
    out: str | os.PathLike,
    dynamic_shapes: tuple[dict[int, Any], ...],
    input_name: str,
    output_names: Sequence[str],
    opset: int,
    metadata: Mapping[str, str],
) -> None:
    """``torch.onnx.export(dynamo=True)`` of ``model`` on ``example``, saved to ``out`` with ``metadata``.

    The exporter's progress lines are kept off the console (shown only if it fails).
    A missing ``onnx`` / ``onnxscript`` (the dynamo exporter's) is a one-line
    :class:`~peg_core.errors.MissingDependency` before any tracing; so is an :class:`ExportError`
    for an ``out`` that is a folder or an ``opset`` outside ``MIN_OPSET..MAX_OPSET``.

    Args:
        model: the module to trace; called as ``model(example)``.
        example: the example input, e.g. images ``(B, 3, H, W)`` (B >= 2: a size of 1 is traced
            as a constant).
        out: the ``.onnx`` file to write (replaced if it exists).
        dynamic_shapes: per input, ``{dim: torch.export.Dim}`` of the sizes left free.
        input_name, output_names: the graph's input and output names.
        opset: the ONNX opset to write.
        metadata: ``{key: value}`` strings stored in the model's ``metadata_props``.
    """
    out = Path(out)
    if out.is_dir():
        raise ExportError("output is a folder, expected an .onnx file path", out)
    if not (isinstance(opset, int) and MIN_OPSET <= opset <= MAX_OPSET):
        raise ExportError(f"opset must be an integer in {MIN_OPSET}..{MAX_OPSET}", f"opset={opset!r}")
    onnx = require("onnx", "onnx", what="export")
    require("onnxscript", "onnx", what="export")

    log = io.StringIO()
    try:
        # no_grad: an inference graph; a float attention mask with parameters behind it (FIRE's MLP)
        # cannot be decomposed for export while it requires grad
        with (
            contextlib.redirect_stdout(log),
            contextlib.redirect_stderr(log),
            warnings.catch_warnings(),
            torch.no_grad(),
        ):
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
