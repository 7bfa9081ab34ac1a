"""Readers of the official split files of SSv2, UCF101 and HMDB51, and of class folders.

Each reader returns the :class:`~peg_video.data.annotations.Annotations` the Kinetics path
uses, so decoding, broken-video skipping and reporting are shared.  A listed video that is
not on disk stays in the records: the dataset skips, counts and lists it like a broken one.

Official formats (as distributed):

* **Something-Something v2** (``--dataset ssv2``): ``something-something-v2-labels.json``
  maps each template without brackets ("Putting something on something") to its class
  index as a string; ``something-something-v2-{train,validation}.json`` are JSON lists of
  ``{"id", "label", "template", "placeholders"}`` where ``template`` keeps the brackets
  ("Putting [something] on [something]").  Videos are ``<id>.webm`` (VP9) in
  ``<root>/20bn-something-something-v2/`` (how the tarball extracts) or in ``<root>``;
  the JSON files are looked up in ``<root>`` then ``<root>/labels``.
* **UCF101** (``--dataset ucf101``): ``ucfTrainTestlist/classInd.txt`` (``1 ApplyEyeMakeup``),
  ``trainlist0{1,2,3}.txt`` (``ApplyEyeMakeup/v_ApplyEyeMakeup_g08_c01.avi 1``, 1-based
  labels) and ``testlist0{1,2,3}.txt`` (path only: the class is the folder); videos in
  ``<root>/UCF-101/<class>/``.  Class folders are matched without regard to case (the
  official lists spell ``HandstandPushups`` where file names say ``HandStandPushups``).
* **HMDB51** (``--dataset hmdb51``): ``<class>_test_split{1,2,3}.txt`` with lines
  ``<video>.avi <flag>`` (1 train, 2 test, 0 unused), in either layout, recognised by its folders:
  the official archives (``testTrainMulti_7030_splits/`` and the videos in ``<root>/<class>/``) or
  mmaction2's (``annotations/`` and ``videos/<class>/``).  Classes are the sorted class names of
  the split files; a class with a split file or a video folder but no file for the asked split is
  refused (it would shift every later class index).
* **folder** (``--dataset folder``): ``<root>/{train,val}/<class>/*.{mp4,webm,avi,mkv}``,
  classes the sorted folder names of ``train`` (as ``torchvision.datasets.ImageFolder``).

Malformed files are :class:`~peg_video.data.annotations.AnnotationError` naming ``file:line``
(or ``file[entry]`` for JSON entries).

SSv2's protocol samples frames by segments (:func:`segment_indices`, as TSN / TSM /
UniFormer do): the video is cut into ``num_frames`` equal segments and one frame is taken
from each, at a random place in training and at the centre in testing.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from .annotations import (
    VIDEO_EXTS,
    AnnotationError,
    Annotations,
    VideoRecord,
    check_class_names,
    read_json_file,
    read_text,
)

__all__ = [
    "DATASETS",
    "SPLIT_DATASETS",
    "load_dataset",
    "read_folder",
    "read_hmdb51",
    "read_ssv2",
    "read_ucf101",
    "segment_indices",
]

#: values of ``--dataset``; ``kinetics`` reads ``--train-ann`` / ``--val-ann`` instead of ``--data-root``
DATASETS = ("kinetics", "ssv2", "ucf101", "hmdb51", "folder")
#: data sets with three official train/test splits (``--split 1|2|3``, ``eval --split all``)
SPLIT_DATASETS = ("ucf101", "hmdb51")

SSV2_DIR = "20bn-something-something-v2"
SSV2_FILES = {"train": "something-something-v2-train.json", "test": "something-something-v2-validation.json"}
SSV2_LABELS = "something-something-v2-labels.json"
UCF_LISTS = "ucfTrainTestlist"
UCF_VIDEOS = "UCF-101"
HMDB_SPLITS = "testTrainMulti_7030_splits"
#: mmaction2's HMDB51 layout: the split files in ``annotations/``, the videos in ``videos/<class>/``
HMDB_MMACTION = ("annotations", "videos")
_HMDB_NAME = re.compile(r"^(.+)_test_split([123])\.txt$")


def _check_subset(subset: str) -> None:
    if subset not in ("train", "test"):
        raise ValueError(f"subset must be 'train' or 'test', got {subset!r}")


def _check_split(split: int) -> None:
    if split not in (1, 2, 3):
        raise ValueError(f"split must be 1, 2 or 3, got {split!r}")


def _lines(path: Path) -> list[tuple[int, str]]:
    """``(line number, stripped text)`` of the non-blank lines (official files use CRLF)."""
    return [(i, s.strip()) for i, s in enumerate(read_text(path).splitlines(), start=1) if s.strip()]


def _fixed_classes(found: list[str], classes: list[str] | None, where: Path) -> list[str]:
    """The data set's own classes; when ``classes`` (a checkpoint's) is given, they must be the same names
    in the same order (:func:`~peg_video.data.annotations.check_class_names`)."""
    if classes is not None:
        check_class_names(found, list(classes), where)
    return list(found)


# ------------------------------------------------------------------------------------------ SSv2


def _ssv2_file(root: Path, name: str) -> Path:
    for folder in (root, root / "labels", root / SSV2_DIR):
        if (folder / name).is_file():
            return folder / name
    raise AnnotationError(f"{name} not found (looked in the root, labels/ and {SSV2_DIR}/)", root)


def _load_json(path: Path) -> object:
    return read_json_file(path)  # an AnnotationError naming the file (limits: peg_core.jsonfile)


def read_ssv2(root: str | Path, subset: str = "train", classes: list[str] | None = None) -> Annotations:
    """Something-Something v2 ``train`` (``-train.json``) or ``test`` (``-validation.json``) entries.

    Class ``i`` is the bracket-free template whose index string in the labels file is ``i``.
    """
    _check_subset(subset)
    root = Path(root)
    labels_path = _ssv2_file(root, SSV2_LABELS)
    table = _load_json(labels_path)
    if not isinstance(table, dict) or not table:
        raise AnnotationError('expected a JSON object {"template": "index", ...}', labels_path)
    index: dict[str, int] = {}
    for template, value in table.items():
        if not (isinstance(value, str | int) and str(value).isdigit()):
            raise AnnotationError(f"index of {template!r} is not an integer string: {value!r}", labels_path)
        index[template] = int(value)
    if sorted(index.values()) != list(range(len(index))):
        raise AnnotationError(f"indices must be 0..{len(index) - 1}, each once", labels_path)
    found = sorted(index, key=index.get)
    classes = _fixed_classes(found, classes, labels_path)
    entries_path = _ssv2_file(root, SSV2_FILES[subset])
    entries = _load_json(entries_path)
    if not isinstance(entries, list):
        raise AnnotationError("expected a JSON list of entries", entries_path)
    if not entries:
        raise AnnotationError("no entries", entries_path)
    videos = root / SSV2_DIR if (root / SSV2_DIR).is_dir() else root
    records = []
    for i, entry in enumerate(entries):
        where = f"{entries_path}[{i}]"
        if not isinstance(entry, dict):
            raise AnnotationError("entry is not a JSON object", where)
        for key in ("id", "template"):
            if key not in entry:
                raise AnnotationError(f"entry has no {key!r} key", where)
        # "Putting [something] on [something]" -> "Putting something on something"
        template = str(entry["template"]).replace("[", "").replace("]", "")
        if template not in index:
            raise AnnotationError(f"template {template!r} is not in {labels_path.name}", where)
        records.append(VideoRecord(videos / f"{entry['id']}.webm", index[template]))
    return Annotations(records, classes)


# ---------------------------------------------------------------------------------------- UCF101


def read_ucf101(
    root: str | Path, subset: str = "train", split: int = 1, classes: list[str] | None = None
) -> Annotations:
    """UCF101 ``trainlist0{split}.txt`` (``subset="train"``) or ``testlist0{split}.txt``."""
    _check_subset(subset)
    _check_split(split)
    root = Path(root)
    lists = root / UCF_LISTS
    ind_path = lists / "classInd.txt"
    found = []
    for line_no, text in _lines(ind_path):
        parts = text.split()
        if len(parts) != 2 or not parts[0].isdigit() or int(parts[0]) != len(found) + 1:
            raise AnnotationError(
                f"expected '<index> <class>' with indices 1, 2, ... in order, got {text[:80]!r}",
                f"{ind_path}:{line_no}",
            )
        found.append(parts[1])
    if not found:
        raise AnnotationError("no classes", ind_path)
    by_folder = {name.lower(): i for i, name in enumerate(found)}
    classes = _fixed_classes(found, classes, ind_path)
    list_path = lists / f"{'trainlist' if subset == 'train' else 'testlist'}0{split}.txt"
    videos = root / UCF_VIDEOS
    records = []
    for line_no, text in _lines(list_path):
        where = f"{list_path}:{line_no}"
        parts = text.split()
        rel = parts[0]
        folder = rel.split("/")[0] if "/" in rel else ""
        if folder.lower() not in by_folder:
            raise AnnotationError(f"class folder {folder!r} of {rel!r} is not in classInd.txt", where)
        label = by_folder[folder.lower()]
        if subset == "train":
            if len(parts) != 2 or not parts[1].isdigit():
                raise AnnotationError(
                    f"expected '<class>/<video>.avi <label 1-{len(found)}>', got {text[:80]!r}", where
                )
            if not 1 <= int(parts[1]) <= len(found):
                raise AnnotationError(f"label {parts[1]} outside 1..{len(found)}", where)
            if int(parts[1]) - 1 != label:
                raise AnnotationError(
                    f"label {parts[1]} is {found[int(parts[1]) - 1]!r}, the folder says {folder!r}", where
                )
        elif len(parts) != 1:
            raise AnnotationError(f"expected '<class>/<video>.avi', got {text[:80]!r}", where)
        records.append(VideoRecord(videos / rel, label))
    if not records:
        raise AnnotationError("no videos listed", list_path)
    return Annotations(records, classes)


# ---------------------------------------------------------------------------------------- HMDB51


def _hmdb51_layout(root: Path) -> tuple[Path, Path]:
    """``(split file folder, video folder)`` of the official layout, else of mmaction2's."""
    if (root / HMDB_SPLITS).is_dir():
        return root / HMDB_SPLITS, root
    annotations, videos = (root / name for name in HMDB_MMACTION)
    if annotations.is_dir() and any(_HMDB_NAME.match(p.name) for p in annotations.iterdir()):
        return annotations, videos
    raise AnnotationError(
        f"split folder {HMDB_SPLITS}/ (official layout) or {HMDB_MMACTION[0]}/<class>_test_split1.txt "
        "(mmaction2 layout) not found",
        root,
    )


def read_hmdb51(
    root: str | Path, subset: str = "train", split: int = 1, classes: list[str] | None = None
) -> Annotations:
    """HMDB51 videos flagged 1 (``subset="train"``) or 2 (``"test"``) in ``*_test_split{split}.txt``,
    in the official layout or mmaction2's (see the module docstring)."""
    _check_subset(subset)
    _check_split(split)
    root = Path(root)
    folder, videos = _hmdb51_layout(root)
    files, named = {}, set()
    for path in folder.iterdir():
        match = _HMDB_NAME.match(path.name)
        if match:
            named.add(match.group(1))
            if int(match.group(2)) == split:
                files[match.group(1)] = path
    if not files:
        raise AnnotationError(f"no <class>_test_split{split}.txt files", folder)
    if videos.is_dir():  # class folders holding videos are classes too
        named |= {
            p.name for p in videos.iterdir()
            if p.is_dir() and p != folder and any(v.suffix.lower() in VIDEO_EXTS for v in p.iterdir())
        }  # fmt: skip
    missing = sorted(named - set(files))
    if missing:  # dropping the class would shift every later class index
        raise AnnotationError(
            f"class {missing[0]!r} has no split file for split {split} (dropping it would shift the "
            "later class indices)",
            folder / f"{missing[0]}_test_split{split}.txt",
        )
    found = sorted(files)
    classes = _fixed_classes(found, classes, folder)
    wanted = "1" if subset == "train" else "2"
    records = []
    for label, name in enumerate(found):
        for line_no, text in _lines(files[name]):
            parts = text.split()
            if len(parts) != 2 or parts[1] not in ("0", "1", "2"):
                raise AnnotationError(
                    f"expected '<video>.avi 0|1|2' (0 unused, 1 train, 2 test), got {text[:80]!r}",
                    f"{files[name]}:{line_no}",
                )
            if parts[1] == wanted:
                records.append(VideoRecord(videos / name / parts[0], label))
    if not records:
        raise AnnotationError(f"no video flagged {wanted} ({subset}) in split {split}", folder)
    return Annotations(records, classes)


# ---------------------------------------------------------------------------------------- folder


def read_folder(root: str | Path, subset: str = "train", classes: list[str] | None = None) -> Annotations:
    """Videos in ``root/{train,val}/<class>/``; classes are the sorted class folders of the split."""
    _check_subset(subset)
    split_dir = Path(root) / ("train" if subset == "train" else "val")
    if not split_dir.is_dir():
        raise AnnotationError("split folder not found", split_dir)
    found = sorted(p.name for p in split_dir.iterdir() if p.is_dir())
    if not found:
        raise AnnotationError("no class folders", split_dir)
    if classes is None:
        classes = found
    records = []
    for name in found:
        if name not in classes:
            raise AnnotationError(
                f"class folder is not one of the {len(classes)} training classes", split_dir / name
            )
        for path in sorted((split_dir / name).iterdir()):
            if path.suffix.lower() in VIDEO_EXTS:
                records.append(VideoRecord(path, classes.index(name)))
    if not records:
        raise AnnotationError(
            f"no {'/'.join(e[1:] for e in VIDEO_EXTS)} videos in the class folders", split_dir
        )
    return Annotations(records, list(classes))


def load_dataset(
    name: str, root: str | Path, subset: str, split: int = 1, classes: list[str] | None = None
) -> Annotations:
    """The ``subset`` (``"train"`` or ``"test"``) of data set ``name`` (one of :data:`DATASETS` but kinetics)."""
    root = Path(root)
    if not root.is_dir():
        raise AnnotationError("data folder not found", root)
    if name == "ssv2":
        return read_ssv2(root, subset, classes)
    if name == "ucf101":
        return read_ucf101(root, subset, split, classes)
    if name == "hmdb51":
        return read_hmdb51(root, subset, split, classes)
    if name == "folder":
        return read_folder(root, subset, classes)
    raise ValueError(f"no reader for data set {name!r}")


# -------------------------------------------------------------------------------------- sampling


def segment_indices(
    video_len: int,
    num_segments: int,
    rng: np.random.Generator | None = None,
    num_clips: int = 1,
) -> np.ndarray:
    """Frame indices of segment-based sampling (TSN / TSM).

    The video is cut into ``num_segments`` equal segments ``[i L / T, (i + 1) L / T)`` and
    one frame is taken from each.  With ``rng`` (training) the place in each segment is
    uniform at random: ``(T,)`` indices ``floor((i + u_i) L / T)``.  Without it (testing),
    clip ``k`` of ``num_clips`` takes the place ``(k + 0.5) / num_clips`` of each segment
    (the centre for one clip): ``(num_clips, T)`` indices.  A video shorter than ``T``
    frames repeats frames, in order.
    """
    if video_len < 1:
        raise ValueError("video has no frames")
    if num_segments < 1 or num_clips < 1:
        raise ValueError(f"num_segments and num_clips must be >= 1, got {num_segments}, {num_clips}")
    seg = video_len / num_segments
    starts = np.arange(num_segments, dtype=np.float64)
    if rng is not None:
        places = starts + rng.random(num_segments)
    else:
        places = starts[None, :] + ((np.arange(num_clips) + 0.5) / num_clips)[:, None]
    return np.minimum(np.floor(places * seg).astype(np.int64), video_len - 1)
