"""COCO annotation files, checked before anything is built on them.

pycocotools trusts its input: a missing ``categories`` key surfaces as a
``KeyError`` after a whole evaluation, a malformed ``bbox`` deep inside
``COCOeval``.  :func:`load_coco_annotations` reads the json itself and

* raises a one-line :class:`~peg_core.engine.UserError` naming the file (and the
  key, annotation or value) for what makes the file unusable: not JSON, no
  ``images`` / ``categories`` key, no image, an image entry without ``id`` /
  ``file_name``, an annotation whose ``category_id`` or ``image_id`` is not
  listed;
* marks an image as broken when one of its annotations has no ``bbox`` or one
  that is not 4 finite numbers with ``w, h >= 0``: the image's annotations are
  left out of the ground truth, the dataset raises
  :class:`~peg_core.engine.BrokenSample` for it (skipped, counted, listed in
  ``report.json``) and it is not among the evaluated images;
* fills the keys ``COCOeval`` needs and files often lack (``iscrowd`` 0,
  ``area`` = box area, ``id``).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from peg_core.engine import UserError
from peg_core.errors import require

COCO = require("pycocotools.coco", None, "pycocotools", what="peg_detr").COCO

__all__ = ["CocoAnnotations", "load_coco_annotations"]


@dataclass
class CocoAnnotations:
    """A checked annotation file.

    Attributes:
        path: the json file.
        coco: pycocotools index of the usable annotations.
        broken: ``{image_id: reason}`` of images whose annotations are malformed.
    """

    path: Path
    coco: COCO
    broken: dict[int, str] = field(default_factory=dict)

    @property
    def categories(self) -> list[dict[str, Any]]:
        """The categories, sorted by id."""
        return [self.coco.cats[c] for c in sorted(self.coco.cats)]


def _read_json(path: Path) -> Any:
    if not path.exists():
        raise UserError("annotation file not found", path)
    if not path.is_file():
        raise UserError("annotation path is not a file", path)
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as e:
        raise UserError(f"annotation file is not readable ({e.strerror or e})", path) from None
    except UnicodeDecodeError:
        raise UserError("annotation file is not JSON (not UTF-8 text)", path) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"annotation file is not JSON ({e.msg} at line {e.lineno} column {e.colno})", path) from None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _bbox_problem(ann: dict[str, Any]) -> str | None:
    """Why ``ann["bbox"]`` is unusable, or ``None`` when it is ``[x, y, w, h]`` with finite numbers, w, h >= 0."""
    if "bbox" not in ann:
        return f"annotation {ann.get('id')} has no 'bbox'"
    box = ann["bbox"]
    ok = (
        isinstance(box, list)
        and len(box) == 4
        and all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in box)
        and box[2] >= 0
        and box[3] >= 0
    )
    return None if ok else f"annotation {ann.get('id')} has a malformed bbox {json.dumps(box)[:60]} (want [x, y, w, h])"


def _checked_list(doc: dict[str, Any], key: str, path: Path, required: bool = True) -> list[Any]:
    if key not in doc:
        if required:
            raise UserError(f"annotation file has no {key!r} key", path)
        return []
    value = doc[key]
    if not isinstance(value, list):
        raise UserError(f"annotation file's {key!r} is not a list", path)
    return value


def _images(doc: dict[str, Any], path: Path) -> list[dict[str, Any]]:
    images = _checked_list(doc, "images", path)
    if not images:
        raise UserError("annotation file lists no images ('images' is empty)", path)
    seen: set[int] = set()
    for i, im in enumerate(images):
        if not isinstance(im, dict) or not _is_int(im.get("id")) or not isinstance(im.get("file_name"), str):
            raise UserError(f"image entry {i} has no integer 'id' and string 'file_name'", path)
        if im["id"] in seen:
            raise UserError(f"image id {im['id']} is listed twice in 'images'", path)
        seen.add(im["id"])
    return images


def _categories(doc: dict[str, Any], path: Path) -> list[dict[str, Any]]:
    cats = _checked_list(doc, "categories", path)
    for i, c in enumerate(cats):
        if not isinstance(c, dict) or not _is_int(c.get("id")):
            raise UserError(f"category entry {i} has no integer 'id'", path)
    return [{"name": str(c["id"]), **c} for c in cats]


def _annotations(
    doc: dict[str, Any], path: Path, image_ids: set[int], cat_ids: set[int]
) -> tuple[list[dict[str, Any]], dict[int, str]]:
    """The usable annotations (keys filled in) and ``{image_id: reason}`` of images with a malformed one."""
    anns = _checked_list(doc, "annotations", path, required=False)
    broken: dict[int, str] = {}
    used_ids = {a["id"] for a in anns if isinstance(a, dict) and _is_int(a.get("id"))}
    next_id = max(used_ids, default=0) + 1
    kept = []
    for i, a in enumerate(anns):
        if not isinstance(a, dict):
            raise UserError(f"annotation entry {i} is not an object", path)
        name = f"annotation {a['id']}" if "id" in a else f"annotation entry {i}"
        if a.get("image_id") not in image_ids:
            raise UserError(f"{name} has image_id {a.get('image_id')!r}, which is not in 'images'", path)
        if a.get("category_id") not in cat_ids:
            raise UserError(
                f"{name} (image {a['image_id']}) has category_id {a.get('category_id')!r}, which is not in "
                f"'categories' (ids {sorted(cat_ids)[:20]})",
                path,
            )
        problem = _bbox_problem(a)
        if problem is not None:
            broken.setdefault(a["image_id"], problem)
            continue
        a = dict(a)
        if not _is_int(a.get("id")):
            a["id"], next_id = next_id, next_id + 1
        a.setdefault("iscrowd", 0)
        a.setdefault("area", float(a["bbox"][2] * a["bbox"][3]))
        kept.append(a)
    return [a for a in kept if a["image_id"] not in broken], broken


def load_coco_annotations(path: str | os.PathLike) -> CocoAnnotations:
    """Read and check a COCO instances json; see the module docstring for what is an error."""
    path = Path(path)
    doc = _read_json(path)
    if not isinstance(doc, dict):
        raise UserError(f"annotation file is not a COCO object (its top level is a {type(doc).__name__})", path)
    images = _images(doc, path)
    categories = _categories(doc, path)
    anns, broken = _annotations(doc, path, {im["id"] for im in images}, {c["id"] for c in categories})
    coco = COCO()
    coco.dataset = {**doc, "images": images, "categories": categories, "annotations": anns}
    with contextlib.redirect_stdout(io.StringIO()):  # "creating index..."
        coco.createIndex()
    return CocoAnnotations(path, coco, broken)
