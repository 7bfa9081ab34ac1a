"""Clip-loading throughput: peg_video's decord dataset vs pytorchvideo's Kinetics (pyav).

Both load training clips of 16 frames at stride 4 (pytorchvideo: the same 61-frame span at
the videos' 30 fps, then ``UniformTemporalSubsample(16)``), scale the short side to 256 and
crop 224, in a DataLoader with 2 workers, from the same files.  Prints clips/s of each, clips/s
per core (clips/s / workers), their ratio to pytorchvideo, and clips per CPU-second (CPU time of
the process and its workers; unlike wall-clock rates it does not change when other programs load
the machine) with its ratio.  Every ratio compares runs in the same process on the same files.

Sources:

* default: generated 320x256 videos (96 frames, x264, key frame every ``--gop`` frames);
* ``--real-size``: generated Kinetics-sized videos, 1280x720 and 640x272 (4 s at 30 fps, a
  panning textured background with moving shapes, so frames carry real detail), measured per
  size; peg_video is also measured with full-size decoding (``decode_short_side=None``) and on
  the copy ``python -m peg_video prepare --short-side 320`` makes of the same files;
* ``--videos-dir DIR``: every video under DIR (e.g. real Kinetics clips), also with the
  prepared copy.

``--quick`` (about 20 s) runs the real-size comparison on two small 640x360 videos.

    python tools/bench_video_loader.py [--videos 12] [--passes 2] [--gop 250] [--out /tmp/bench_videos]
    python tools/bench_video_loader.py --real-size --videos 6 --passes 2
    python tools/bench_video_loader.py --videos-dir /data/k400/val --passes 1
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
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
from peg_video.prepare import VIDEO_EXTS, prepare_tree

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
PREPARED_SHORT_SIDE = 320
#: the sizes of ``--real-size``: Kinetics' common 720p and a 2.35:1 film crop at 272 lines
REAL_SIZES = {"1280x720": (1280, 720), "640x272": (640, 272)}


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


def textured_video(width: int, height: int, frames: int, seed: int) -> np.ndarray:
    """``(T, H, W, 3)`` uint8: a smooth random texture panning 2 px per frame, a bright disc
    crossing it and mild noise; detail at every scale, like a camera video, unlike flat shapes."""
    gen = torch.Generator().manual_seed(seed)
    big = torch.rand(1, 3, height // 8 + 8, (width + 2 * frames) // 8 + 8, generator=gen)
    texture = F.interpolate(big, scale_factor=8, mode="bicubic", align_corners=False)[0].clamp(0, 1)
    texture = (texture * 180 + 30).permute(1, 2, 0).numpy()
    yy, xx = np.mgrid[0:height, 0:width]
    rng = np.random.default_rng(seed)
    out = np.empty((frames, height, width, 3), dtype=np.uint8)
    for t in range(frames):
        frame = texture[:height, 2 * t : 2 * t + width].copy()
        cy, cx = height * (0.3 + 0.4 * t / frames), width * (0.1 + 0.8 * t / frames)
        frame[(yy - cy) ** 2 + (xx - cx) ** 2 < (0.12 * height) ** 2] = (240, 200, 60)
        frame += rng.normal(0, 3, size=(height, width, 1))
        out[t] = frame.clip(0, 255)
    return out


def make_real_size_videos(
    root: Path, count: int, size: tuple[int, int], gop: int, frames: int
) -> Annotations:
    """``count`` textured H.264 videos of ``size`` (4 s at 30 fps by default) in ``root``."""
    records = []
    for i in range(count):
        path = root / f"{size[0]}x{size[1]}_{i:03d}.mp4"
        if not path.is_file():
            write_mp4(path, textured_video(*size, frames, seed=i), FPS, gop=gop)
        records.append(VideoRecord(path, i % len(MOTIONS)))
    return Annotations(records, [m.replace(" ", "_") for m in MOTIONS])


def folder_annotations(root: Path) -> Annotations:
    """Every video under ``root`` (label 0): for timing, labels do not matter."""
    paths = sorted(p for p in root.rglob("*") if p.suffix.lower() in VIDEO_EXTS and p.is_file())
    if not paths:
        raise SystemExit(f"error: no videos ({', '.join(VIDEO_EXTS)}) under: {root}")
    return Annotations([VideoRecord(p, 0) for p in paths], ["any"])


def relocate(ann: Annotations, src: Path, dst: Path) -> Annotations:
    """The same records under the prepared copy ``dst`` of ``src`` (broken ones dropped)."""
    records = [VideoRecord(dst / r.path.relative_to(src), r.label) for r in ann.records]
    return Annotations([r for r in records if r.path.is_file()], ann.classes)


def _cpu_seconds() -> float:
    # This process plus its reaped children: the DataLoader joins its workers after each pass.
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _throughput(loader: DataLoader, passes: int, per_pass) -> tuple[float, int, float]:
    """``(clips/s, clips, clips per CPU-second)``; the last does not depend on the machine's load."""
    clips, t0, c0 = 0, time.perf_counter(), _cpu_seconds()
    for epoch in range(passes):
        per_pass(epoch)
        for batch in loader:
            clips += batch["video"].shape[0]
    return clips / (time.perf_counter() - t0), clips, clips / max(_cpu_seconds() - c0, 1e-9)


def bench_peg(ann: Annotations, passes: int, reduced: bool = True) -> tuple[float, int, float]:
    cfg = ClipTransformConfig(crop=CROP, train_scale=(SHORT_SIDE, SHORT_SIDE), test_scale=SHORT_SIDE)
    ds = KineticsVideoDataset(ann, "train", FRAMES, STRIDE, transform=cfg)
    if not reduced:
        ds.decode_short_side = None  # decode full frames, then scale (the path before decode.py)
    loader = DataLoader(ds, batch_size=1, shuffle=True, num_workers=WORKERS, collate_fn=collate_clips)
    return _throughput(loader, passes, ds.set_epoch)


def bench_pytorchvideo(ann: Annotations, list_path: Path, passes: int) -> tuple[float, int, float]:
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


def compare(name: str, ann: Annotations, prepared: Annotations | None, tmp: Path, passes: int) -> list[dict]:
    """Rows of one source set: pytorchvideo, peg_video full-size and reduced decoding, peg_video
    on the prepared copy."""
    pv, n_pv, cpu_pv = bench_pytorchvideo(ann, tmp / f"list_{name}.txt", passes)
    runs = [("pytorchvideo Kinetics (pyav)", "original", pv, n_pv, cpu_pv)]
    runs.append(("peg_video, full-size decode", "original", *bench_peg(ann, passes, reduced=False)))
    runs.append(("peg_video (decord, reduced decode)", "original", *bench_peg(ann, passes)))
    if prepared is not None and prepared.records:
        runs.append(
            (
                "peg_video (decord, reduced decode)",
                f"prepared {PREPARED_SHORT_SIDE}",
                *bench_peg(prepared, passes),
            )
        )
    return [
        {
            "set": name,
            "loader": loader,
            "files": source,
            "clips_per_s": round(rate, 2),
            "clips_per_s_per_core": round(rate / WORKERS, 2),
            "vs_pytorchvideo": round(rate / pv, 2),
            "clips_per_cpu_s": round(cpu, 2),
            "cpu_vs_pytorchvideo": round(cpu / cpu_pv, 2),
            "clips": clips,
        }
        for loader, source, rate, clips, cpu in runs
    ]


def table(rows: list[dict]) -> str:
    """The rows as a Markdown table (what the README shows)."""
    lines = [
        "| videos | loader | files | clips/s | clips/s per core | vs pytorchvideo | clips per CPU-s | vs pytorchvideo |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['set']} | {r['loader']} | {r['files']} | {r['clips_per_s']:.2f} | "
            f"{r['clips_per_s_per_core']:.2f} | {r['vs_pytorchvideo']:.2f}x | "
            f"{r['clips_per_cpu_s']:.2f} | {r['cpu_vs_pytorchvideo']:.2f}x |"
        )
    return "\n".join(lines)


def _sets(args: argparse.Namespace, root: Path) -> list[tuple[str, Path, Annotations]]:
    """``(name, folder, annotations)`` of each source set to measure."""
    if args.videos_dir is not None:
        return [(args.videos_dir.name or "videos", args.videos_dir, folder_annotations(args.videos_dir))]
    if args.quick:
        folder = root / "640x360"
        folder.mkdir(parents=True, exist_ok=True)
        return [("640x360", folder, make_real_size_videos(folder, 2, (640, 360), args.gop, 72))]
    sets = []
    for name, size in REAL_SIZES.items():
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        sets.append((name, folder, make_real_size_videos(folder, args.videos, size, args.gop, 4 * FPS)))
    return sets


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--videos", type=int, default=12, help="videos per set")
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--gop", type=int, default=250, help="key-frame interval (x264's default is 250)")
    ap.add_argument("--out", type=Path, help="folder for the videos (default: a temporary one)")
    ap.add_argument("--real-size", action="store_true", help="generate 1280x720 and 640x272 sources")
    ap.add_argument("--videos-dir", type=Path, help="measure the videos under this folder instead")
    ap.add_argument("--quick", action="store_true", help="about 20 s: two 640x360 videos, one pass")
    args = ap.parse_args(argv)
    if args.videos_dir is not None and not args.videos_dir.is_dir():
        ap.error(f"--videos-dir: not a folder: {args.videos_dir}")
    torch.set_num_threads(1)
    if not (args.real_size or args.videos_dir or args.quick):
        return _main_small(args)
    passes = 1 if args.quick else args.passes
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = args.out or Path(tmp)
        for name, folder, ann in _sets(args, root):
            dst = Path(tmp) / f"prepared_{name}"
            prepare_tree(folder, dst, PREPARED_SHORT_SIDE, workers=WORKERS, show_progress=False)
            rows += compare(name, ann, relocate(ann, folder, dst), Path(tmp), passes)
    result = {
        "rows": rows,
        "setting": f"{FRAMES}x{STRIDE} clips, short side {SHORT_SIDE}, crop {CROP}, {WORKERS} workers "
        f"(clips/s per core = clips/s / {WORKERS}), {passes} passes, batch 1, {os.cpu_count()} CPUs",
    }
    print(json.dumps(result, indent=1))
    print(table(rows))
    return result


def _main_small(args: argparse.Namespace) -> dict:
    """The original comparison on generated 320x256 videos."""
    with tempfile.TemporaryDirectory() as tmp:
        root = args.out or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        ann = make_videos(root, args.videos, args.gop)
        peg, n_peg, _ = bench_peg(ann, args.passes)
        pv, n_pv, _ = bench_pytorchvideo(ann, root / "list.txt", args.passes)
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
