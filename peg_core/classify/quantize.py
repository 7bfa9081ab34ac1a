"""``python -m peg_core quantize``: int8 PT2E quantization of a classify checkpoint, calibrated on its data.

The task-specific half of quantization: which images calibrate (the checkpoint's ImageFolder
``train/`` split, or the generated shapes of its seed) and the command.  The generic PT2E
machinery is :mod:`peg_core.export.quantize`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from ..engine import (
    UserError,
    add_alias,
    add_overwrite_arg,
    check_output_file,
    image_side,
    new_parser,
    positive_int,
    read_checkpoint,
)
from ..engine.outputs import QUANTIZED
from ..export.quantize import (
    QUANTIZED_SUFFIX,
    calibration_batches,
    has_quantized_ops,
    quantize_int8,
    save_quantized,
)
from .data import NORMALIZE, FolderImages, ShapeImages, folder_transform, open_image_folder
from .model import load_model
from .shapes import CLASS_NAMES, sample_scenes

__all__ = ["build_parser", "main"]


def build_parser():
    """``python -m peg_core quantize CKPT OUT --calib N [--calib-data PATH] [--img-size S]``."""
    p = new_parser(
        "python -m peg_core quantize",
        "Int8 post-training quantization (PT2E, x86) of a classify checkpoint; writes a .pt2 file\n"
        "that 'python -m peg_core eval --checkpoint OUT.pt2' evaluates on the CPU.",
    )
    p.add_argument("checkpoint", type=Path, help="checkpoint.pth written by 'peg_core train'")
    p.add_argument("output", type=Path, help="quantized model to write (.pt2)")
    p.add_argument("--calib", type=positive_int, default=256, help="calibration images (default 256)")
    p.add_argument("--calib-data", type=Path,
                   help="ImageFolder root whose train/ images calibrate (default: the checkpoint's data)")  # fmt: skip
    add_alias(p, "--data", dest="calib_data", type=Path)
    p.add_argument("--img-size", type=image_side, help="calibration size (default: the training size)")
    p.add_argument("--batch-size", type=positive_int, default=32, help="calibration batch size")
    p.add_argument("--threads", type=positive_int, help="torch intra-op CPU threads")
    add_overwrite_arg(p)
    p.add_argument("--debug", action="store_true", help="show tracebacks of user errors")
    return p


def _calibration_set(ckpt: dict[str, Any], path: Path, root: Path | None, n: int, size: int) -> Dataset:
    """``n`` training-distribution images at ``size``: the folder's train/ split or generated shapes."""
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
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.output.suffix != QUANTIZED_SUFFIX:
        raise UserError(f"the quantized model is a {QUANTIZED_SUFFIX} file", args.output)
    # before any work: OUT is not the checkpoint, nor a file other than an earlier quantized model
    check_output_file(args.output, QUANTIZED, inputs=[args.checkpoint], overwrite=args.overwrite)
    ckpt = read_checkpoint(args.checkpoint, "classify")
    model = load_model(ckpt, args.checkpoint).model
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
