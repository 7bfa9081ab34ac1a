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

:func:`make_synthetic_dataset` writes the same videos in the official layouts of the other
data sets (``python -m peg_video make-data --dataset ssv2|ucf101|hmdb51|folder``, see
:mod:`peg_video.data.datasets` and ``docs/data.md``): SSv2 as VP9 ``.webm`` with
direction templates ("Pushing [something] from left to right"), so a horizontal flip
changes the label; UCF101 / HMDB51 as MPEG-4 ``.avi`` with three splits (every video is its
own group, and split ``k`` tests the videos whose group is ``k`` modulo 3); folder as mp4.

Everything is a deterministic function of ``seed``.
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from peg_core.errors import InputError, require

av = require("av", None, "av", what="peg_video")  # the video encoder / decoder (PyAV)

__all__ = [
    "GENERATOR_VERSION",
    "MOTIONS",
    "FrameSizeError",
    "SyntheticSpec",
    "SyntheticSpecError",
    "make_synthetic_dataset",
    "make_synthetic_kinetics",
    "render_video",
    "write_mp4",
]

#: bumped whenever the same spec and seed start to write different files, so that data kept on disk
#: (the demo's) is regenerated instead of silently giving the old numbers.  2: no B-frames and
#: bit-exact containers (2026-12-03; 1 had x264's adaptive B-frames, not reproducible byte for byte).
GENERATOR_VERSION = 2

# Label names deliberately contain spaces, like Kinetics ("air drumming").
MOTIONS = ("move right", "move left", "move down", "move up", "circle clockwise", "circle counterclockwise")
_ID_CHARS = string.ascii_letters + string.digits + "-_"


class SyntheticSpecError(InputError):
    """A :class:`SyntheticSpec` that cannot make the data set asked for (e.g. too few videos for three splits)."""


class FrameSizeError(InputError):
    """A frame size the encoder (odd sides) or decord (some small sizes) cannot handle."""


@dataclass(frozen=True)
class SyntheticSpec:
    """Size of the generated set.  ``width``/``height`` must be even (yuv420p).

    ``motion_frames``: the number of frames one motion takes (default: the whole video, ``frames``).
    Shorter than ``frames``, the motion keeps its speed past it: a circle keeps turning and a shape
    that moves leaves one side of the frame and comes back at the opposite side (so its direction,
    the label, never changes).  A long video then shows a clip of the training length exactly as a
    ``motion_frames``-frame video does, and a longer clip more of the same action, the clip-length axis
    of the extrapolation study.
    """

    num_train: int = 120
    num_val: int = 60
    width: int = 80
    height: int = 64
    frames: int = 24
    fps: int = 12
    seed: int = 0
    codec: str = "libx264"
    motion_frames: int | None = None


def _draw(
    frame: np.ndarray, kind: int, cy: float, cx: float, r: float, color: np.ndarray, wrap: bool = False
) -> None:
    """Paint a filled square (0), disc (1) or diamond (2) of half-size ``r`` centred at (cy, cx).

    ``wrap``: on a torus (the part past one border shows at the opposite one).
    """
    h, w, _ = frame.shape
    yy, xx = np.mgrid[0:h, 0:w]
    dy, dx = np.abs(yy - cy), np.abs(xx - cx)
    if wrap:
        dy, dx = np.minimum(dy, h - dy), np.minimum(dx, w - dx)
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
    wrap = spec.motion_frames is not None
    # 0 .. 1 over the motion's frames (beyond 1 past them)
    s = np.arange(t) / max(spec.motion_frames - 1, 1) if wrap else np.linspace(0.0, 1.0, t)
    motion = MOTIONS[label]
    if motion.startswith("move"):
        # Travel 45-60 % of the frame from a random start; the cross-axis position is random.
        travel = rng.uniform(0.45, 0.6)
        start = rng.uniform(0.1, 0.9 - travel)
        along = start + travel * s
        across = np.full(t, rng.uniform(0.2, 0.8))
        if motion in ("move left", "move up"):  # the same path backwards (from its end, at the same speed)
            along = start + travel * (1.0 - s) if wrap else along[::-1]
        ys, xs = (across, along) if motion in ("move right", "move left") else (along, across)
        if wrap:  # past the motion's frames: out at one side, in at the other
            ys, xs = ys % 1.0, xs % 1.0
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
        _draw(frame, actor_kind, ys[i], xs[i], r, actor_color, wrap=wrap)
    return video


def write_mp4(
    path: Path, frames: np.ndarray, fps: int, codec: str = "libx264", faststart: bool = False, gop: int = 16
) -> None:
    """Encode ``(T, H, W, 3)`` uint8 RGB frames to an mp4 (no B-frames, so any decoder seeks exactly).

    The same frames give the same bytes (tested): a data set is a function of its seed.

    ``faststart`` puts the index (moov atom) before the frames, as streaming sites do; ``gop``
    is the key-frame interval.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    # bitexact: no muxer version string, and no random segment UID in a WebM, so the file is a
    # function of the frames alone
    options = {"fflags": "+bitexact", **({"movflags": "faststart"} if faststart else {})}
    with av.open(str(path), mode="w", options=options) as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv420p"
        stream.thread_count = 1  # deterministic output
        if codec == "libx264":
            # "bf" (libavcodec's max_b_frames), not x264's own "bframes", which libavcodec does not
            # know and drops silently: x264 then keeps its 3 adaptive B-frames, and with them two
            # encodes of the same frames differed in a few videos per hundred (none with B-frames,
            # mb-tree or the lookahead off), so the data set, and every run on it, changed.
            stream.options = {"crf": "18", "bf": "0", "g": str(gop)}
        elif codec == "libvpx-vp9":  # fast constant-quality VP9 (SSv2's codec)
            stream.options = {"deadline": "realtime", "cpu-used": "8", "crf": "20", "b": "0", "g": str(gop)}
        elif codec == "mpeg4":
            stream.options = {"bf": "0", "g": str(gop)}
        for array in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(array, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def _check_decord(path: Path, spec: SyntheticSpec) -> None:
    """decord 0.6 mis-sizes some frame sizes (e.g. 48x40 comes back with 4 channels): fail early."""
    decord = require("decord", None, "decord", what="peg_video")

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


#: SSv2-style templates of the motions: the direction is in the label, as in the real set
SSV2_TEMPLATES = {
    "move right": "Pushing [something] from left to right",
    "move left": "Pushing [something] from right to left",
    "move down": "Moving [something] down",
    "move up": "Moving [something] up",
    "circle clockwise": "Moving [something] in a circle clockwise",
    "circle counterclockwise": "Moving [something] in a circle counterclockwise",
}
_OBJECTS = ("a box", "a cup", "a pen", "a ball")


def _videos(spec: SyntheticSpec, count: int, rng: np.random.Generator):
    """``count`` balanced ``(index, motion, frames, per-video generator)`` in class-cycling order."""
    for i in range(count):
        motion = MOTIONS[i % len(MOTIONS)]
        vid_rng = np.random.default_rng(rng.integers(2**63))
        yield i, motion, render_video(MOTIONS.index(motion), spec, vid_rng), vid_rng


def _write_ssv2(out: Path, spec: SyntheticSpec, rng: np.random.Generator) -> dict:
    videos = out / "20bn-something-something-v2"
    labels = {t.replace("[", "").replace("]", ""): str(i) for i, t in enumerate(SSV2_TEMPLATES.values())}
    (out / "something-something-v2-labels.json").write_text(json.dumps(labels, indent=1) + "\n")
    next_id = 1
    for subset, num in (("train", spec.num_train), ("validation", spec.num_val)):
        entries = []
        for _, motion, frames, vid_rng in _videos(spec, num, rng):
            thing = str(vid_rng.choice(_OBJECTS))
            template = SSV2_TEMPLATES[motion]
            write_mp4(videos / f"{next_id}.webm", frames, spec.fps, "libvpx-vp9")
            entries.append({
                "id": str(next_id),
                "label": template.replace("[something]", thing).lower(),
                "template": template,
                "placeholders": [thing],
            })  # fmt: skip
            next_id += 1
        (out / f"something-something-v2-{subset}.json").write_text(json.dumps(entries, indent=1) + "\n")
    return {"classes": len(labels), "train": spec.num_train, "val": spec.num_val, "first": videos / "1.webm"}


def _split_of(i: int) -> int:
    """Official split (1-3) whose test list holds synthetic video ``i``: thirds of every class."""
    return (i + i // len(MOTIONS)) % 3 + 1


def _write_ucf101(out: Path, spec: SyntheticSpec, rng: np.random.Generator) -> dict:
    names = sorted("".join(w.capitalize() for w in m.split()) for m in MOTIONS)  # "MoveRight"
    lists = out / "ucfTrainTestlist"
    lists.mkdir(parents=True, exist_ok=True)
    # the official lists are CRLF text
    (lists / "classInd.txt").write_text("".join(f"{i} {n}\r\n" for i, n in enumerate(names, 1)))
    rows = []
    for i, motion, frames, _ in _videos(spec, spec.num_train + spec.num_val, rng):
        name = "".join(w.capitalize() for w in motion.split())
        rel = f"{name}/v_{name}_g{i + 1:02d}_c01.avi"
        write_mp4(out / "UCF-101" / rel, frames, spec.fps, "mpeg4")
        rows.append((rel, names.index(name) + 1, _split_of(i)))
    for k in (1, 2, 3):
        train = "".join(f"{rel} {label}\r\n" for rel, label, test in rows if test != k)
        (lists / f"trainlist0{k}.txt").write_text(train)
        (lists / f"testlist0{k}.txt").write_text("".join(f"{rel}\r\n" for rel, _, test in rows if test == k))
    first = out / "UCF-101" / rows[0][0]
    return {"classes": len(names), "videos": len(rows), "first": first}


def _write_hmdb51(out: Path, spec: SyntheticSpec, rng: np.random.Generator) -> dict:
    splits = out / "testTrainMulti_7030_splits"
    splits.mkdir(parents=True, exist_ok=True)
    lines: dict[str, list[tuple[str, int]]] = {_label_folder(m): [] for m in MOTIONS}
    first = None
    for i, motion, frames, _ in _videos(spec, spec.num_train + spec.num_val, rng):
        cls = _label_folder(motion)
        name = f"synthetic_{cls}_{i:03d}_f_cm_np1_fr_med_0.avi"  # HMDB-style name with its tags
        write_mp4(out / cls / name, frames, spec.fps, "mpeg4")
        first = first or out / cls / name
        lines[cls].append((name, _split_of(i)))
    for cls, videos in lines.items():
        for k in (1, 2, 3):
            text = "".join(
                f"{name} {2 if test == k else 1} \n" for name, test in videos
            )  # trailing space as in the official files
            (splits / f"{cls}_test_split{k}.txt").write_text(text)
    return {"classes": len(lines), "videos": sum(map(len, lines.values())), "first": first}


def _write_folder(out: Path, spec: SyntheticSpec, rng: np.random.Generator) -> dict:
    first = None
    for subset, num in (("train", spec.num_train), ("val", spec.num_val)):
        for i, motion, frames, _ in _videos(spec, num, rng):
            path = out / subset / _label_folder(motion) / f"{subset}_{i:04d}.mp4"
            write_mp4(path, frames, spec.fps, spec.codec)
            first = first or path
    return {"classes": len(MOTIONS), "train": spec.num_train, "val": spec.num_val, "first": first}


_WRITERS = {"ssv2": _write_ssv2, "ucf101": _write_ucf101, "hmdb51": _write_hmdb51, "folder": _write_folder}


def make_synthetic_dataset(out: str | Path, dataset: str, spec: SyntheticSpec = SyntheticSpec()) -> dict:
    """Generate the moving-shapes set under ``out`` in the official layout of ``dataset``.

    ``kinetics`` is :func:`make_synthetic_kinetics`.  For ``ucf101`` / ``hmdb51`` the
    ``num_train + num_val`` videos are all written once and each official split tests a third
    of them.  Returns counts and the root.
    """
    if dataset == "kinetics":
        return make_synthetic_kinetics(out, spec)
    if dataset not in _WRITERS:
        raise ValueError(f"no synthetic layout for data set {dataset!r}")
    out = Path(out)
    if spec.width % 2 or spec.height % 2:
        raise FrameSizeError(
            "width and height must be even for yuv420p", f"--width {spec.width} --height {spec.height}"
        )
    if dataset in ("ucf101", "hmdb51") and spec.num_train + spec.num_val < 3:
        raise SyntheticSpecError(
            "three splits need at least 3 videos", f"--num-train {spec.num_train} --num-val {spec.num_val}"
        )
    out.mkdir(parents=True, exist_ok=True)
    info = _WRITERS[dataset](out, spec, np.random.default_rng(spec.seed))
    _check_decord(info.pop("first"), spec)
    return {"root": str(out), "dataset": dataset, **info}
