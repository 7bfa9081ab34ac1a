"""``python -m peg_video prepare SRC DST``: a copy of a Kinetics tree with videos at short side 320.

PySlowFast and mmaction2 train Kinetics from videos resized to a short side of 320 (mmaction2
ships a resize script): decoding a 720p frame costs about nine times a 320p one, and training
never looks at more than 320 pixels.  This command writes that copy:

* every video whose short side is above ``--short-side`` is re-encoded with PyAV (H.264,
  ``yuv420p``, ``--crf``) at that short side, aspect ratio kept, both sides even, every frame
  kept with its timestamp (so frame rate and duration are unchanged), audio dropped (the
  models do not use it); a ``.webm`` keeps its name and is written as Matroska with H.264;
* a video already at or below the short side is copied byte for byte (faster, lossless);
* every other file (CSV and ``path label`` lists, ``classes.json``) is copied; a list or CSV
  holding absolute paths into SRC gets them rewritten to DST (relative paths stay valid as is);
* a video that cannot be read is skipped and listed in ``DST/prepare_report.json``.

Both Kinetics layouts (flat ``split/ID_start_end.mp4`` and ``split/<class>/ID...mp4``) are
handled alike: the folder structure under SRC is reproduced under DST.  Outputs are written to
a hidden temporary name and renamed when complete, so a killed run leaves no half file and a
second run skips every finished one (temporary files of the killed run are removed).  SRC is
only read.

    python -m peg_video prepare k400 k400_320 --short-side 320 --workers 16
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from collections import Counter
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

from peg_core.engine import UserError, ensure_writable, new_parser, nonnegative_int, positive_int, progress
from peg_core.engine.trainer import write_json
from peg_core.errors import require

av = require("av", None, "av", what="peg_video")  # the video encoder / decoder (PyAV)

__all__ = ["VIDEO_EXTS", "PrepareResult", "main", "prepare_tree", "prepare_video", "scaled_size"]

VIDEO_EXTS = (".mp4", ".mkv", ".webm", ".avi", ".mov")
ANNOTATION_EXTS = (".csv", ".txt", ".json")
REPORT_NAME = "prepare_report.json"
_TMP_MARK = ".prepare-tmp"
# Output container by extension; .webm cannot hold H.264, Matroska (its superset) can.
_FORMATS = {".mp4": "mp4", ".mov": "mov", ".mkv": "matroska", ".webm": "matroska", ".avi": "avi"}


@dataclass(frozen=True)
class PrepareResult:
    """What happened to one video: ``action`` is ``encoded``, ``copied``, ``done`` (already
    there from an earlier run) or ``broken`` (``reason`` says why)."""

    path: str
    action: str
    reason: str = ""


def scaled_size(width: int, height: int, short_side: int) -> tuple[int, int]:
    """``(width, height)`` with the short side ``short_side`` (rounded up to even) and the long
    side scaled by the same factor, rounded to the nearest even number (yuv420p needs even sides)."""
    target = short_side + short_side % 2
    short, long = min(width, height), max(width, height)
    new_long = max(2, 2 * round(long * target / short / 2))
    return (new_long, target) if width >= height else (target, new_long)


def _tmp_name(out: Path) -> Path:
    return out.with_name(f".{out.name}.{os.getpid()}{_TMP_MARK}")


def _encode(src: Path, tmp: Path, short_side: int, crf: int, preset: str) -> str:
    """Re-encode ``src`` to ``tmp`` when its short side exceeds ``short_side``; returns the action."""
    with av.open(str(src)) as inp:
        if not inp.streams.video:
            raise ValueError("no video stream")
        vin = inp.streams.video[0]
        vin.thread_count = 1  # the pool is the parallelism
        width, height = vin.codec_context.width, vin.codec_context.height
        if not width or not height:
            raise ValueError("no frame size in the header")
        if min(width, height) <= short_side:
            return "copied"
        new_w, new_h = scaled_size(width, height, short_side)
        rate = vin.average_rate or vin.guessed_rate or 30
        frames = 0
        with av.open(str(tmp), mode="w", format=_FORMATS.get(src.suffix.lower(), "mp4")) as out:
            vout = out.add_stream("libx264", rate=rate)
            vout.width, vout.height, vout.pix_fmt = new_w, new_h, "yuv420p"
            # Source timestamps are kept (same frame rate, duration and variable timing).
            vout.codec_context.time_base = vin.time_base
            vout.thread_count = 1
            vout.options = {"crf": str(crf), "preset": preset}
            for frame in inp.decode(vin):
                small = frame.reformat(width=new_w, height=new_h, format="yuv420p", interpolation="AREA")
                # A container without timestamps (some AVIs): frames at the average rate.
                pts = frame.pts if frame.pts is not None else round(frames / (rate * vin.time_base))
                small.pts, small.time_base = pts, vin.time_base
                for packet in vout.encode(small):
                    out.mux(packet)
                frames += 1
            for packet in vout.encode():
                out.mux(packet)
        if frames == 0:
            raise ValueError("no decodable frames")
    return "encoded"


def prepare_video(
    src: Path, out: Path, short_side: int, crf: int = 20, preset: str = "veryfast"
) -> PrepareResult:
    """Write the prepared copy of one video ``src`` to ``out`` (see the module docstring)."""
    if out.is_file():
        return PrepareResult(str(src), "done")
    if not src.is_file():
        return PrepareResult(str(src), "broken", "missing file")
    if src.stat().st_size == 0:
        return PrepareResult(str(src), "broken", "empty (zero-byte) file")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_name(out)
    try:
        action = _encode(src, tmp, short_side, crf, preset)
        if action == "copied":
            shutil.copyfile(src, tmp)
        os.replace(tmp, out)  # atomic: `out` exists only when complete
    except (av.FFmpegError, ValueError, UnicodeDecodeError, IndexError) as e:
        # FFmpeg errors carry the reason in strerror; their str() repeats the path.
        text = (getattr(e, "strerror", None) or str(e)).strip().splitlines()
        return PrepareResult(
            str(src), "broken", f"undecodable: {text[0][:160] if text else type(e).__name__}"
        )
    finally:
        tmp.unlink(missing_ok=True)
    return PrepareResult(str(src), action)


def _prepare_job(job: tuple[Path, Path, int, int, str]) -> PrepareResult:
    return prepare_video(*job)


def _copy_annotation(src: Path, out: Path, src_root: Path, dst_root: Path) -> bool:
    """Copy a non-video file; CSV/list/JSON text with absolute paths into SRC gets them pointed at
    DST.  Returns whether anything was rewritten."""
    tmp = _tmp_name(out)
    rewritten = False
    text = None
    if src.suffix.lower() in ANNOTATION_EXTS:
        try:
            text = src.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            text = None
    if text is not None:
        for root in {str(src_root), str(src_root.resolve())}:
            if root + os.sep in text:
                text = text.replace(root + os.sep, str(dst_root.resolve()) + os.sep)
                rewritten = True
    if rewritten:
        tmp.write_text(text, encoding="utf-8")
    else:
        shutil.copyfile(src, tmp)
    os.replace(tmp, out)
    return rewritten


def _check_folders(src: Path, dst: Path) -> None:
    if not src.exists():
        raise UserError("source folder not found", src)
    if not src.is_dir():
        raise UserError("source is not a folder", src)
    s, d = src.resolve(), dst.resolve()
    if d == s or s in d.parents:
        raise UserError("output folder is inside the source folder", dst)
    if d in s.parents:
        raise UserError("source folder is inside the output folder", src)
    ensure_writable(dst)


def _pool_context():
    # fork starts workers at once (spawn re-imports torch in each); nothing here runs threads yet.
    try:
        return get_context("fork")
    except ValueError:  # pragma: no cover - platforms without fork
        return get_context("spawn")


def prepare_tree(
    src: str | Path,
    dst: str | Path,
    short_side: int = 320,
    workers: int = 1,
    crf: int = 20,
    preset: str = "veryfast",
    show_progress: bool = True,
) -> dict:
    """Prepare the tree ``src`` into ``dst``; returns the report also written to
    ``dst/prepare_report.json`` (counts per action, broken videos with reasons, settings)."""
    src, dst = Path(src), Path(dst)
    _check_folders(src, dst)
    t0 = time.perf_counter()
    # Temporary files of a killed run: never complete, always safe to remove.
    for stale in dst.rglob(f"*{_TMP_MARK}"):
        stale.unlink(missing_ok=True)
    files = sorted(p for p in src.rglob("*") if p.is_file())
    videos = [p for p in files if p.suffix.lower() in VIDEO_EXTS]
    others = [p for p in files if p.suffix.lower() not in VIDEO_EXTS]
    rewritten = []
    for path in others:
        out = dst / path.relative_to(src)
        out.parent.mkdir(parents=True, exist_ok=True)
        if _copy_annotation(path, out, src, dst):
            rewritten.append(str(out))
    jobs = [(p, dst / p.relative_to(src), short_side, crf, preset) for p in videos]
    results: list[PrepareResult] = []
    bar = lambda it: progress(it, "prepare", total=len(jobs), enable=show_progress)  # noqa: E731
    if workers <= 1 or len(jobs) <= 1:
        results = [r for r in bar(map(_prepare_job, jobs))]
    else:
        with _pool_context().Pool(min(workers, len(jobs))) as pool:
            results = list(bar(pool.imap_unordered(_prepare_job, jobs, chunksize=1)))
    counts = Counter(r.action for r in results)
    broken = sorted(({"path": r.path, "reason": r.reason} for r in results if r.action == "broken"), key=str)
    report = {
        "source": str(src),
        "output": str(dst),
        "short_side": short_side,
        "crf": crf,
        "preset": preset,
        "videos": len(results),
        "encoded": counts["encoded"],
        "copied": counts["copied"],
        "done": counts["done"],
        "broken": {"count": len(broken), "samples": broken},
        "other_files": len(others),
        "rewritten_annotations": rewritten,
        "seconds": round(time.perf_counter() - t0, 2),
    }
    write_json(dst / REPORT_NAME, report)
    return report


def main(argv: list[str]) -> int:
    """The ``prepare`` command."""
    p = new_parser("python -m peg_video prepare", __doc__.split("\n\n")[0])
    p.add_argument("src", type=Path, help="Kinetics tree (videos and annotation files)")
    p.add_argument("dst", type=Path, help="where the prepared copy goes (created)")
    p.add_argument(
        "--short-side", type=positive_int, default=320, help="short side of the copies (default 320)"
    )
    p.add_argument("--workers", type=positive_int, default=max(1, (os.cpu_count() or 2) - 1))
    p.add_argument("--crf", type=nonnegative_int, default=20, help="x264 quality (lower: better, larger)")
    p.add_argument(
        "--preset",
        default="veryfast",
        choices=("ultrafast", "superfast", "veryfast", "faster", "fast", "medium"),
    )
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--debug", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.crf > 51:
        p.error(f"argument --crf: expected an integer in [0, 51], got {a.crf}")
    r = prepare_tree(a.src, a.dst, a.short_side, a.workers, a.crf, a.preset, not a.no_progress)
    print(
        f"prepared {r['videos']} videos in {r['seconds']:.1f}s: {r['encoded']} re-encoded, {r['copied']} copied, "
        f"{r['done']} already done, {r['broken']['count']} broken (listed in {a.dst / REPORT_NAME})"
    )
    return 0
