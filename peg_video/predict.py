"""``python -m peg_video predict``: classify video files with a trained checkpoint.

    python -m peg_video predict --checkpoint runs/video/checkpoint.pth a.mp4 b.mp4 [--top-k 5]

Each video is seen as the training run's test views (``--num-clips`` × ``--num-crops``);
the softmax of the views is averaged.  Prints one JSON line per video,
``{"video": path, "top": [{"label": name, "score": p}, ...]}``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from peg_core.engine import (
    BrokenSample,
    UserError,
    device_arg,
    load_model_state,
    new_parser,
    positive_int,
    read_checkpoint,
)

from .data import Annotations, KineticsVideoDataset, VideoRecord
from .data.loaders import transform_config
from .task import build_model, check_clip_fits, checkpoint_run

__all__ = ["build_parser", "main", "predict"]


def build_parser() -> argparse.ArgumentParser:
    p = new_parser("python -m peg_video predict", __doc__)
    p.add_argument("videos", type=Path, nargs="+", help="video files")
    p.add_argument("--checkpoint", type=Path, required=True, help="checkpoint.pth written by train")
    p.add_argument("--top-k", type=positive_int, default=5, help="classes listed per video")
    p.add_argument("--num-frames", type=positive_int, help="frames per clip (default: the training run's)")
    p.add_argument("--num-clips", type=positive_int, help="clips per video (default: the training run's)")
    p.add_argument("--num-crops", type=int, choices=(1, 3), help="crops per clip (default: the run's)")
    p.add_argument("--device", type=device_arg, default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument("--debug", action="store_true", help="show tracebacks of user errors")
    return p


@torch.no_grad()
def predict(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Top-k classes of each of ``args.videos``; a missing or undecodable video is a :class:`UserError`."""
    ckpt = read_checkpoint(args.checkpoint, task="video")
    device = torch.device("cpu" if args.device == "auto" else args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError("CUDA is not available on this machine", f"--device {args.device}")
    config, classes, saved = checkpoint_run(ckpt, args.checkpoint)
    model = build_model(config)
    load_model_state(model, ckpt["model"], args.checkpoint)
    model.to(device).eval()
    run = argparse.Namespace(**{**saved, **{k: v for k, v in vars(args).items() if v is not None}})
    check_clip_fits(model, run)
    records = [VideoRecord(path, 0) for path in args.videos]
    ds = KineticsVideoDataset(
        Annotations(records, classes),
        "test",
        run.num_frames,
        run.stride,
        run.num_clips,
        transform_config(run),
        sampling=getattr(run, "sampling", None) or "stride",  # SSv2 runs sample segments
    )
    results = []
    for i, path in enumerate(args.videos):
        try:
            views = ds[i]["video"]  # (V, C, T, S, S)
        except BrokenSample as e:
            raise UserError(f"cannot read the video ({e.reason})", path) from None
        probs = model(views.to(device)).float().softmax(-1).mean(0)  # (K,)
        top = probs.topk(min(args.top_k, len(classes)))
        results.append({
            "video": str(path),
            "top": [{"label": classes[j], "score": round(s, 4)} for s, j in zip(top.values.tolist(), top.indices.tolist())],
        })  # fmt: skip
    return results


def main(argv: list[str]) -> int:
    for line in predict(build_parser().parse_args(argv)):
        print(json.dumps(line), flush=True)
    return 0
