"""``python -m peg_video prepare SRC DST``: a copy of a Kinetics tree with videos at short side 320.

PySlowFast and mmaction2 train Kinetics from videos resized to a short side of 320 (mmaction2
ships a resize script): decoding a 720p frame costs about nine times a 320p one, and training
never looks at more than 320 pixels.  This command writes that copy:

* every video whose short side is above ``--short-side`` is re-encoded with PyAV (H.264,
  ``yuv420p``, ``--crf``) at that short side, aspect ratio kept, both sides even, every frame
  kept with its timestamp (so frame rate and duration are unchanged), audio dropped (the
  models do not use it); a ``.webm`` keeps its name and is written as Matroska with H.264;
* a video already at or below the short side is copied byte for byte (faster, lossless);
* every other file (CSV and ``path label`` lists, ``classes.json``) is copied; in a ``path label``
  list (``.txt``/``.csv`` that is not a Kinetics CSV) each path is parsed, and an absolute path
  into SRC becomes the same relative path under DST (resolved; other absolute paths and every
  relative path, which is relative to the list's folder and so stays valid, are left as written);
  each field of another CSV and each string value of JSON are treated alike; a Kinetics CSV holds no paths and is copied as is;
* a video that cannot be read is skipped and listed in ``DST/prepare_report.json``.

The settings that change the videos (``--short-side``, ``--crf``, ``--preset``) are recorded in
``DST/prepare_settings.json`` before any video is written.  A later run into the same DST with
other settings is refused with one line naming the recorded and the asked settings, before any
work; ``--overwrite`` removes the earlier run's videos and prepares every video again with the
new settings (with the same settings it changes nothing: the run resumes).  A DST from before
the settings file takes its settings from ``prepare_report.json``.

Both Kinetics layouts (flat ``split/ID_start_end.mp4`` and ``split/<class>/ID...mp4``) are
handled alike: the folder structure under SRC is reproduced under DST.  Outputs are written to
a hidden temporary name and renamed when complete, so a killed run leaves no half file and a
second run skips every finished one (temporary files of the killed run are removed).  SRC is
only read.  Ctrl-C stops the run with one line (``error: interrupted``, exit 130): the worker
processes leave the signal to the main process, which ends them, so they print no traceback.

    python -m peg_video prepare k400 k400_320 --short-side 320 --workers 16

The command's flags are in :func:`peg_video.cli.build_prepare_parser`.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import signal
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

from peg_core.engine import UserError, ensure_writable, progress
from peg_core.engine.trainer import write_json
from peg_core.errors import require
from peg_core.jsonfile import JsonError, parse_json, read_json

from .data.annotations import LIST_LINE, is_kinetics_csv

av = require("av", None, "av", what="peg_video")  # the video encoder / decoder (PyAV)

__all__ = [
    "REPORT_NAME",
    "SETTINGS_NAME",
    "VIDEO_EXTS",
    "PrepareResult",
    "prepare_tree",
    "prepare_video",
    "scaled_size",
]

VIDEO_EXTS = (".mp4", ".mkv", ".webm", ".avi", ".mov")
ANNOTATION_EXTS = (".csv", ".txt", ".json")
REPORT_NAME = "prepare_report.json"
SETTINGS_NAME = "prepare_settings.json"
#: the options that change the prepared videos (recorded in DST, compared on a re-run)
SETTING_KEYS = ("short_side", "crf", "preset")
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


class _PathMap:
    """Maps an absolute path under SRC to the same relative path under DST; ``None`` otherwise."""

    def __init__(self, src_root: Path, dst_root: Path) -> None:
        # SRC as given on the command line (made absolute) and with its links resolved.
        self.roots = sorted({Path(os.path.abspath(src_root)), src_root.resolve()}, key=str)
        self.dst = dst_root.resolve()

    def __call__(self, text: str) -> str | None:
        if not os.path.isabs(text):
            return None  # relative to the annotation file's folder, which DST mirrors
        path = Path(os.path.normpath(text))
        for root in self.roots:
            if path.is_relative_to(root):
                return str(self.dst / path.relative_to(root))
        return None


def _rewrite_list(text: str, mapped: _PathMap) -> str | None:
    """A ``<path> <label>`` (or path-only) list with its absolute paths into SRC mapped; ``None`` when none is."""
    lines, changed = text.splitlines(keepends=True), False
    for i, line in enumerate(lines):
        body = line.rstrip("\r\n")
        if line.lstrip().startswith("#") or not body.strip():
            continue
        new = mapped(body.strip())  # a path alone (test lists)
        if new is not None:
            start = len(body) - len(body.lstrip())
            lines[i] = body[:start] + new + line[len(body.rstrip()) :]
            changed = True
            continue
        match = LIST_LINE.match(body)
        new = mapped(match.group(1)) if match is not None else None
        if new is not None:
            lines[i] = line[: match.start(1)] + new + line[match.end(1) :]
            changed = True
    return "".join(lines) if changed else None


def _rewrite_json(text: str, mapped: _PathMap) -> str | None:
    """JSON with every string value that is an absolute path into SRC mapped; ``None`` when none is."""
    try:  # the one JSON reader: a file nested too deeply is copied as is, never a RecursionError
        data = parse_json(text, "annotation file")
    except JsonError:
        return None
    changed = False

    def walk(x):
        nonlocal changed
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, list):
            return [walk(v) for v in x]
        if isinstance(x, str) and (new := mapped(x)) is not None:
            changed = True
            return new
        return x

    data = walk(data)
    return json.dumps(data, indent=1, ensure_ascii=False) + "\n" if changed else None


def _rewrite_csv(text: str, mapped: _PathMap) -> str | None:
    """A comma-separated list: every field that is an absolute path into SRC mapped."""
    try:
        rows = list(csv.reader(io.StringIO(text)))
    except csv.Error:
        return None
    new_rows = [[mapped(f) or f for f in row] for row in rows]
    if new_rows == rows:
        return None
    out = io.StringIO()
    csv.writer(out, lineterminator="\r\n" if "\r\n" in text else "\n").writerows(new_rows)
    return out.getvalue()


def _rewritten(src: Path, mapped: _PathMap) -> str | None:
    """The annotation file's text with its paths into SRC pointed at DST, or ``None`` (copy as is)."""
    suffix = src.suffix.lower()
    if suffix not in ANNOTATION_EXTS:
        return None
    try:
        text = src.read_bytes().decode("utf-8")  # line ends kept as written (CRLF lists stay CRLF)
    except (UnicodeDecodeError, OSError):
        return None
    if suffix == ".json":
        return _rewrite_json(text, mapped)
    if is_kinetics_csv(src):
        return None  # youtube ids and times, no paths
    if suffix == ".csv" and "," in text.partition("\n")[0]:
        return _rewrite_csv(text, mapped)
    return _rewrite_list(text, mapped)


def _copy_annotation(src: Path, out: Path, src_root: Path, dst_root: Path) -> bool:
    """Copy a non-video file; a list / CSV / JSON with absolute paths into SRC gets them pointed at
    DST (see the module docstring).  Returns whether anything was rewritten."""
    tmp = _tmp_name(out)
    text = _rewritten(src, _PathMap(src_root, dst_root))
    if text is not None:
        tmp.write_bytes(text.encode("utf-8"))
    else:
        shutil.copyfile(src, tmp)
    os.replace(tmp, out)
    return text is not None


def _recorded_settings(dst: Path) -> tuple[dict | None, Path]:
    """The settings of an earlier run into ``dst`` and the file they come from (``None``: no run)."""
    for name in (SETTINGS_NAME, REPORT_NAME):
        path = dst / name
        if path.is_file():
            try:
                data = read_json(path, "settings file")
            except JsonError as e:
                raise UserError(
                    f"cannot read the settings of the earlier run ({e.what}); remove the file", path
                ) from None
            if isinstance(data, dict) and all(k in data for k in SETTING_KEYS):
                return {k: data[k] for k in SETTING_KEYS}, path
    return None, dst / SETTINGS_NAME


def _flags(settings: dict) -> str:
    return " ".join(f"--{k.replace('_', '-')} {settings[k]}" for k in SETTING_KEYS)


def _check_settings(dst: Path, settings: dict, videos: list[Path], src: Path, overwrite: bool) -> None:
    """Refuse a run whose settings differ from the earlier run's into ``dst``, unless ``overwrite``:
    then the earlier videos are removed.  Records ``settings`` in ``dst`` (before any video)."""
    recorded, where = _recorded_settings(dst)
    if recorded is not None and recorded != settings:
        if not overwrite:
            raise UserError(
                f"the output folder was prepared with {_flags(recorded)}, this run asks {_flags(settings)}; "
                "give the same settings, another output folder, or --overwrite to prepare every video again",
                where,
            )
        for video in videos:
            (dst / video.relative_to(src)).unlink(missing_ok=True)
    dst.mkdir(parents=True, exist_ok=True)
    write_json(dst / SETTINGS_NAME, settings)


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


def _worker_ignores_sigint() -> None:
    """Pool initializer: a worker ignores SIGINT, then lets signals through again.

    Ctrl-C in a terminal reaches every process of the group; the main process alone turns it into
    the one-line stop and ends the pool (``Pool.terminate``), so a worker must neither die with a
    ``KeyboardInterrupt`` traceback nor stop on its own.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@contextmanager
def _sigint_held() -> Iterator[None]:
    """SIGINT blocked while the pool starts: a worker inherits the block, so no Ctrl-C reaches it
    before :func:`_worker_ignores_sigint` runs; one that arrived meanwhile reaches the main process
    when the block ends (a ``KeyboardInterrupt`` there, as usual)."""
    if not hasattr(signal, "pthread_sigmask"):  # pragma: no cover - Windows: no signal masks
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def prepare_tree(
    src: str | Path,
    dst: str | Path,
    short_side: int = 320,
    workers: int = 1,
    crf: int = 20,
    preset: str = "veryfast",
    show_progress: bool = True,
    overwrite: bool = False,
) -> dict:
    """Prepare the tree ``src`` into ``dst``; returns the report also written to
    ``dst/prepare_report.json`` (counts per action, broken videos with reasons, settings).

    A ``dst`` prepared earlier with other settings is a :class:`UserError` unless ``overwrite``
    (see the module docstring)."""
    src, dst = Path(src), Path(dst)
    _check_folders(src, dst)
    t0 = time.perf_counter()
    # Temporary files of a killed run: never complete, always safe to remove.
    for stale in dst.rglob(f"*{_TMP_MARK}"):
        stale.unlink(missing_ok=True)
    files = sorted(p for p in src.rglob("*") if p.is_file())
    videos = [p for p in files if p.suffix.lower() in VIDEO_EXTS]
    others = [p for p in files if p.suffix.lower() not in VIDEO_EXTS]
    settings = {"short_side": short_side, "crf": crf, "preset": preset}
    _check_settings(dst, settings, videos, src, overwrite)
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
        with _sigint_held():
            pool = _pool_context().Pool(min(workers, len(jobs)), initializer=_worker_ignores_sigint)
        with pool:  # on Ctrl-C (a KeyboardInterrupt here) the exit terminates the workers
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
