"""``python -m peg_video export CKPT OUT.onnx``: a trained video transformer as ONNX with dynamic sizes.

    python -m peg_video export runs/video/checkpoint.pth video.onnx --num-frames 16 --check

The graph takes ``clips`` ``(B, 3, T, H, W)`` float32, normalised as in
training, and returns ``logits`` ``(B, K)``.  ``B``, the clip length ``T`` and
the crop ``H``, ``W`` are dynamic; ``T``, ``H``, ``W`` must be multiples of the
model's tubelet ``(t, p, p)`` and hold at least two tubelets each.  Every
position encoding (``peg3d``, ``peg3d-factorized``, ``learned``, ``sincos``,
``none``, ``rope-3d`` and ``peg3d+rope-3d``) is computed for the input's grid inside the graph;
learned tables are resized there, rotary tables rebuilt.  The attentive pool of a V-JEPA 2
classifier (``global_pool="attentive"``, from ``train --init FOLDER``) reads any number of
tokens, so it exports with the same dynamic sizes.  ``--num-frames/--height/--width`` (default: the training
clip) only set the example the graph is traced with.  The class names are
stored in the model's metadata (``peg_classes``, JSON).  X3D checkpoints are
not exported (their pooling is built for one clip size).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch

from peg_core.engine import UserError, image_side, new_parser, positive_int
from peg_core.export.cli import add_export_args, check_output_path
from peg_core.export.onnx import compare_onnxruntime, export_onnx

from .model import load_model

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    p = new_parser("python -m peg_video export", __doc__)
    add_export_args(p)
    p.add_argument(
        "--num-frames", type=positive_int, help="example clip length (default: the training run's)"
    )
    p.add_argument("--height", type=image_side, help="example crop height (default: the training crop)")
    p.add_argument("--width", type=image_side, help="example crop width (default: the training crop)")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    check_output_path(args.out, args.checkpoint, args.overwrite)  # nothing the user owns
    loaded = load_model(args.checkpoint)
    model, classes = loaded.model, loaded.classes
    if not hasattr(model, "tubelet"):
        raise UserError("export supports the video transformers; X3D is not exported", args.checkpoint)
    model.eval()
    tub = model.tubelet
    example_size = (
        args.num_frames or model.num_frames,
        args.height or model.img_size[0],
        args.width or model.img_size[1],
    )
    # Two tubelets per axis at least: an axis of one tubelet would be traced as a constant.
    bad = [
        f"{n}={s}" for n, s, k in zip(("frames", "height", "width"), example_size, tub) if s % k or s < 2 * k
    ]
    if bad:
        raise UserError(
            f"the example clip must be multiples of the tubelet {tub}, at least two per axis; got {', '.join(bad)}",
            "--num-frames/--height/--width",
        )
    example = torch.randn(2, 3, *example_size, generator=torch.Generator().manual_seed(0))
    dim = torch.export.Dim
    dynamic = {
        0: dim("batch", min=1, max=1024),
        2: tub[0] * dim("tubelets_t", min=2, max=512),
        3: tub[1] * dim("tubelets_h", min=2, max=512),
        4: tub[2] * dim("tubelets_w", min=2, max=512),
    }
    metadata = {"peg_task": "video", "peg_classes": json.dumps(classes)}
    export_onnx(model, example, args.out, (dynamic,), "clips", ["logits"], args.opset, metadata)
    result: dict[str, Any] = {"onnx": str(args.out), "opset": args.opset, "example": list(example.shape)}
    if args.check:
        with torch.no_grad():
            want = model(example)
        result["max_abs_diff"] = compare_onnxruntime(args.out, {"clips": example}, (want,))
    print(json.dumps(result))
    return 0
