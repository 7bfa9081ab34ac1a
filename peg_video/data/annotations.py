"""Reading Kinetics annotations: the official CSV and the ``path label`` list.

* Official Kinetics CSV: a header ``label,youtube_id,time_start,time_end,split`` (extra
  columns such as ``is_cc`` are ignored), video files named
  ``{youtube_id}_{time_start:06d}_{time_end:06d}.mp4`` either under a folder per class
  (the folder is the label as written, or with spaces replaced by ``_``) or flat.
* pytorchvideo / mmaction list: one ``<path> <label>`` per line, path relative to
  ``video_root`` (default: the list file's folder); the label is a class index, or a class
  name (quoted when it contains spaces) mapped like the CSV labels.

Class indices come from the sorted normalised label names (quotes stripped, spaces to
``_``), so the same names always give the same indices; :func:`write_class_map` stores the
mapping beside a checkpoint.

Every problem with a file is an :class:`AnnotationError`: one line naming the file (and
line, for a bad row), e.g. ``error: label 'x' is not one of the 6 known classes: val.csv:3``.
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peg_core.errors import InputError
from peg_core.jsonfile import JsonError, read_json

__all__ = [
    "LIST_LINE",
    "VIDEO_EXTS",
    "AnnotationError",
    "Annotations",
    "VideoRecord",
    "check_class_names",
    "is_kinetics_csv",
    "load_annotations",
    "normalize_label",
    "read_class_map",
    "read_json_file",
    "read_kinetics_csv",
    "read_path_label_list",
    "read_text",
    "write_class_map",
]

_CSV_FIELDS = ("label", "youtube_id", "time_start", "time_end")
#: file suffixes taken as videos in class folders
VIDEO_EXTS = (".mp4", ".mkv", ".webm", ".avi")
# "<path> <label>": the label is the last field, or a quoted name that may contain spaces.
#: one ``path label`` line of a list file (the path may hold spaces; the label may be quoted)
LIST_LINE = re.compile(r"""^\s*(.+?)\s+("[^"]*"|'[^']*'|\S+)\s*$""")


class AnnotationError(InputError):
    """A missing, unreadable or malformed annotation / class file; ``where`` is ``file`` or ``file:line``."""


def read_text(path: Path, what: str = "annotation file") -> str:
    """The UTF-8 text of ``path``; missing, not a file or not UTF-8 is an :class:`AnnotationError` naming it."""
    if not path.exists():
        raise AnnotationError(f"{what} not found", path)
    if not path.is_file():
        raise AnnotationError(f"{what} is not a file", path)
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise AnnotationError(f"{what} is not UTF-8 text", path) from None
    except OSError as e:
        raise AnnotationError(f"{what} is not readable ({e.strerror})", path) from None


@dataclass(frozen=True)
class VideoRecord:
    """One annotated video: its file (which may be missing) and class index."""

    path: Path
    label: int


@dataclass(frozen=True)
class Annotations:
    records: list[VideoRecord]
    classes: list[str]

    @property
    def num_classes(self) -> int:
        return len(self.classes)


def normalize_label(raw: str) -> str:
    """``' "air drumming" '`` -> ``'air_drumming'``."""
    return raw.strip().strip("\"'").strip().replace(" ", "_")


def check_class_names(found: list[str], expected: list[str], where: object) -> None:
    """Refuse data whose class names differ from ``expected`` (a checkpoint's), in order.

    Labels are class indices, so a re-ordered or renamed class list would silently remap them;
    the :class:`AnnotationError` names the first differing class with both names (or the counts).
    Used by every reader that takes its class indices from a class list of its own.
    """
    for i, (here, there) in enumerate(zip(found, expected)):
        if here != there:
            raise AnnotationError(
                f"class {i} is {here!r} here but {there!r} in the checkpoint (a renamed or re-ordered class "
                "list would remap the labels)",
                where,
            )
    if len(found) != len(expected):
        raise AnnotationError(f"has {len(found)} classes, the checkpoint {len(expected)}", where)


def _class_index(classes: list[str], name: str, where: str) -> int:
    try:
        return classes.index(name)
    except ValueError:
        raise AnnotationError(
            f"label {name!r} is not one of the {len(classes)} known classes", where
        ) from None


def _find_video(root: Path, raw_label: str, stem: str) -> Path:
    """First existing candidate among class folder (as written / underscored) and flat, any extension."""
    folders = [root / raw_label.strip().strip("\"'"), root / normalize_label(raw_label), root]
    for folder in folders:
        for ext in VIDEO_EXTS:
            if (folder / f"{stem}{ext}").is_file():
                return folder / f"{stem}{ext}"
    return folders[1] / f"{stem}.mp4"  # reported as missing when loaded


def read_kinetics_csv(
    csv_path: str | Path, video_root: str | Path | None = None, classes: list[str] | None = None
) -> Annotations:
    """Parse an official Kinetics CSV.

    Args:
        csv_path: the annotation file.
        video_root: folder holding the videos (default: ``<csv folder>/<split>`` when it exists,
            else the CSV's folder).
        classes: a fixed class list (e.g. the training set's for the validation CSV); by default
            the sorted normalised labels of this file.
    """
    csv_path = Path(csv_path)
    reader = csv.DictReader(read_text(csv_path).splitlines())
    try:
        rows = list(reader)
    except csv.Error as e:
        raise AnnotationError(f"malformed CSV ({e})", csv_path) from None
    if not rows:
        raise AnnotationError("no annotation rows", csv_path)
    missing = [k for k in _CSV_FIELDS if k not in rows[0]]
    if missing:
        raise AnnotationError(
            f"missing columns {missing}; expected a header {','.join(_CSV_FIELDS)},split", csv_path
        )
    if classes is None:
        classes = sorted({normalize_label(r["label"]) for r in rows})
    root = Path(video_root) if video_root is not None else None
    records = []
    for line, row in enumerate(rows, start=2):
        where = f"{csv_path}:{line}"
        if None in row.values() or None in row:  # fewer / more fields than the header
            raise AnnotationError(f"expected {len(reader.fieldnames)} comma-separated fields", where)
        try:
            stem = f"{row['youtube_id']}_{int(row['time_start']):06d}_{int(row['time_end']):06d}"
        except (TypeError, ValueError):
            raise AnnotationError(
                f"time_start/time_end must be integers, got {row['time_start']!r}, {row['time_end']!r}", where
            ) from None
        split_root = root
        if split_root is None:
            split_dir = csv_path.parent / (row.get("split") or "")
            split_root = split_dir if split_dir.is_dir() else csv_path.parent
        label = _class_index(classes, normalize_label(row["label"]), where)
        records.append(VideoRecord(_find_video(split_root, row["label"], stem), label))
    return Annotations(records, list(classes))


def read_path_label_list(
    list_path: str | Path, video_root: str | Path | None = None, classes: list[str] | None = None
) -> Annotations:
    """Parse a ``<path> <label>`` list (paths may contain spaces: the label is the last field)."""
    list_path = Path(list_path)
    root = Path(video_root) if video_root is not None else list_path.parent
    pairs = []
    for line_no, line in enumerate(read_text(list_path).splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = LIST_LINE.match(line)
        if match is None:
            raise AnnotationError(f"expected '<path> <label>', got {line[:80]!r}", f"{list_path}:{line_no}")
        pairs.append((line_no, match.group(1), match.group(2)))
    if not pairs:
        raise AnnotationError("no annotation lines", list_path)
    numeric = all(lab.lstrip("-").isdigit() for _, _, lab in pairs)
    beside = list_path.parent / "classes.json"
    if numeric and classes is not None and beside.is_file():
        # integer labels index the class file next to the list: it must be the given one
        check_class_names(read_class_map(beside), list(classes), beside)
    if classes is None:
        if numeric:
            classes = [str(i) for i in range(max(int(lab) for _, _, lab in pairs) + 1)]
        else:
            classes = sorted({normalize_label(lab) for _, _, lab in pairs})
    records = []
    for line_no, rel, lab in pairs:
        where = f"{list_path}:{line_no}"
        if numeric:
            label = int(lab)
            if not 0 <= label < len(classes):
                raise AnnotationError(f"class index {label} outside [0, {len(classes)})", where)
        else:
            label = _class_index(classes, normalize_label(lab), where)
        path = Path(rel)
        records.append(VideoRecord(path if path.is_absolute() else root / path, label))
    return Annotations(records, list(classes))


def is_kinetics_csv(path: str | Path) -> bool:
    """True when the file starts with the official Kinetics CSV header."""
    first = read_text(Path(path)).partition("\n")[0]
    return first.lower().startswith("label,") or "youtube_id" in first


def load_annotations(
    path: str | Path, video_root: str | Path | None = None, classes: list[str] | None = None
) -> Annotations:
    """Read either format, recognised by the CSV header line.

    ``video_root`` must be an existing folder when given (checked here, before any video is read).
    """
    path = Path(path)
    if video_root is not None and not Path(video_root).is_dir():
        raise AnnotationError("video folder not found", video_root)
    if is_kinetics_csv(path):
        return read_kinetics_csv(path, video_root, classes)
    return read_path_label_list(path, video_root, classes)


def write_class_map(classes: list[str], path: str | Path) -> Path:
    """Write ``{"classes": [...], "index": {name: i}}`` as JSON (kept beside checkpoints)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps({"classes": classes, "index": {c: i for i, c in enumerate(classes)}}, indent=1)
    )
    return path


def read_json_file(path: str | Path, what: str = "annotation file") -> Any:
    """The parsed JSON of ``path`` (:func:`peg_core.jsonfile.read_json`: size and nesting limits, no NaN).

    Missing, unreadable, not UTF-8, not JSON or nested too deeply is an :class:`AnnotationError`
    naming the file, never a ``RecursionError``.
    """
    try:
        return read_json(path, what)
    except JsonError as e:
        raise AnnotationError(e.what, e.where) from None


def read_class_map(path: str | Path) -> list[str]:
    """Class names from :func:`write_class_map` output or a plain JSON list."""
    data = read_json_file(path, "class file")
    names = data.get("classes") if isinstance(data, dict) else data
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise AnnotationError('class file must hold a list of names or {"classes": [...]}', path)
    return list(names)
