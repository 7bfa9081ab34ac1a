"""8-bit post-training quantization of an image classifier with PyTorch's own PT2E flow (model-agnostic).

``torch.export`` captures the model with a dynamic batch and dynamic height / width (multiples
of the patch), torchao's ``prepare_pt2e`` inserts observers chosen by the x86 inductor
quantizer (int8 activations per tensor, int8 weights per channel), the calibration batches run
through it, and ``convert_pt2e`` turns the observers into ``quantize_per_tensor`` /
``dequantize_per_*`` pairs around the linear and convolution ops.  The result is a reference
quantized graph: it runs in eager mode on the CPU at any multiple of the patch (what the size
study needs), and ``torch.compile`` lowers the pairs to int8 kernels.

Files: :func:`save_quantized` re-exports the converted module (same dynamic shapes) and writes
a ``.pt2`` archive (``torch.export.save``) with the classifier's metadata (classes, training
size, data settings) as an extra file; :func:`load_quantized` reads it back with
``torch.export.load``: no pickle of Python objects, and the quantized ops round-trip exactly.

Nothing is patched while exporting: the models resize their position tables through
:func:`peg_core.resize.resize_pos_embed_traceable` whenever :func:`peg_core.resize.is_tracing`.
The ``quantize`` command (calibration data of the classifier) is
:mod:`peg_core.classify.quantize`.  A file that is not a quantized model is a
:class:`~peg_core.interop.io.WeightsError` (a ``ValueError``) naming it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.export import Dim
from torch.utils.data import Dataset

from ..errors import require
from ..interop.io import WeightsError

__all__ = [
    "QUANTIZED_SUFFIX",
    "QuantizedClassifier",
    "calibration_batches",
    "has_quantized_ops",
    "load_quantized",
    "quantize_int8",
    "save_quantized",
]

QUANTIZED_SUFFIX = ".pt2"
#: the extra file of a ``.pt2`` archive that holds the classifier's metadata
META_FILE = "peg_quantized.json"
#: largest grid side (in patches) the exported graph accepts
MAX_GRID = 256


def calibration_batches(dataset: Dataset, n: int, batch_size: int = 32) -> list[Tensor]:
    """The first ``n`` images of ``dataset`` (items ``(image (3, H, W), label)``) as ``(B, 3, H, W)`` batches.

    The first items, not a random draw: calibration (and so the quantized model) is a
    function of the data set alone.
    """
    n = min(int(n), len(dataset))  # type: ignore[arg-type]
    if n < 1:
        raise ValueError("calibration needs at least one image")
    images = [dataset[i][0] for i in range(n)]
    return [torch.stack(images[i : i + batch_size]) for i in range(0, n, batch_size)]


class QuantizedClassifier(nn.Module):
    """A converted PT2E graph behind the classifier's interface: ``(B, 3, H, W) -> (B, K)`` logits.

    Exported graphs refuse ``train()`` / ``eval()`` (their ops are fixed when exported), so the
    wrapper only records the flag: evaluation code that toggles modes works unchanged.
    """

    def __init__(self, graph: nn.Module, num_classes: int, patch_size: int) -> None:
        super().__init__()
        self.graph = graph
        self.num_classes = num_classes
        self.patch_size = patch_size

    def train(self, mode: bool = True) -> QuantizedClassifier:
        self.training = mode  # the graph is always in its exported (eval) form
        return self

    def forward(self, x: Tensor) -> Tensor:
        """Logits ``(B, K)`` of images ``(B, 3, H, W)``, any ``H, W`` of at least two patches.

        Other sides are zero-padded at the bottom/right to the patch, as :class:`~peg_core.models.CPVT`
        does itself (the graph was exported for multiples of the patch).
        """
        h, w = x.shape[-2:]
        ph, pw = (-h) % self.patch_size, (-w) % self.patch_size
        return self.graph(F.pad(x, (0, pw, 0, ph)) if ph or pw else x)


def _dynamic_shapes(patch: int) -> tuple[dict[int, Any]]:
    # H and W as patch * k: the exported graph keeps the patch grid symbolic instead of
    # specialising to the example's size; k >= 2 avoids export's special casing of size 1.
    gh, gw = Dim("grid_h", min=2, max=MAX_GRID), Dim("grid_w", min=2, max=MAX_GRID)
    return ({0: Dim("batch", min=1, max=4096), 2: patch * gh, 3: patch * gw},)


def _export(model: nn.Module, example: Tensor, patch: int, dynamic: bool) -> torch.export.ExportedProgram:
    """``torch.export`` of ``model`` on ``example`` (dynamic batch and grid unless ``dynamic=False``)."""
    shapes = _dynamic_shapes(patch) if dynamic else None
    return torch.export.export(model, (example,), dynamic_shapes=shapes)


@contextlib.contextmanager
def _quiet(name: str) -> Iterator[None]:
    """Silence logger ``name`` below ERROR (torch logs warnings, with tracebacks, to stderr)."""
    log = logging.getLogger(name)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _import_pt2e() -> None:
    """Import torchao's PT2E flow without its import-time deprecation log line.

    A missing torchao is a one-line :class:`~peg_core.errors.MissingDependency` naming ``peg-core[quantize]``.
    """
    with _quiet("torch.utils._pytree"):
        require("torchao.quantization.pt2e.quantize_pt2e", "quantize", what="quantize")


def quantize_int8(
    model: nn.Module, calib: Iterable[Tensor], example: Tensor, dynamic: bool = True
) -> QuantizedClassifier:
    """Post-training int8 quantization (PT2E, x86 inductor quantizer) of a classifier.

    Args:
        model: a CPVT (any position encoding); it is put in eval mode and not changed otherwise.
        calib: calibration batches ``(B, 3, H, W)`` (e.g. :func:`calibration_batches`).
        example: one input ``(B, 3, H, W)`` for the export, sides multiples of the patch and at least
            two patches (its size is not baked in when ``dynamic``; a batch of one is doubled).
        dynamic: a dynamic batch and dynamic ``H`` / ``W`` (multiples of the patch); ``False``
            fixes the example's shape.

    Returns:
        :class:`QuantizedClassifier` taking ``(B, 3, H, W)`` at any multiple of the patch.
    """
    _import_pt2e()
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer,
        get_default_x86_inductor_quantization_config,
    )

    model = model.eval()
    patch = int(getattr(model, "patch_size", 1))
    if dynamic:
        if min(example.shape[-2:]) < 2 * patch:
            raise ValueError(
                f"the example must be at least two patches ({2 * patch} px) a side; got {tuple(example.shape)}"
            )
        if example.shape[0] == 1:  # export would make a batch of one a constant
            example = example.expand(2, -1, -1, -1)
    program = _export(model, example, patch, dynamic)
    quantizer = X86InductorQuantizer()
    quantizer.set_global(get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(program.module(), quantizer)
    seen = 0
    with torch.no_grad():
        for batch in calib:
            prepared(batch)
            seen += 1
    if seen == 0:
        raise ValueError("calibration needs at least one batch")
    converted = convert_pt2e(prepared)
    return QuantizedClassifier(converted, int(getattr(model, "num_classes", 0)), patch)


def has_quantized_ops(model: nn.Module) -> dict[str, int]:
    """Counts of the quantize / dequantize calls in the graph of a quantized model (by op name)."""
    graph = model.graph if isinstance(model, QuantizedClassifier) else model
    counts: dict[str, int] = {}
    for node in graph.graph.nodes:  # type: ignore[union-attr]
        name = str(node.target)
        if node.op == "call_function" and "quantize" in name:
            key = name.split(".")[1] if name.startswith("quantized_decomposed.") else name
            counts[key] = counts.get(key, 0) + 1
    return counts


def save_quantized(
    model: QuantizedClassifier, example: Tensor, path: str | os.PathLike, meta: dict[str, Any]
) -> Path:
    """Write ``model`` as a ``.pt2`` archive (re-exported with dynamic shapes) plus ``meta`` as JSON."""
    path = Path(path)
    program = torch.export.export(model.graph, (example,), dynamic_shapes=_dynamic_shapes(model.patch_size))
    info = {**meta, "num_classes": model.num_classes, "patch_size": model.patch_size}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.export.save(program, tmp, extra_files={META_FILE: json.dumps(info)})
    os.replace(tmp, path)
    return path


def load_quantized(path: str | os.PathLike) -> tuple[QuantizedClassifier, dict[str, Any]]:
    """``(model, meta)`` of a file written by :func:`save_quantized`; a :class:`WeightsError` naming it otherwise."""
    path = Path(path)
    if not path.is_file():
        raise WeightsError("quantized model not found", path)
    _import_pt2e()  # registers the quantized_decomposed ops the graph calls

    extra = {META_FILE: ""}
    try:
        with _quiet("torch.export"):  # our one-line error says it; no logged traceback
            program = torch.export.load(path, extra_files=extra)
        meta = json.loads(extra[META_FILE])
    except Exception as e:  # zip, pickle and schema errors alike: the file is not ours
        raise WeightsError(
            f"not a quantized model written by 'peg_core quantize' ({type(e).__name__})", path
        ) from None
    model = QuantizedClassifier(program.module(), int(meta["num_classes"]), int(meta["patch_size"]))
    return model, meta
