"""Detection data as users have it: the layout of ``--data-root``, detected, and each split as COCO annotations.

:func:`detect_layout` looks at ``--data-root`` (and the explicit flags) and returns a
:class:`DataLayout`; :meth:`DataLayout.split` gives a split's image folder and its checked
annotations (:class:`DataSplit`, a :class:`~peg_detr.data.annotations.CocoAnnotations` as
:func:`~peg_detr.data.annotations.load_coco_annotations` returns, built in memory for the converted
formats: nothing is written into the data folder), and :meth:`DataLayout.describe` the one line a run
prints.  Four layouts:

* ``coco``: COCO 2017's own folders, ``train2017/``, ``val2017/``,
  ``annotations/instances_{train,val}2017.json``; ``--train-json`` / ``--val-json`` name other json
  files (absolute, or relative to the root).
* ``roboflow``: a Roboflow COCO export, ``train/``, ``valid/`` (and ``test/``, not read), each holding
  its images and ``_annotations.coco.json``.  Roboflow's category 0 names the data set (no
  annotations, supercategory ``none``; the real classes have its name as supercategory): it is not a
  class and is dropped (:func:`drop_filler_category`), which the line says.
* ``yolo``: an ultralytics YOLO set, ``data.yaml`` (or ``--data-root`` naming the yaml itself) with
  ``train`` / ``val`` (image folders, ``.txt`` lists of images, or lists of those; relative to the
  yaml's ``path``, itself relative to the yaml's folder) and ``names`` (a list, or a dict
  index -> name; ``nc``, when given, must agree).  An image's label file is its path with the last
  ``images`` component replaced by ``labels`` and the extension by ``.txt``; each row
  ``class cx cy w h`` is normalised by the image's width / height and becomes the COCO box
  ``[(cx - w/2) W, (cy - h/2) H, w W, h H]`` in pixels, category id = class index.  An image without a
  label file, or with an empty one, has no objects.  A bad row (a class index not in ``names``, a
  field count other than 5, a non-number, a box outside the image) makes its image a broken sample
  (``CocoAnnotations.broken``: skipped, counted and listed in ``report.json``), never an error.
* ``explicit``: ``--train-ann FILE --train-images DIR`` / ``--val-ann FILE --val-images DIR``, a COCO
  json and the folder its ``file_name`` entries are relative to, per split; they override the
  detected layout for their split (with both splits explicit, ``--data-root`` is not needed).

The validation split is ``val2017`` / ``valid`` / the yaml's ``val``.  A folder whose layout cannot be
told is one :class:`DataLayoutError` naming the folder and what was looked for.

:func:`write_layout` re-exports a COCO-layout set (the synthetic shapes) as a Roboflow export or a YOLO
set (``python -m peg_detr make-data --layout roboflow|yolo``): the same images, byte for byte.
"""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image, UnidentifiedImageError

from peg_core.errors import require
from peg_core.jsonfile import read_json

from .annotations import (
    CocoAnnotations,
    CocoDataError,
    box_outside_image,
    check_coco_annotations,
    load_coco_annotations,
)
from .coco import resolve_coco_paths

__all__ = [
    "LAYOUTS",
    "ROBOFLOW_JSON",
    "YOLO_IMAGE_SUFFIXES",
    "YOLO_YAML_NAMES",
    "DataLayout",
    "DataLayoutError",
    "DataSplit",
    "detect_layout",
    "drop_filler_category",
    "layout_from_args",
    "read_yolo_split",
    "write_layout",
    "yolo_label_path",
]

#: the layouts :func:`detect_layout` tells apart (``explicit``: both splits from the flags)
LAYOUTS = ("coco", "roboflow", "yolo", "explicit")
SPLITS = ("train", "val")
#: a Roboflow COCO export's annotation file, in each split folder
ROBOFLOW_JSON = "_annotations.coco.json"
#: Roboflow's split folders: validation is ``valid`` (``val`` is read too)
_ROBOFLOW_DIRS = {"train": ("train",), "val": ("valid", "val")}
#: the names of a YOLO set's yaml looked for in ``--data-root``
YOLO_YAML_NAMES = ("data.yaml", "data.yml", "dataset.yaml", "dataset.yml")
#: files taken as images in a YOLO image folder (those PIL reads of ultralytics' IMG_FORMATS)
YOLO_IMAGE_SUFFIXES = (".bmp", ".jpeg", ".jpg", ".mpo", ".png", ".tif", ".tiff", ".webp")
_YOLO_SPLIT_KEYS = {"train": "train", "val": "val"}
_TITLES = {
    "coco": "COCO layout",
    "roboflow": "Roboflow COCO export",
    "yolo": "ultralytics YOLO set",
    "explicit": "explicit files",
}
_LOOKED_FOR = (
    "train2017/, val2017/ or annotations/ (COCO), train/ or valid/ with _annotations.coco.json "
    f"(Roboflow COCO export), {' or '.join(YOLO_YAML_NAMES[:2])} (ultralytics YOLO); or give "
    "--train-ann/--train-images and --val-ann/--val-images"
)


class DataLayoutError(CocoDataError):
    """A data folder whose layout cannot be used: ``what`` says why, ``where`` names the folder or file."""


@dataclass(frozen=True)
class DataSplit:
    """One split of a data set, as the detection task reads it.

    Attributes:
        split: ``"train"`` or ``"val"``.
        images: the folder the annotations' ``file_name`` entries are relative to.
        annotations: the checked annotations (``broken``: ``{image_id: reason}``).
        source: the file they come from (a COCO json, or a YOLO set's yaml), for messages.
    """

    split: str
    images: Path
    annotations: CocoAnnotations
    source: Path


@dataclass
class _SplitSpec:
    """How to read one split: its image folder, the file it is described by and the reader."""

    images: Path
    source: Path
    shown: str  # how the line names it, e.g. "train2017/ + annotations/instances_train2017.json"
    read: Callable[[], tuple[CocoAnnotations, str | None]]  # (annotations, a note for the line or None)


@dataclass
class DataLayout:
    """A data set's layout and how to read each split (:func:`detect_layout`).

    Attributes:
        kind: one of :data:`LAYOUTS`.
        root: ``--data-root`` (``None`` with both splits explicit).
    """

    kind: str
    root: Path | None
    specs: dict[str, _SplitSpec]
    explicit: tuple[str, ...] = ()  # the splits given by --{split}-ann / --{split}-images
    title: str = ""  # how the line names the layout (default: the kind's name)
    _loaded: dict[str, DataSplit] = field(default_factory=dict)
    _notes: dict[str, str] = field(default_factory=dict)

    def split(self, name: str) -> DataSplit:
        """Split ``name`` (``train`` / ``val``), read and checked once; a :class:`DataLayoutError` when it has none."""
        if name not in self._loaded:
            if name not in self.specs:
                raise DataLayoutError(
                    f"the {self.title or _TITLES[self.kind]} has no {name} split (or give --{name}-ann/--{name}-images)",
                    self.root,
                )
            spec = self.specs[name]
            annotations, note = spec.read()
            self._loaded[name] = DataSplit(name, spec.images, annotations, spec.source)
            if note:
                self._notes[name] = note
        return self._loaded[name]

    def describe(self) -> str:
        """The run's line, e.g. ``data: Roboflow COCO export (train/, valid/); its category 0 ...``.

        It names the splits read so far (:meth:`split`) and what reading them found.
        """
        names = [s for s in SPLITS if s in self._loaded] or [s for s in SPLITS if s in self.specs]
        title = self.title or _TITLES[self.kind]
        if self.kind != "explicit" and self.explicit:
            title += f" in {self.root}"
        shown = ", ".join(
            (f"{s}: --{s}-ann {self.specs[s].source} --{s}-images {self.specs[s].images}")
            if s in self.explicit
            else self.specs[s].shown
            for s in names
        )
        notes = list(dict.fromkeys(self._notes[s] for s in names if s in self._notes))
        return f"data: {title} ({shown})" + "".join(f"; {n}" for n in notes)


# ------------------------------------------------------------------------------------------ detection


def layout_from_args(args: Any, splits: tuple[str, ...] = SPLITS) -> DataLayout:
    """:func:`detect_layout` from a command's parsed flags (``data_root``, ``train_json``, ``train_ann`` ...).

    ``splits``: the splits the command reads (``eval``: ``("val",)``); the other split's flags are
    not needed.
    """
    flags = {f"{s}_{k}": getattr(args, f"{s}_{k}", None) for s in splits for k in ("json", "ann", "images")}
    return detect_layout(getattr(args, "data_root", None), splits=splits, **flags)


def detect_layout(
    data_root: str | os.PathLike | None,
    *,
    train_json: str | os.PathLike | None = None,
    val_json: str | os.PathLike | None = None,
    train_ann: str | os.PathLike | None = None,
    train_images: str | os.PathLike | None = None,
    val_ann: str | os.PathLike | None = None,
    val_images: str | os.PathLike | None = None,
    splits: tuple[str, ...] = SPLITS,
) -> DataLayout:
    """The layout of ``data_root`` (see the module docstring); nothing is read but folder listings and the yaml.

    Args:
        data_root: ``--data-root``: a folder, or a YOLO set's yaml file; ``None`` when every split of
            ``splits`` is explicit.
        train_json, val_json: ``--train-json`` / ``--val-json`` of the COCO layout.
        train_ann, train_images, val_ann, val_images: the explicit form, a COCO json and its image
            folder per split (both or neither).
        splits: the splits needed.

    Raises:
        DataLayoutError: a one-line error naming the folder or flag (a missing folder or file, a
            layout that cannot be told, flags that contradict each other).
    """
    given = {"train": (train_json, train_ann, train_images), "val": (val_json, val_ann, val_images)}
    explicit: dict[str, _SplitSpec] = {}
    for s in splits:
        json_path, ann, images = given[s]
        if (ann is None) != (images is None):
            have, need = (
                (f"--{s}-ann", f"--{s}-images") if images is None else (f"--{s}-images", f"--{s}-ann")
            )
            raise DataLayoutError(
                f"{have} needs {need} (a COCO json and the folder of its images)", ann or images
            )
        if ann is not None:
            if json_path is not None:
                raise DataLayoutError(
                    f"--{s}-json and --{s}-ann both name the {s} annotations (--{s}-ann with --{s}-images "
                    "is the general form; give one)",
                    json_path,
                )
            explicit[s] = _explicit_spec(s, Path(ann), Path(images))
    if len(explicit) == len(splits):  # nothing to detect (--data-root, when given, is not read)
        return DataLayout(
            "explicit", None if data_root is None else Path(data_root), explicit, tuple(explicit)
        )
    if data_root is None:
        missing = [s for s in splits if s not in explicit]
        raise DataLayoutError(
            f"--data-root is required (or --{missing[0]}-ann with --{missing[0]}-images)", None
        )
    root = Path(data_root)
    if root.is_file() and root.suffix.lower() in (".yaml", ".yml"):
        kind, specs = "yolo", _yolo_specs(root, root.parent)
    elif not root.is_dir():
        raise DataLayoutError("--data-root folder not found", root)
    elif any(given[s][0] is not None for s in splits) or _looks_coco(root):
        kind, specs = "coco", _coco_specs(root, {s: given[s][0] for s in splits}, splits, explicit)
    elif any((root / d / ROBOFLOW_JSON).is_file() for ds in _ROBOFLOW_DIRS.values() for d in ds):
        kind, specs = "roboflow", _roboflow_specs(root, splits, explicit)
    elif (yaml_path := next((root / n for n in YOLO_YAML_NAMES if (root / n).is_file()), None)) is not None:
        kind, specs = "yolo", _yolo_specs(yaml_path, root)
    else:
        raise DataLayoutError(f"no detection data layout found (looked for {_LOOKED_FOR})", root)
    title = _TITLES[kind] + (f" {Path(next(iter(specs.values())).source).name}" if kind == "yolo" else "")
    for s in splits:
        if s not in specs and s not in explicit:  # said before any split is read
            what = f"names no '{_YOLO_SPLIT_KEYS[s]}' split" if kind == "yolo" else f"has no {s} split"
            raise DataLayoutError(f"the {title} {what} (or give --{s}-ann/--{s}-images)", root)
    specs = {s: specs[s] for s in splits if s in specs}
    specs.update(explicit)
    return DataLayout(kind, root, specs, tuple(explicit), title)


def _looks_coco(root: Path) -> bool:
    return any((root / d).is_dir() for d in ("train2017", "val2017", "annotations"))


def _explicit_spec(split: str, ann: Path, images: Path) -> _SplitSpec:
    if not ann.is_file():
        raise DataLayoutError(f"annotation file not found (--{split}-ann)", ann)
    if not images.is_dir():
        raise DataLayoutError(f"image folder not found (--{split}-images)", images)
    return _SplitSpec(
        images, ann, f"{split}: {ann} on {images}", lambda: _read_coco_json(ann, drop_filler=True)
    )


def _coco_specs(
    root: Path, jsons: dict[str, Any], splits: tuple[str, ...], explicit: Mapping[str, _SplitSpec]
) -> dict[str, _SplitSpec]:
    specs = {}
    for s in splits:
        if s in explicit:
            continue
        img_dir, ann = resolve_coco_paths(root, s, jsons[s])
        if not ann.is_file():
            raise DataLayoutError("annotation file not found" + (f" (--{s}-json)" if jsons[s] else ""), ann)
        if not img_dir.is_dir():
            raise DataLayoutError(f"image folder of the {s} split not found", img_dir)
        shown = f"{img_dir.name}/ + {_relative(ann, root)}"
        specs[s] = _SplitSpec(img_dir, ann, shown, lambda ann=ann: (load_coco_annotations(ann), None))
    return specs


def _roboflow_specs(
    root: Path, splits: tuple[str, ...], explicit: Mapping[str, _SplitSpec]
) -> dict[str, _SplitSpec]:
    specs = {}
    for s in splits:
        if s in explicit:
            continue
        found = next((root / d for d in _ROBOFLOW_DIRS[s] if (root / d / ROBOFLOW_JSON).is_file()), None)
        if found is None:
            wanted = " or ".join(f"{d}/{ROBOFLOW_JSON}" for d in _ROBOFLOW_DIRS[s])
            raise DataLayoutError(
                f"the Roboflow COCO export has no {s} split ({wanted} not found; or give --{s}-ann/--{s}-images)",
                root,
            )
        ann = found / ROBOFLOW_JSON
        specs[s] = _SplitSpec(
            found, ann, f"{found.name}/", lambda ann=ann: _read_coco_json(ann, drop_filler=True)
        )
    return specs


def _relative(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


# ----------------------------------------------------------------------------------- Roboflow's filler


def drop_filler_category(doc: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """``(doc without it, the category)`` when category 0 names the data set rather than a class; else ``(doc, None)``.

    A Roboflow export lists the data set's name as category 0: no annotation uses it, its
    supercategory is ``none``, and the real classes have its name as their supercategory.  It is
    dropped only when no annotation uses it and either its supercategory is ``none`` or it is the
    supercategory of every other category (of which there is at least one); a category 0 that is a
    class (a set whose ids start at 0) is kept.  ``doc`` is not modified.
    """
    cats = doc.get("categories")
    anns = doc.get("annotations") or []
    if not isinstance(cats, list) or not isinstance(anns, list):
        return doc, None
    zero = [c for c in cats if isinstance(c, dict) and c.get("id") == 0 and not isinstance(c.get("id"), bool)]
    others = [c for c in cats if isinstance(c, dict) and c not in zero]
    if len(zero) != 1 or not others:
        return doc, None
    filler = zero[0]
    if any(isinstance(a, dict) and a.get("category_id") == 0 for a in anns):
        return doc, None
    name = filler.get("name")
    if str(filler.get("supercategory", "")).strip().lower() != "none" and not (
        name is not None and all(c.get("supercategory") == name for c in others)
    ):
        return doc, None
    return {**doc, "categories": [c for c in cats if c is not filler]}, filler


def _read_coco_json(path: Path, drop_filler: bool) -> tuple[CocoAnnotations, str | None]:
    doc = read_json(path, "annotation file")  # a JsonError (an InputError) names the file
    filler = None
    if drop_filler and isinstance(doc, dict):
        doc, filler = drop_filler_category(doc)
    note = (
        f"its category 0 {str(filler.get('name', ''))!r} names the data set and is not a class"
        if filler is not None
        else None
    )
    return check_coco_annotations(doc, path), note


# ----------------------------------------------------------------------------------------------- YOLO


def _read_yaml(path: Path) -> dict[str, Any]:
    yaml = require("yaml", None, "pyyaml", what="reading a YOLO data set's yaml")
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise DataLayoutError(f"cannot read the YOLO yaml ({e})", path) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else path
        raise DataLayoutError(
            f"the YOLO yaml is not valid YAML ({getattr(e, 'problem', None) or e})", where
        ) from None
    if not isinstance(doc, dict):
        raise DataLayoutError(
            f"the YOLO yaml is not a mapping of keys (path, train, val, names; its top level is a {type(doc).__name__})",
            path,
        )
    return doc


def _yolo_names(doc: dict[str, Any], path: Path) -> dict[int, str]:
    """``{class index: name}`` from ``names`` (a list, or a dict index -> name), checked against ``nc``."""
    if "names" not in doc:
        raise DataLayoutError("the YOLO yaml has no 'names' (a list of class names, or index: name)", path)
    raw = doc["names"]
    if isinstance(raw, list):
        names = dict(enumerate(raw))
    elif isinstance(raw, dict):
        names = {}
        for k, v in raw.items():
            index = k if isinstance(k, int) and not isinstance(k, bool) else None
            if isinstance(k, str) and k.strip().isdigit():
                index = int(k)
            if index is None or index < 0:
                raise DataLayoutError(
                    f"the YOLO yaml's names has key {k!r} (want a class index 0, 1, ...)", path
                )
            names[index] = v
    else:
        raise DataLayoutError(
            f"the YOLO yaml's names is a {type(raw).__name__} (want a list of names, or index: name)", path
        )
    if not names:
        raise DataLayoutError("the YOLO yaml's names is empty", path)
    bad = [v for v in names.values() if not isinstance(v, str | int | float) or isinstance(v, bool)]
    if bad:
        raise DataLayoutError(f"the YOLO yaml's names holds {bad[0]!r} (want a name)", path)
    if "nc" in doc:
        nc = doc["nc"]
        if not isinstance(nc, int) or isinstance(nc, bool) or nc != len(names):
            raise DataLayoutError(
                f"the YOLO yaml's nc {nc!r} does not agree with its {len(names)} names", path
            )
    return {i: str(v) for i, v in sorted(names.items())}


def _yolo_base(doc: dict[str, Any], yaml_path: Path) -> Path:
    """The folder the splits are relative to: the yaml's ``path`` (relative to the yaml's folder), else that folder."""
    folder = yaml_path.parent
    value = doc.get("path")
    if value in (None, ""):
        return folder
    if not isinstance(value, str):
        raise DataLayoutError(f"the YOLO yaml's path is {value!r} (want a folder)", yaml_path)
    base = Path(value).expanduser()
    if not base.is_absolute():
        base = folder / base
    if not base.is_dir():
        raise DataLayoutError("the YOLO yaml's path folder not found", base)
    return base


def _yolo_entry(base: Path, entry: str) -> Path:
    """An entry of ``train`` / ``val`` relative to ``base``; ``../x`` missing there is read as ``x``.

    (Roboflow's YOLO exports write ``train: ../train/images`` for a ``train/`` beside the yaml, which
    ultralytics reads the same way.)
    """
    p = Path(entry).expanduser()
    if p.is_absolute():
        return p
    found = base / p
    if not found.exists() and entry.startswith("../"):
        found = base / entry[3:]
    return found


def _yolo_specs(yaml_path: Path, root: Path) -> dict[str, _SplitSpec]:
    doc = _read_yaml(yaml_path)
    names = _yolo_names(doc, yaml_path)
    base = _yolo_base(doc, yaml_path)
    specs = {}
    for split, key in _YOLO_SPLIT_KEYS.items():
        value = doc.get(key)
        if value in (None, ""):
            continue  # refused when the split is needed (DataLayout.split)
        entries = value if isinstance(value, list) else [value]
        if not entries or not all(isinstance(e, str) for e in entries):
            raise DataLayoutError(
                f"the YOLO yaml's {key} is {value!r} (want an image folder, a .txt list of images, or a list of them)",
                yaml_path,
            )
        paths = [_yolo_entry(base, e) for e in entries]
        for p in paths:
            if not p.exists():
                raise DataLayoutError(f"the YOLO yaml's {key} folder or list not found", p)
        shown = f"{key} " + ", ".join(entries)  # as the yaml writes them
        specs[split] = _SplitSpec(
            _common_folder(paths),
            yaml_path,
            shown,
            lambda paths=paths, key=key: _read_yolo(paths, names, yaml_path, key),
        )
    if "train" not in specs and "val" not in specs:
        raise DataLayoutError("the YOLO yaml names neither a train nor a val split", yaml_path)
    return specs


def _common_folder(paths: list[Path]) -> Path:
    folders = [p if p.is_dir() else p.parent for p in paths]
    return Path(os.path.commonpath([str(f.resolve()) for f in folders])) if len(folders) > 1 else folders[0]


def yolo_label_path(image: str | os.PathLike) -> Path:
    """The label file of ``image``: the last ``images`` path component replaced by ``labels``, extension ``.txt``.

    ``data/images/train/a.jpg`` -> ``data/labels/train/a.txt`` (ultralytics' ``img2label_paths``); a
    path without an ``images`` component has its label beside it.
    """
    parts = list(Path(image).parts)
    for i in range(len(parts) - 2, -1, -1):  # the last folder component, not the file name
        if parts[i] == "images":
            parts[i] = "labels"
            break
    return Path(*parts).with_suffix(".txt")


def _yolo_images(entry: Path) -> list[Path]:
    """The images of one ``train`` / ``val`` entry: a folder (searched recursively, sorted) or a .txt list."""
    if entry.is_dir():
        return sorted(p for p in entry.rglob("*") if p.suffix.lower() in YOLO_IMAGE_SUFFIXES and p.is_file())
    if entry.suffix.lower() != ".txt":
        raise DataLayoutError("a YOLO split is an image folder or a .txt list of images", entry)
    try:
        lines = entry.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise DataLayoutError(f"cannot read the image list ({e})", entry) from None
    out = []
    for line in lines:
        line = line.strip()
        if line and not line.startswith("#"):
            p = Path(line).expanduser()
            out.append(p if p.is_absolute() else entry.parent / p)  # relative to the list's folder
    return out


def _image_size(path: Path) -> tuple[int, int] | str:
    """``(width, height)`` from the file's header (no decode), or why the image cannot be read."""
    try:
        with Image.open(path) as im:
            return im.size
    except FileNotFoundError:
        return "image file not found"
    except UnidentifiedImageError:
        return "not an image file (PIL cannot identify it)"
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        return f"unreadable image ({e})"


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _yolo_boxes(
    text: str, label: Path, names: Mapping[int, str], width: int, height: int
) -> tuple[list[tuple[int, list[float]]], str | None]:
    """``([(class, COCO box in pixels)], None)`` of a label file's rows, or ``([], why the image is broken)``."""
    boxes = []
    for n, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        where = f"{label.name} line {n}"
        if len(fields) != 5:
            return [], f"{where} has {len(fields)} fields (want 5: class cx cy w h)"
        values = [_number(f) for f in fields]
        if any(v is None for v in values):
            bad = next(f for f, v in zip(fields, values, strict=True) if v is None)
            return [], f"{where} has {bad!r}, not a finite number"
        cls, cx, cy, w, h = values
        if not cls.is_integer() or int(cls) not in names:
            return (
                [],
                f"{where} has class {fields[0]} (not among the {len(names)} names: {_index_range(names)})",
            )
        if w < 0 or h < 0:
            return [], f"{where} has a negative width or height ({fields[3]} {fields[4]})"
        bw, bh = w * width, h * height
        box = [cx * width - bw / 2, cy * height - bh / 2, bw, bh]
        if box_outside_image(box, width, height):
            return [], (
                f"{where} has box {' '.join(fields[1:])} outside its {width}x{height} image "
                "(YOLO rows are cx cy w h normalised to 0..1)"
            )
        boxes.append((int(cls), box))
    return boxes, None


def _index_range(names: Mapping[int, str]) -> str:
    keys = sorted(names)
    if keys == list(range(len(keys))):
        return f"0..{len(keys) - 1}"
    return ", ".join(str(k) for k in keys[:10]) + (", ..." if len(keys) > 10 else "")


def read_yolo_split(
    entries: list[Path], names: Mapping[int, str], source: str | os.PathLike, images_root: str | os.PathLike
) -> tuple[dict[str, Any], dict[int, str], dict[str, int]]:
    """A YOLO split as a COCO document: ``(doc, broken {image_id: reason}, counts)``.

    ``entries``: image folders or ``.txt`` lists; ``names``: class index -> name (the category ids
    and names); ``images_root``: the folder ``file_name`` is made relative to.  Image ids are 1, 2, ...
    in the order the images are listed (folders sorted by path).  ``counts``: ``images``,
    ``unlabelled`` (no label file), ``broken``, ``boxes``.
    """
    images_root = Path(images_root)
    paths = [p for e in entries for p in _yolo_images(e)]
    images, annotations, broken = [], [], {}
    unlabelled = 0
    for image_id, path in enumerate(paths, 1):
        entry: dict[str, Any] = {"id": image_id, "file_name": _relative(path, images_root)}
        images.append(entry)
        size = _image_size(path)
        if isinstance(size, str):
            broken[image_id] = size
            continue
        entry["width"], entry["height"] = size
        label = yolo_label_path(path)
        try:
            text = label.read_text(encoding="utf-8")
        except FileNotFoundError:
            unlabelled += 1
            continue  # an image without objects
        except (OSError, UnicodeDecodeError) as e:
            broken[image_id] = f"unreadable label file {label.name} ({e})"
            continue
        boxes, why = _yolo_boxes(text, label, names, *size)
        if why is not None:
            broken[image_id] = why
            continue
        for cls, box in boxes:
            annotations.append(
                {"id": len(annotations) + 1, "image_id": image_id, "category_id": cls, "bbox": box,
                 "area": box[2] * box[3], "iscrowd": 0}
            )  # fmt: skip
    doc = {
        "info": {"description": f"converted from the YOLO set {source}"},
        "images": images,
        "annotations": annotations,
        "categories": [{"id": i, "name": n} for i, n in sorted(names.items())],
    }
    counts = {
        "images": len(images),
        "unlabelled": unlabelled,
        "broken": len(broken),
        "boxes": len(annotations),
    }
    return doc, broken, counts


def _read_yolo(
    entries: list[Path], names: Mapping[int, str], yaml_path: Path, key: str
) -> tuple[CocoAnnotations, str | None]:
    root = _common_folder(entries)
    doc, broken, counts = read_yolo_split(entries, names, yaml_path, root)
    if not doc["images"]:
        raise DataLayoutError(
            f"the YOLO yaml's {key} holds no images ({', '.join(YOLO_IMAGE_SUFFIXES)})", entries[0]
        )
    if counts["unlabelled"] == counts["images"]:
        first = next(p for e in entries for p in _yolo_images(e))
        raise DataLayoutError(
            f"none of the {counts['images']} {key} images has a label file (looked for "
            f"{yolo_label_path(first)}: the last 'images' folder of the path replaced by 'labels')",
            entries[0],
        )
    annotations = check_coco_annotations(doc, yaml_path)
    for image_id, why in broken.items():
        annotations.broken.setdefault(image_id, why)
    parts = [f"{len(names)} classes"] if key == "train" else []
    if counts["unlabelled"]:
        parts.append(f"{_count(counts['unlabelled'], key + ' image')} without a label file (no objects)")
    if counts["broken"]:
        parts.append(
            f"{_count(counts['broken'], key + ' image')} with bad label rows or files (broken samples)"
        )
    return annotations, ", ".join(parts) or None


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


# ------------------------------------------------------------------------------------- writing layouts


def write_layout(
    coco_root: str | os.PathLike, out: str | os.PathLike, layout: str, name: str | None = None
) -> Path:
    """Re-export a COCO-layout set (``train2017/``, ``val2017/``, ``annotations/``) as ``layout``; returns ``out``.

    * ``roboflow``: ``out/{train,valid}/`` with the images and ``_annotations.coco.json``: the same
      images and annotations, numbered from 0 in the same order, and the categories under a filler
      category 0 named ``name`` (default: ``coco_root``'s folder name; supercategory ``none``), as
      Roboflow exports them.
    * ``yolo``: ``out/images/{train,val}/``, ``out/labels/{train,val}/*.txt`` and ``out/data.yaml``;
      class index ``k`` is the ``k``-th category by id (``names`` in that order, as a YOLO set has
      them), rows written at full float precision.  Images without annotations get no label file.

    The images are copied byte for byte.  Used by ``make-data --layout`` and the tests.
    """
    if layout not in ("roboflow", "yolo"):
        raise ValueError(f"layout must be 'roboflow' or 'yolo', got {layout!r}")
    coco_root, out = Path(coco_root), Path(out)
    for split, rf_dir in (("train", "train"), ("val", "valid")):
        img_dir, ann = resolve_coco_paths(coco_root, split)
        doc = read_json(ann, "annotation file")
        if layout == "roboflow":
            _write_roboflow_split(doc, img_dir, out / rf_dir, name or coco_root.resolve().name)
        else:
            _write_yolo_split(doc, img_dir, out, split)
    if layout == "yolo":
        doc = read_json(resolve_coco_paths(coco_root, "train")[1], "annotation file")
        cats = sorted(doc["categories"], key=lambda c: c["id"])
        lines = ["path: .", "train: images/train", "val: images/val", f"nc: {len(cats)}", "names:"]
        lines += [f"  {k}: {json.dumps(c['name'])}" for k, c in enumerate(cats)]
        (out / "data.yaml").write_text("\n".join(lines) + "\n")
    return out


def _write_roboflow_split(doc: dict[str, Any], img_dir: Path, folder: Path, set_name: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for im in doc["images"]:
        shutil.copyfile(img_dir / im["file_name"], folder / im["file_name"])
    doc = copy.deepcopy(doc)
    if any(c["id"] == 0 for c in doc["categories"]):
        raise ValueError("the COCO set already has a category 0; Roboflow's filler takes that id")
    cats = [{**c, "supercategory": set_name} for c in doc["categories"]]
    doc["categories"] = [{"id": 0, "name": set_name, "supercategory": "none"}, *cats]
    # Roboflow numbers images and annotations from 0 (in the same order)
    image_ids = {i: k for k, i in enumerate(sorted(im["id"] for im in doc["images"]))}
    for im in doc["images"]:
        im["id"] = image_ids[im["id"]]
    for k, a in enumerate(doc.get("annotations", [])):
        a["id"], a["image_id"] = k, image_ids[a["image_id"]]
    (folder / ROBOFLOW_JSON).write_text(json.dumps(doc))


def _write_yolo_split(doc: dict[str, Any], img_dir: Path, out: Path, split: str) -> None:
    images, labels = out / "images" / split, out / "labels" / split
    images.mkdir(parents=True, exist_ok=True)
    labels.mkdir(parents=True, exist_ok=True)
    index = {c["id"]: k for k, c in enumerate(sorted(doc["categories"], key=lambda c: c["id"]))}
    rows: dict[int, list[str]] = {}
    sizes = {im["id"]: (im["width"], im["height"]) for im in doc["images"]}
    for a in doc.get("annotations", []):
        w, h = sizes[a["image_id"]]
        x, y, bw, bh = a["bbox"]
        values = [(x + bw / 2) / w, (y + bh / 2) / h, bw / w, bh / h]
        rows.setdefault(a["image_id"], []).append(
            " ".join([str(index[a["category_id"]]), *map(repr, values)])
        )
    for im in doc["images"]:
        shutil.copyfile(img_dir / im["file_name"], images / im["file_name"])
        if im["id"] in rows:
            (labels / Path(im["file_name"]).with_suffix(".txt")).write_text("\n".join(rows[im["id"]]) + "\n")
