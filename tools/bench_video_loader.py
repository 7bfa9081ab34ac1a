"""Clip-loading throughput: peg_video's decord dataset vs pytorchvideo's Kinetics (pyav).

Both load training clips of 16 frames at stride 4 (pytorchvideo: the same 61-frame span at
the videos' 30 fps, then ``UniformTemporalSubsample(16)``), scale the short side to 256 and
crop 224, in a DataLoader with 2 workers, from the same generated 320x256 videos (96 frames,
x264, key frame every ``--gop`` frames).  Prints clips/s of each and their ratio.

    python tools/bench_video_loader.py [--videos 12] [--passes 2] [--gop 250] [--out /tmp/bench_videos]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from peg_video.compat import ensure_pytorchvideo_compat
from peg_video.data import (
    MOTIONS,
    Annotations,
    ClipTransformConfig,
    KineticsVideoDataset,
    SyntheticSpec,
    VideoRecord,
    collate_clips,
)
from peg_video.data.pytorchvideo_data import write_path_label_list
from peg_video.data.synthetic import render_video, write_mp4

ensure_pytorchvideo_compat()
from pytorchvideo.data import Kinetics, make_clip_sampler  # noqa: E402
from pytorchvideo.transforms import (  # noqa: E402
    ApplyTransformToKey,
    Div255,
    ShortSideScale,
    UniformTemporalSubsample,
)
from torchvision.transforms import Compose, RandomCrop  # noqa: E402

FRAMES, STRIDE, SHORT_SIDE, CROP, WORKERS, FPS = 16, 4, 256, 224, 2, 30


def make_videos(root: Path, count: int, gop: int) -> Annotations:
    spec = SyntheticSpec(width=320, height=256, frames=96, fps=FPS)
    rng = np.random.default_rng(0)
    records = []
    for i in range(count):
        path = root / f"video_{i:03d}.mp4"
        if not path.is_file():
            write_mp4(path, render_video(i % len(MOTIONS), spec, rng), FPS, gop=gop)
        records.append(VideoRecord(path, i % len(MOTIONS)))
    return Annotations(records, [m.replace(" ", "_") for m in MOTIONS])


def _throughput(loader: DataLoader, passes: int, per_pass) -> tuple[float, int]:
    clips, t0 = 0, time.perf_counter()
    for epoch in range(passes):
        per_pass(epoch)
        for batch in loader:
            clips += batch["video"].shape[0]
    return clips / (time.perf_counter() - t0), clips


def bench_peg(ann: Annotations, passes: int) -> tuple[float, int]:
    cfg = ClipTransformConfig(crop=CROP, train_scale=(SHORT_SIDE, SHORT_SIDE), test_scale=SHORT_SIDE)
    ds = KineticsVideoDataset(ann, "train", FRAMES, STRIDE, transform=cfg)
    loader = DataLoader(ds, batch_size=1, shuffle=True, num_workers=WORKERS, collate_fn=collate_clips)
    return _throughput(loader, passes, ds.set_epoch)


def bench_pytorchvideo(ann: Annotations, list_path: Path, passes: int) -> tuple[float, int]:
    transform = ApplyTransformToKey(
        "video",
        Compose([UniformTemporalSubsample(FRAMES), Div255(), ShortSideScale(SHORT_SIDE), RandomCrop(CROP)]),
    )
    ds = Kinetics(
        str(write_path_label_list(ann, list_path)),
        clip_sampler=make_clip_sampler("random", (FRAMES - 1) * STRIDE / FPS + 1 / FPS),
        transform=transform,
        decode_audio=False,  # default decoder: pyav
    )
    loader = DataLoader(ds, batch_size=1, num_workers=WORKERS)
    return _throughput(loader, passes, lambda epoch: None)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--videos", type=int, default=12)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--gop", type=int, default=250, help="key-frame interval (x264's default is 250)")
    ap.add_argument("--out", type=Path, help="folder for the videos (default: a temporary one)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.out or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        ann = make_videos(root, args.videos, args.gop)
        peg, n_peg = bench_peg(ann, args.passes)
        pv, n_pv = bench_pytorchvideo(ann, root / "list.txt", args.passes)
    result = {
        "peg_decord_clips_per_s": round(peg, 2),
        "pytorchvideo_pyav_clips_per_s": round(pv, 2),
        "ratio": round(peg / pv, 2),
        "clips": [n_peg, n_pv],
        "setting": f"{args.videos} videos 320x256x96 @ {FPS} fps, gop {args.gop}, {FRAMES}x{STRIDE}, "
        f"short side {SHORT_SIDE}, crop {CROP}, {WORKERS} workers, {args.passes} passes",
    }
    print(json.dumps(result, indent=1))
    print(
        f"peg_video (decord) {peg:.2f} clips/s vs pytorchvideo Kinetics (pyav) {pv:.2f} clips/s: {peg / pv:.2f}x"
    )
    return result


if __name__ == "__main__":
    main()
