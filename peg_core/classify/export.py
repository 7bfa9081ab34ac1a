"""``python -m peg_core export CKPT OUT.onnx``: a trained CPVT classifier as ONNX with dynamic sizes.

    python -m peg_core export runs/classify/checkpoint.pth cpvt.onnx --check

The graph takes ``images`` ``(B, 3, H, W)`` float32, normalised as in training (the checkpoint's
mean and std, stored in the metadata as ``peg_mean`` / ``peg_std``), and returns ``logits``
``(B, K)``.  ``B``, ``H`` and ``W`` are dynamic; ``H`` and ``W`` must be multiples of the patch
size and hold at least two patches each.  Every position encoding is computed for the input's grid
inside the graph (a PEG, rotary tables, attention biases; a learned table is resized there), so one
file serves any resolution.  ``--height/--width`` (default: the training size) only set the example
the graph is traced with.  The class names are in the metadata (``peg_classes``, JSON).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

import torch

from ..engine import UserError, image_side, new_parser
from ..export.cli import add_export_args, check_output_path
from ..export.onnx import compare_onnxruntime, export_onnx
from .data import NORMALIZE
from .model import load_model

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """``python -m peg_core export CKPT OUT.onnx [--height H --width W] [--opset N] [--check]``."""
    p = new_parser("python -m peg_core export", __doc__)
    add_export_args(p)
    p.add_argument("--height", type=image_side, help="example image height (default: the training size)")
    p.add_argument("--width", type=image_side, help="example image width (default: the training size)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Export ``CKPT`` to ``OUT``; prints one JSON line (``onnx``, ``opset``, ``example``, ``max_abs_diff``)."""
    args = build_parser().parse_args(argv)
    check_output_path(args.out, args.checkpoint, args.overwrite)  # nothing the user owns is replaced
    loaded = load_model(args.checkpoint)
    model, meta = loaded.model.cpu().eval(), loaded.meta
    patch = int(model.patch_size)
    size = int(meta.get("img_size", model.img_size[0]))
    example_size = (args.height or size, args.width or size)
    # Two patches per side at least: a side of one patch would be traced as a constant.
    bad = [
        f"{n}={s}"
        for n, s in zip(("height", "width"), example_size, strict=True)
        if s % patch or s < 2 * patch
    ]
    if bad:
        raise UserError(
            f"the example image must be multiples of the patch size {patch}, at least two per side; "
            f"got {', '.join(bad)}",
            "--height/--width",
        )
    # Batch 2: a batch of 1 would be traced as a constant (PyTorch specialises sizes 0 and 1).
    example = torch.randn(2, 3, *example_size, generator=torch.Generator().manual_seed(0))
    dim = torch.export.Dim
    dynamic = {
        0: dim("batch", min=1, max=1024),
        2: patch * dim("patches_h", min=2, max=512),
        3: patch * dim("patches_w", min=2, max=512),
    }
    mean, std = meta.get("mean", NORMALIZE["half"][0]), meta.get("std", NORMALIZE["half"][1])
    metadata = {
        "peg_task": "classify",
        "peg_classes": json.dumps(loaded.classes),
        "peg_mean": json.dumps(list(mean)),
        "peg_std": json.dumps(list(std)),
        "peg_img_size": str(size),
    }
    export_onnx(model, example, args.out, (dynamic,), "images", ["logits"], args.opset, metadata)
    result: dict[str, Any] = {"onnx": str(args.out), "opset": args.opset, "example": list(example.shape)}
    if args.check:
        with torch.no_grad():
            want = model(example)
        result["max_abs_diff"] = compare_onnxruntime(args.out, {"images": example}, (want,))
    print(json.dumps(result))
    return 0
