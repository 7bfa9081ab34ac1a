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
import importlib.util
import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.export import Dim
from torch.utils.data import Dataset

from ..errors import InputError, require
from ..interop.io import WeightsError
from ..jsonfile import JsonError, parse_json
from .pt2 import check_pt2_archive, read_extra_file

__all__ = [
    "QUANTIZED_SUFFIX",
    "QuantizedClassifier",
    "SizeRangeError",
    "calibration_batches",
    "check_meta",
    "has_quantized_ops",
    "load_quantized",
    "quantize_int8",
    "save_quantized",
]

QUANTIZED_SUFFIX = ".pt2"
#: the extra file of a ``.pt2`` archive that holds the classifier's metadata
META_FILE = "peg_quantized.json"
#: smallest and largest grid side (in patches) the exported graph accepts
MIN_GRID, MAX_GRID = 2, 256
#: how to install what quantization needs


class SizeRangeError(InputError):
    """An image side outside the range the ``.pt2`` graph was exported for."""


def _require_torchao() -> None:
    """A one-line :class:`~peg_core.errors.MissingDependency` when torchao is not installed (found, not imported)."""
    if importlib.util.find_spec("torchao") is None:
        require("torchao", "quantize", what="int8 quantization")


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

    def __init__(
        self,
        graph: nn.Module,
        num_classes: int,
        patch_size: int,
        grid_range: tuple[int, int] = (MIN_GRID, MAX_GRID),
    ) -> None:
        super().__init__()
        self.graph = graph
        self.num_classes = num_classes
        self.patch_size = patch_size
        self.grid_range = (int(grid_range[0]), int(grid_range[1]))

    def train(self, mode: bool = True) -> QuantizedClassifier:
        self.training = mode  # the graph is always in its exported (eval) form
        return self

    def size_range(self) -> tuple[int, int]:
        """The smallest and largest image side in pixels (sides are padded up to a multiple of the patch)."""
        lo, hi = self.grid_range
        return (lo - 1) * self.patch_size + 1, hi * self.patch_size

    def check_sizes(self, sizes: Iterable[int], where: Any = None) -> None:
        """A :class:`SizeRangeError` stating the exported range when a side in ``sizes`` is outside it."""
        lo, hi = self.size_range()
        bad = [int(s) for s in sizes if not lo <= int(s) <= hi]
        if bad:
            raise SizeRangeError(
                f"the quantized model was exported for image sides of {lo} to {hi} px "
                f"({self.grid_range[0]} to {self.grid_range[1]} patches of {self.patch_size} px); got {bad}",
                where,
            )

    def forward(self, x: Tensor) -> Tensor:
        """Logits ``(B, K)`` of images ``(B, 3, H, W)``, sides within :meth:`size_range`.

        Other sides are zero-padded at the bottom/right to the patch, as :class:`~peg_core.models.CPVT`
        does itself (the graph was exported for multiples of the patch).
        """
        h, w = x.shape[-2:]
        self.check_sizes((h, w), f"input of shape {tuple(x.shape)}")
        ph, pw = (-h) % self.patch_size, (-w) % self.patch_size
        return self.graph(F.pad(x, (0, pw, 0, ph)) if ph or pw else x)


def _dynamic_shapes(patch: int) -> tuple[dict[int, Any]]:
    # H and W as patch * k: the exported graph keeps the patch grid symbolic instead of
    # specialising to the example's size; k >= 2 avoids export's special casing of size 1.
    gh, gw = Dim("grid_h", min=MIN_GRID, max=MAX_GRID), Dim("grid_w", min=MIN_GRID, max=MAX_GRID)
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
        require("torchao.quantization.pt2e.quantize_pt2e", "quantize", what="int8 quantization")


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
    """Write ``model`` as a ``.pt2`` archive (re-exported with dynamic shapes) plus ``meta`` as JSON.

    The metadata records ``num_classes``, ``patch_size`` and ``grid_range`` (the grid sides, in
    patches, the graph accepts).  Every tensor of the archive is a plain payload (int8 weights
    and their scales / zero points included), so :func:`~peg_core.export.pt2.check_pt2_archive`
    accepts it.
    """
    path = Path(path)
    program = torch.export.export(model.graph, (example,), dynamic_shapes=_dynamic_shapes(model.patch_size))
    info = {**meta, "num_classes": model.num_classes, "patch_size": model.patch_size,
            "grid_range": [MIN_GRID, MAX_GRID]}  # fmt: skip
    # written beside the target under its own name (the archive's root folder is the file's stem,
    # torch warns on other suffixes), then renamed: a killed run leaves no half-written file
    with tempfile.TemporaryDirectory(prefix=f".{path.name}.", dir=path.parent) as tmp_dir:
        tmp = Path(tmp_dir) / path.name
        torch.export.save(program, tmp, extra_files={META_FILE: json.dumps(info)})
        os.replace(tmp, path)
    return path


def _positive_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _numbers(n: int) -> Callable[[Any], bool]:
    return lambda v: (
        isinstance(v, list)
        and len(v) == n
        and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)
    )


#: metadata key -> (required, what it must be, check); other keys are kept as they are
META_SCHEMA: dict[str, tuple[bool, str, Callable[[Any], bool]]] = {
    "num_classes": (True, "a positive int", _positive_int),
    "patch_size": (True, "a positive int", _positive_int),
    "img_size": (True, "a positive int", _positive_int),
    "classes": (True, "a list of class names (str)", lambda v: isinstance(v, list) and bool(v)
                and all(isinstance(c, str) for c in v)),
    "grid_range": (False, f"[min, max] grid sides in patches, {MIN_GRID} <= min <= max",
                   lambda v: isinstance(v, list) and len(v) == 2 and all(map(_positive_int, v))
                   and MIN_GRID <= v[0] <= v[1]),
    "epoch": (False, "an int or null", lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool))),
    "mean": (False, "a list of 3 numbers", _numbers(3)),
    "std": (False, "a list of 3 numbers", _numbers(3)),
    "crop_ratio": (False, "a number in (0, 1]", lambda v: _numbers(1)([v]) and 0 < v <= 1),
    "data": (False, "an object or null", lambda v: v is None or isinstance(v, dict)),
}  # fmt: skip
#: entries of ``meta["data"]`` that evaluation reads
DATA_SCHEMA: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "kind": ("a str", lambda v: isinstance(v, str)),
    "path": ("a str or null", lambda v: v is None or isinstance(v, str)),
    "seed": ("an int", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "n_val": ("a positive int", _positive_int),
}


def check_meta(text: str | None, path: str | os.PathLike) -> dict[str, Any]:
    """The metadata of a ``.pt2`` (JSON text of :data:`META_FILE`), checked against :data:`META_SCHEMA`.

    Raises:
        WeightsError: missing, not JSON, not an object, a required key missing or a key of the wrong
            type; the message names the file and the key.
    """
    where = f"{path} (extra/{META_FILE})"
    if text is None:
        raise WeightsError(f"not a quantized model written by 'peg_core quantize' (no {META_FILE})", path)
    if not text.strip():
        raise WeightsError("the metadata is empty", where)
    try:
        meta = parse_json(text, where, "the metadata")  # nesting limit: one line, never a RecursionError
    except JsonError as e:
        raise WeightsError(e.what, where) from None
    if not isinstance(meta, dict):
        raise WeightsError(f"the metadata is not a JSON object (got {type(meta).__name__})", where)
    for key, (required, want, ok) in META_SCHEMA.items():
        if key not in meta:
            if required:
                raise WeightsError(f"the metadata has no key {key!r} ({want})", where)
        elif not ok(meta[key]):
            raise WeightsError(f"metadata key {key!r} must be {want}; got {str(meta[key])[:60]}", where)
    for key, (want, ok) in DATA_SCHEMA.items():
        data = meta.get("data") or {}
        if key in data and not ok(data[key]):
            raise WeightsError(f"metadata key 'data.{key}' must be {want}; got {str(data[key])[:60]}", where)
    if len(meta["classes"]) != meta["num_classes"]:
        raise WeightsError(
            f"metadata key 'classes' has {len(meta['classes'])} names but 'num_classes' is {meta['num_classes']}",
            where,
        )
    return meta


def load_quantized(path: str | os.PathLike) -> tuple[QuantizedClassifier, dict[str, Any]]:
    """``(model, meta)`` of a file written by :func:`save_quantized`; a :class:`WeightsError` naming it otherwise.

    The archive is checked by :func:`~peg_core.export.pt2.check_pt2_archive` (nothing in it can
    run) and its metadata by :func:`check_meta` before ``torch.export.load`` reads it.
    """
    path = Path(path)
    if not path.is_file():
        raise WeightsError("quantized model not found", path)
    _require_torchao()
    check_pt2_archive(path)
    meta = check_meta(read_extra_file(path, META_FILE), path)
    _import_pt2e()  # registers the quantized_decomposed ops the graph calls
    try:
        with _quiet("torch.export"):  # our one-line error says it; no logged traceback
            program = torch.export.load(path)
    except Exception as e:  # schema errors of a well-formed archive: the file is not ours
        raise WeightsError(
            f"not a quantized model written by 'peg_core quantize' ({type(e).__name__})", path
        ) from None
    grid = tuple(meta.get("grid_range", (MIN_GRID, MAX_GRID)))  # files written before it was recorded
    model = QuantizedClassifier(program.module(), meta["num_classes"], meta["patch_size"], grid)  # type: ignore[arg-type]
    return model, meta
