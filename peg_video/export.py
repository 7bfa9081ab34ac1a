"""``python -m peg_video export CKPT OUT.onnx``: a trained video transformer as ONNX with dynamic sizes.

    python -m peg_video export runs/video/checkpoint.pth video.onnx --num-frames 16 --check

The graph takes ``clips`` ``(B, 3, T, H, W)`` float32, normalised as in
training, and returns ``logits`` ``(B, K)``.  ``B``, the clip length ``T`` and
the crop ``H``, ``W`` are dynamic; ``T``, ``H``, ``W`` must be multiples of the
model's tubelet ``(t, p, p)`` and hold at least two tubelets each.  Every
position encoding (``peg3d``, ``peg3d-factorized``, ``learned``, ``sincos``,
``none``) is computed for the input's grid inside the graph; learned tables
are resized there.  ``--num-frames/--height/--width`` (default: the training
clip) only set the example the graph is traced with.  The class names are
stored in the model's metadata (``peg_classes``, JSON).  X3D checkpoints are
not exported (their pooling is built for one clip size).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from peg_core.engine import (
    UserError,
    ensure_writable,
    load_model_state,
    new_parser,
    positive_int,
    read_checkpoint,
)

from .task import build_model, checkpoint_run

__all__ = ["build_parser", "main"]

MIN_OPSET, MAX_OPSET = 18, 23


def opset_arg(text: str) -> int:
    """``argparse`` type: an ONNX opset the dynamo exporter writes."""
    value = positive_int(text)
    if not MIN_OPSET <= value <= MAX_OPSET:
        raise argparse.ArgumentTypeError(f"expected an opset in {MIN_OPSET}..{MAX_OPSET}, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = new_parser("python -m peg_video export", __doc__)
    p.add_argument("checkpoint", type=Path, help="checkpoint.pth written by train")
    p.add_argument("out", type=Path, help="the .onnx file to write")
    p.add_argument(
        "--opset", type=opset_arg, default=MAX_OPSET - 3, help=f"ONNX opset ({MIN_OPSET}..{MAX_OPSET})"
    )
    p.add_argument(
        "--num-frames", type=positive_int, help="example clip length (default: the training run's)"
    )
    p.add_argument("--height", type=positive_int, help="example crop height (default: the training crop)")
    p.add_argument("--width", type=positive_int, help="example crop width (default: the training crop)")
    p.add_argument("--check", action="store_true", help="run onnxruntime on the example and compare")
    p.add_argument("--debug", action="store_true", help="show tracebacks of user errors")
    return p


def _export(model: nn.Module, example: Tensor, out: Path, dynamic: dict[int, Any], opset: int) -> None:
    """``torch.onnx.export(dynamo=True)``; the exporter's progress lines are shown only if it fails."""
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                model,
                (example,),
                dynamo=True,
                dynamic_shapes=(dynamic,),
                input_names=["clips"],
                output_names=["logits"],
                opset_version=opset,
                verbose=False,
            )
            program.save(str(out))
    except Exception:
        sys.stderr.write(log.getvalue())
        raise


def main(argv: list[str]) -> int:
    import onnx

    args = build_parser().parse_args(argv)
    ckpt = read_checkpoint(args.checkpoint, task="video")
    if args.out.is_dir():
        raise UserError("output is a folder, expected an .onnx file path", args.out)
    ensure_writable(args.out.parent if str(args.out.parent) else Path("."))
    config, classes, _ = checkpoint_run(ckpt, args.checkpoint)
    model = build_model(config)
    if not hasattr(model, "tubelet"):
        raise UserError("export supports the video transformers; X3D is not exported", args.checkpoint)
    load_model_state(model, ckpt["model"], args.checkpoint)
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
    _export(model, example, args.out, dynamic, args.opset)
    proto = onnx.load(str(args.out))
    onnx.helper.set_model_props(proto, {"peg_task": "video", "peg_classes": json.dumps(classes)})
    onnx.save(proto, str(args.out))
    result: dict[str, Any] = {"onnx": str(args.out), "opset": args.opset, "example": list(example.shape)}
    if args.check:
        import onnxruntime as ort

        session = ort.InferenceSession(str(args.out), providers=["CPUExecutionProvider"])
        (got,) = session.run(None, {"clips": example.numpy()})
        with torch.no_grad():
            want = model(example)
        diff = float((torch.from_numpy(got) - want).abs().max())
        result["max_abs_diff"] = diff
        if diff > 1e-4:
            raise UserError(f"onnxruntime outputs differ from PyTorch's by {diff:.2e} (> 1e-4)", args.out)
    print(json.dumps(result))
    return 0
