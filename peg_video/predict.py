"""``python -m peg_video predict``: classify video files with a trained checkpoint (flags: ``peg_video.cli``).

    python -m peg_video predict --checkpoint runs/video/checkpoint.pth a.mp4 b.mp4 [--top-k 5]

Each video is seen as the training run's test views (``--num-clips`` × ``--num-crops``);
the softmax of the views is averaged.  Prints one JSON line per video,
``{"video": path, "top": [{"label": name, "score": p}, ...]}``.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

from peg_core.engine import BrokenSample, UserError

from .data import Annotations, KineticsVideoDataset, VideoRecord
from .data.loaders import transform_config
from .model import check_clip_fits, load_model

__all__ = ["predict"]


@torch.no_grad()
def predict(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Top-k classes of each of ``args.videos`` (:func:`peg_video.cli.build_predict_parser`).

    A missing or undecodable video is a :class:`UserError`.
    """
    device = torch.device("cpu" if args.device == "auto" else args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError("CUDA is not available on this machine", f"--device {args.device}")
    loaded = load_model(args.checkpoint)
    model, classes = loaded.model.to(device).eval(), loaded.classes
    run = argparse.Namespace(**{**loaded.args, **{k: v for k, v in vars(args).items() if v is not None}})
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
