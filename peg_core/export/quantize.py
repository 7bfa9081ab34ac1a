"""8-bit post-training quantization of a CPVT classifier with PyTorch's own PT2E flow.

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
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.export import Dim
from torch.utils.data import Dataset

from . import encodings
from .engine import UserError

__all__ = [
    "QUANTIZED_SUFFIX",
    "QuantizedClassifier",
    "build_parser",
    "calibration_batches",
    "has_quantized_ops",
    "load_quantized",
    "main",
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


def _interpolated_table(
    posemb: Tensor,
    new_size: Sequence[int],
    old_size: Sequence[int] | None = None,
    *,
    num_prefix_tokens: int = 0,
    mode: str = "bicubic",
    antialias: bool = False,
    **_: Any,
) -> Tensor:
    """``resize_pos_embed`` without its same-size shortcut (export only).

    The shortcut (``old == new``) is a Python branch on the input size, which ``torch.export``
    would freeze into a guard on the example's grid.  Interpolating to the same size with
    ``align_corners=False`` reads each cell at its own centre (weights 0/1), so the values are
    the table's own; other sizes compute exactly what :func:`peg_core.resize_pos_embed` does.
    """
    from .resize import _MODES

    prefix, grid = posemb[:, :num_prefix_tokens], posemb[:, num_prefix_tokens:]
    b, _, c = grid.shape
    old = tuple(old_size) if old_size is not None else None
    torch_mode = _MODES[2][mode]
    kwargs: dict[str, Any] = {"align_corners": False} if torch_mode in ("bilinear", "bicubic") else {}
    if antialias:
        kwargs["antialias"] = True
    compute = torch.float64 if posemb.dtype == torch.float64 else torch.float32
    grid = grid.to(compute).reshape(b, *old, c).movedim(-1, 1)  # (B, C, H0, W0)
    grid = F.interpolate(grid, size=tuple(new_size), mode=torch_mode, **kwargs)
    grid = grid.movedim(1, -1).reshape(b, -1, c).to(posemb.dtype)
    return torch.cat([prefix, grid], dim=1)


@contextlib.contextmanager
def _export_friendly(model: nn.Module) -> Iterator[None]:
    """Swap size-dependent Python branches for graph ops while ``model`` is exported."""
    if any(isinstance(m, encodings.LearnedPositionEncoding2d) for m in model.modules()):
        with mock.patch.object(encodings, "resize_pos_embed", _interpolated_table):
            yield
    else:
        yield


def _export(model: nn.Module, example: Tensor, patch: int, dynamic: bool) -> torch.export.ExportedProgram:
    shapes = _dynamic_shapes(patch) if dynamic else None
    with _export_friendly(model):
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
    """Import torchao's PT2E flow without its import-time deprecation log line."""
    with _quiet("torch.utils._pytree"):
        import torchao.quantization.pt2e.quantize_pt2e  # noqa: F401


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
    """``(model, meta)`` of a file written by :func:`save_quantized`; a one-line :class:`UserError` otherwise."""
    path = Path(path)
    if not path.is_file():
        raise UserError("quantized model not found", path)
    _import_pt2e()  # registers the quantized_decomposed ops the graph calls

    extra = {META_FILE: ""}
    try:
        with _quiet("torch.export"):  # our one-line error says it; no logged traceback
            program = torch.export.load(path, extra_files=extra)
        meta = json.loads(extra[META_FILE])
    except Exception as e:  # zip, pickle and schema errors alike: the file is not ours
        raise UserError(
            f"not a quantized model written by 'peg_core quantize' ({type(e).__name__})", path
        ) from None
    model = QuantizedClassifier(program.module(), int(meta["num_classes"]), int(meta["patch_size"]))
    return model, meta


# ------------------------------------------------------------------------------------------ command


def build_parser():
    """``python -m peg_core quantize CKPT OUT --calib N [--calib-data PATH] [--img-size S]``."""
    from .engine import new_parser, positive_int

    p = new_parser(
        "python -m peg_core quantize",
        "Int8 post-training quantization (PT2E, x86) of a classify checkpoint; writes a .pt2 file\n"
        "that 'python -m peg_core eval --checkpoint OUT.pt2' evaluates on the CPU.",
    )
    p.add_argument("checkpoint", type=Path, help="checkpoint.pth written by 'peg_core train'")
    p.add_argument("output", type=Path, help="quantized model to write (.pt2)")
    p.add_argument("--calib", type=positive_int, default=256, help="calibration images (default 256)")
    p.add_argument("--calib-data", "--data", dest="calib_data", type=Path,
                   help="ImageFolder root whose train/ images calibrate (default: the checkpoint's data)")  # fmt: skip
    p.add_argument("--img-size", type=positive_int, help="calibration size (default: the training size)")
    p.add_argument("--batch-size", type=positive_int, default=32, help="calibration batch size")
    p.add_argument("--threads", type=positive_int, help="torch intra-op CPU threads")
    p.add_argument("--debug", action="store_true", help="show tracebacks of user errors")
    return p


def _calibration_set(ckpt: dict[str, Any], path: Path, root: Path | None, n: int, size: int) -> Dataset:
    """``n`` training-distribution images at ``size``: the folder's train/ split or generated shapes."""
    from .classify.data import NORMALIZE, FolderImages, ShapeImages, folder_transform, open_image_folder
    from .classify.shapes import CLASS_NAMES, sample_scenes

    meta = ckpt["meta"]
    classes = meta["classes"]
    data = meta.get("data") or {}
    mean, std = meta.get("mean", NORMALIZE["half"][0]), meta.get("std", NORMALIZE["half"][1])
    root = root or (Path(data["path"]) if data.get("kind") == "folder" and data.get("path") else None)
    if root is not None:
        folder = open_image_folder(root)  # one-line errors for a missing or malformed folder
        tf = folder_transform(
            size, False, crop_ratio=float(meta.get("crop_ratio", 0.875)), mean=mean, std=std
        )
        return FolderImages(folder.train, classes, tf)
    if sorted(classes) != sorted(CLASS_NAMES):
        raise UserError("the checkpoint's classes are not the generated shapes; pass --calib-data PATH", path)
    # the training scenes' distribution (make_shape_splits draws them from the run's seed)
    return ShapeImages(sample_scenes(n, int(data.get("seed", 0))), size, mean, std, classes)


def main(argv: Sequence[str] | None = None) -> int:
    """Quantize ``CKPT`` and write ``OUT``; prints the op counts and the written file."""
    from .classify.task import load_model
    from .engine import read_checkpoint
    from .engine.trainer import ensure_writable

    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.output.suffix != QUANTIZED_SUFFIX:
        raise UserError(f"the quantized model is a {QUANTIZED_SUFFIX} file", args.output)
    ckpt = read_checkpoint(args.checkpoint, "classify")
    model = load_model(ckpt, args.checkpoint)
    ensure_writable(args.output.parent)
    size = args.img_size or int(ckpt["meta"].get("img_size", model.img_size[0]))
    dataset = _calibration_set(ckpt, args.checkpoint, args.calib_data, args.calib, size)
    batches = calibration_batches(dataset, args.calib, args.batch_size)
    # export at twice the patch (not the training size): no size is special in the graph
    example = torch.zeros(2, 3, 2 * model.patch_size, 2 * model.patch_size)
    quantized = quantize_int8(model, batches, example)
    meta = {k: v for k, v in ckpt["meta"].items()}
    meta.update(
        source=str(args.checkpoint), epoch=ckpt.get("epoch"), model_config=ckpt.get("model_config"),
        calibration={"images": sum(len(b) for b in batches), "img_size": size,
                     "data": str(args.calib_data) if args.calib_data else None},
    )  # fmt: skip
    save_quantized(quantized, example, args.output, json.loads(json.dumps(meta, default=str)))
    ops = has_quantized_ops(quantized)
    print(f"calibrated on {meta['calibration']['images']} images at {size} px; "
          + ", ".join(f"{k} x{v}" for k, v in sorted(ops.items())))  # fmt: skip
    print(f"wrote {args.output}")
    return 0
