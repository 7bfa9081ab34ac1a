"""A small synthetic data set in the Kinetics formats: moving shapes whose class is the motion.

Each video shows one "actor" shape that moves right, left, down, up, or around the frame
centre clockwise / counter-clockwise, plus static distractor shapes.  Start point, speed,
colours and shapes are random, so a single frame is ambiguous (an actor on the left may be
starting a move right or ending a move left): a model has to use the order of frames and
positions to classify.

Layout written under ``out`` (the official Kinetics download layout)::

    out/train.csv, out/val.csv    label,youtube_id,time_start,time_end,split
    out/train.txt, out/val.txt    "<path relative to out> <class index>" per line
    out/classes.json              class names, in index order (sorted label names)
    out/{split}/{label_with_underscores}/{youtube_id}_{start:06d}_{end:06d}.mp4

Everything is a deterministic function of ``seed``.
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass
from pathlib import Path

import av
import numpy as np

from peg_core.engine import UserError

__all__ = [
    "MOTIONS",
    "FrameSizeError",
    "SyntheticSpec",
    "make_synthetic_kinetics",
    "render_video",
    "write_mp4",
]

# Label names deliberately contain spaces, like Kinetics ("air drumming").
MOTIONS = ("move right", "move left", "move down", "move up", "circle clockwise", "circle counterclockwise")
_ID_CHARS = string.ascii_letters + string.digits + "-_"


class FrameSizeError(UserError, ValueError):
    """A frame size the encoder (odd sides) or decord (some small sizes) cannot handle."""


@dataclass(frozen=True)
class SyntheticSpec:
    """Size of the generated set.  ``width``/``height`` must be even (yuv420p)."""

    num_train: int = 120
    num_val: int = 60
    width: int = 80
    height: int = 64
    frames: int = 24
    fps: int = 12
    seed: int = 0
    codec: str = "libx264"


def _draw(frame: np.ndarray, kind: int, cy: float, cx: float, r: float, color: np.ndarray) -> None:
    """Paint a filled square (0), disc (1) or diamond (2) of half-size ``r`` centred at (cy, cx)."""
    h, w, _ = frame.shape
    yy, xx = np.mgrid[0:h, 0:w]
    dy, dx = np.abs(yy - cy), np.abs(xx - cx)
    if kind == 0:
        mask = (dy <= r) & (dx <= r)
    elif kind == 1:
        mask = dy**2 + dx**2 <= r**2
    else:
        mask = dy + dx <= 1.3 * r
    frame[mask] = color


def render_video(label: int, spec: SyntheticSpec, rng: np.random.Generator) -> np.ndarray:
    """Frames ``(T, H, W, 3)`` uint8 of one video of motion class ``label`` (index into MOTIONS)."""
    t, h, w = spec.frames, spec.height, spec.width
    r = rng.uniform(0.13, 0.17) * min(h, w)
    bg = rng.integers(0, 60, size=3)
    actor_color = rng.integers(150, 256, size=3)
    actor_kind = int(rng.integers(0, 3))
    distractors = [
        (
            int(rng.integers(0, 3)),
            rng.uniform(0, h),
            rng.uniform(0, w),
            r * rng.uniform(0.4, 0.8),
            rng.integers(60, 256, size=3),
        )
        for _ in range(int(rng.integers(1, 3)))
    ]
    s = np.linspace(0.0, 1.0, t)
    motion = MOTIONS[label]
    if motion.startswith("move"):
        # Travel 45-60 % of the frame from a random start; the cross-axis position is random.
        travel = rng.uniform(0.45, 0.6)
        start = rng.uniform(0.1, 0.9 - travel)
        along = start + travel * s
        across = np.full(t, rng.uniform(0.2, 0.8))
        if motion in ("move left", "move up"):
            along = along[::-1]
        ys, xs = (across, along) if motion in ("move right", "move left") else (along, across)
        ys, xs = ys * h, xs * w
    else:
        # Three quarters of a turn around the centre, clockwise on screen when y points down.
        phase = rng.uniform(0, 2 * np.pi)
        sign = 1.0 if motion == "circle clockwise" else -1.0
        angle = phase + sign * 1.5 * np.pi * s
        rad = rng.uniform(0.25, 0.32) * min(h, w)
        ys, xs = h / 2 + rad * np.sin(angle), w / 2 + rad * np.cos(angle)
    video = np.empty((t, h, w, 3), dtype=np.uint8)
    for i in range(t):
        frame = video[i]
        frame[:] = bg
        for kind, dy, dx, dr, color in distractors:
            _draw(frame, kind, dy, dx, dr, color)
        _draw(frame, actor_kind, ys[i], xs[i], r, actor_color)
    return video


def write_mp4(
    path: Path, frames: np.ndarray, fps: int, codec: str = "libx264", faststart: bool = False, gop: int = 16
) -> None:
    """Encode ``(T, H, W, 3)`` uint8 RGB frames to an mp4 (no B-frames, so any decoder seeks exactly).

    ``faststart`` puts the index (moov atom) before the frames, as streaming sites do; ``gop``
    is the key-frame interval.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    options = {"movflags": "faststart"} if faststart else {}
    with av.open(str(path), mode="w", options=options) as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv420p"
        stream.thread_count = 1  # deterministic output
        if codec == "libx264":
            stream.options = {"crf": "18", "bframes": "0", "g": str(gop)}
        for array in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(array, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def _check_decord(path: Path, spec: SyntheticSpec) -> None:
    """decord 0.6 mis-sizes some frame sizes (e.g. 48x40 comes back with 4 channels): fail early."""
    import decord

    shape = decord.VideoReader(str(path), num_threads=1)[0].shape
    if tuple(shape) != (spec.height, spec.width, 3):
        raise FrameSizeError(
            f"decord reads the videos as {tuple(shape)} instead of {(spec.height, spec.width, 3)}; "
            "choose another frame size (e.g. 64x48, 80x64)",
            f"--width {spec.width} --height {spec.height}",
        )


def _label_folder(name: str) -> str:
    return name.replace(" ", "_")


def make_synthetic_kinetics(out: str | Path, spec: SyntheticSpec = SyntheticSpec()) -> dict:
    """Generate the set under ``out`` (see module docstring); returns counts and file paths."""
    out = Path(out)
    if spec.width % 2 or spec.height % 2:
        raise FrameSizeError(
            "width and height must be even for yuv420p", f"--width {spec.width} --height {spec.height}"
        )
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(spec.seed)
    names = sorted(MOTIONS)
    (out / "classes.json").write_text(json.dumps([_label_folder(n) for n in names], indent=1) + "\n")
    counts = {}
    for split, num in (("train", spec.num_train), ("val", spec.num_val)):
        csv_lines = ["label,youtube_id,time_start,time_end,split"]
        list_lines = []
        for i in range(num):
            label = MOTIONS[i % len(MOTIONS)]  # balanced classes
            vid_rng = np.random.default_rng(rng.integers(2**63))
            youtube_id = "".join(vid_rng.choice(list(_ID_CHARS), size=11))
            start = int(vid_rng.integers(0, 300))
            end = start + 10
            rel = Path(split) / _label_folder(label) / f"{youtube_id}_{start:06d}_{end:06d}.mp4"
            write_mp4(out / rel, render_video(MOTIONS.index(label), spec, vid_rng), spec.fps, spec.codec)
            if not counts and i == 0:
                _check_decord(out / rel, spec)
            quoted = f'"{label}"' if " " in label else label
            csv_lines.append(f"{quoted},{youtube_id},{start},{end},{split}")
            list_lines.append(f"{rel.as_posix()} {names.index(label)}")
        (out / f"{split}.csv").write_text("\n".join(csv_lines) + "\n")
        (out / f"{split}.txt").write_text("\n".join(list_lines) + "\n")
        counts[split] = num
    return {"root": str(out), "classes": len(names), **counts}
