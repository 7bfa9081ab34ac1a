"""COCO annotation files, checked before anything is built on them.

pycocotools trusts its input: a missing ``categories`` key surfaces as a
``KeyError`` after a whole evaluation, a malformed ``bbox`` deep inside
``COCOeval``, and two annotations with one id keep one of them in its index (the
ground truth scored against itself then gives AP 0.04, not 1.0).
:func:`load_coco_annotations` reads the json itself (:func:`peg_core.jsonfile.read_json`:
size and nesting limits) and

* raises a one-line :class:`CocoAnnotationError` (an :class:`~peg_core.errors.InputError`)
  naming the file (and the key, annotation or value) for what makes the file unusable: not
  JSON, no ``images`` / ``categories`` key, no image, an image entry without ``id`` /
  ``file_name`` or with a ``width`` / ``height`` that is not a positive int, an image id or a
  category id listed twice, a category id outside ``0..MAX_CATEGORY_ID`` (labels index a
  classifier by id), an annotation id listed twice, an annotation whose ``category_id`` or
  ``image_id`` is not listed;
* marks an image as broken when one of its annotations is malformed: no ``bbox`` or one that
  is not 4 finite numbers with ``w, h >= 0``, a box outside the image (its ``width`` /
  ``height``, beyond :data:`BOX_TOLERANCE` pixels), an ``area`` that is not a non-negative
  number, an ``iscrowd`` that is not 0 or 1.  The image's annotations are left out of the
  ground truth, the dataset raises :class:`~peg_core.engine.BrokenSample` for it (skipped,
  counted, listed in ``report.json``) and it is not among the evaluated images;
* fills the keys ``COCOeval`` needs and files often lack (``iscrowd`` 0,
  ``area`` = box area, ``id``), and shifts the annotation ids of a file that uses id 0 (Roboflow's
  exports number from 0) so that they start at 1: ``COCOeval`` records a match by the ground truth's
  id, so a detection matched to annotation 0 would count as a false positive.

:func:`box_outside_image` is the box check, which the dataset repeats with the decoded image's size.
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

from peg_core.errors import InputError, require
from peg_core.jsonfile import read_json

COCO = require("pycocotools.coco", None, "pycocotools", what="peg_detr").COCO

__all__ = [
    "BOX_TOLERANCE",
    "MAX_CATEGORY_ID",
    "CocoAnnotationError",
    "CocoAnnotations",
    "CocoDataError",
    "box_outside_image",
    "check_coco_annotations",
    "load_coco_annotations",
]

#: the largest category id: with DETR's labels (``--labels ids``) a classifier has ``max id + 1``
#: outputs, so an id of 10^9 would ask for a billion-way head (COCO's largest is 90, LVIS's 1203)
MAX_CATEGORY_ID = 100_000
#: how far (pixels) a box may reach past the image's border before it counts as broken: COCO's
#: own boxes overshoot by float rounding; what lies outside this is clipped as before
BOX_TOLERANCE = 1.0


class CocoDataError(InputError):
    """A COCO-format data set that cannot be used: ``what`` says why, ``where`` names the file or folder."""


class CocoAnnotationError(CocoDataError):
    """A COCO annotation file that cannot be used: ``what`` says why, ``where`` names the file."""


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


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _shown(value: Any) -> str:
    return json.dumps(value, default=str)[:60]


def box_outside_image(box: list[float], width: float, height: float) -> bool:
    """Whether the COCO box ``[x, y, w, h]`` reaches past an image of ``width`` x ``height`` pixels
    by more than :data:`BOX_TOLERANCE` on any side (a box larger than the image always does)."""
    x, y, w, h = box
    tol = BOX_TOLERANCE
    return x < -tol or y < -tol or x + w > width + tol or y + h > height + tol


def _annotation_problem(ann: dict[str, Any], image: dict[str, Any]) -> str | None:
    """Why ``ann`` is unusable (its image is then broken), or ``None``.

    A ``bbox`` must be ``[x, y, w, h]``: finite numbers, ``w, h >= 0``, inside ``image``'s
    ``width`` x ``height`` when the file gives them; ``area`` a non-negative number, ``iscrowd`` 0 or 1.
    """
    name = f"annotation {ann.get('id')}"
    if "bbox" not in ann:
        return f"{name} has no 'bbox'"
    box = ann["bbox"]
    ok = (
        isinstance(box, list)
        and len(box) == 4
        and all(_is_number(v) for v in box)
        and box[2] >= 0
        and box[3] >= 0
    )
    if not ok:
        return f"{name} has a malformed bbox {_shown(box)} (want [x, y, w, h])"
    width, height = image.get("width"), image.get("height")
    if width is not None and height is not None and box_outside_image(box, width, height):
        return f"{name} has bbox {_shown(box)} outside its {width}x{height} image"
    if "area" in ann and not (_is_number(ann["area"]) and ann["area"] >= 0):
        return f"{name} has area {_shown(ann['area'])} (want a non-negative number)"
    if "iscrowd" in ann and ann["iscrowd"] not in (0, 1):
        return f"{name} has iscrowd {_shown(ann['iscrowd'])} (want 0 or 1)"
    return None


def _checked_list(doc: dict[str, Any], key: str, path: Path, required: bool = True) -> list[Any]:
    if key not in doc:
        if required:
            raise CocoAnnotationError(f"annotation file has no {key!r} key", path)
        return []
    value = doc[key]
    if not isinstance(value, list):
        raise CocoAnnotationError(f"annotation file's {key!r} is not a list", path)
    return value


def _images(doc: dict[str, Any], path: Path) -> list[dict[str, Any]]:
    images = _checked_list(doc, "images", path)
    if not images:
        raise CocoAnnotationError("annotation file lists no images ('images' is empty)", path)
    seen: set[int] = set()
    for i, im in enumerate(images):
        if not isinstance(im, dict) or not _is_int(im.get("id")) or not isinstance(im.get("file_name"), str):
            raise CocoAnnotationError(f"image entry {i} has no integer 'id' and string 'file_name'", path)
        if im["id"] in seen:
            raise CocoAnnotationError(f"image id {im['id']} is listed twice in 'images'", path)
        for side in ("width", "height"):
            if side in im and not (_is_int(im[side]) and im[side] > 0):
                raise CocoAnnotationError(
                    f"image {im['id']} has {side} {_shown(im[side])} (want a positive int of pixels)", path
                )
        seen.add(im["id"])
    return images


def _categories(doc: dict[str, Any], path: Path) -> list[dict[str, Any]]:
    cats = _checked_list(doc, "categories", path)
    seen: set[int] = set()
    for i, c in enumerate(cats):
        if not isinstance(c, dict) or not _is_int(c.get("id")):
            raise CocoAnnotationError(f"category entry {i} has no integer 'id'", path)
        if not 0 <= c["id"] <= MAX_CATEGORY_ID:
            raise CocoAnnotationError(
                f"category entry {i} has id {c['id']}, outside 0..{MAX_CATEGORY_ID} (labels index a classifier "
                "by category id)",
                path,
            )
        if c["id"] in seen:
            raise CocoAnnotationError(f"category id {c['id']} is listed twice in 'categories'", path)
        seen.add(c["id"])
    return [{"name": str(c["id"]), **c} for c in cats]


def _annotations(
    doc: dict[str, Any], path: Path, images: dict[int, dict[str, Any]], cat_ids: set[int]
) -> tuple[list[dict[str, Any]], dict[int, str]]:
    """The usable annotations (keys filled in) and ``{image_id: reason}`` of images with a malformed one."""
    anns = _checked_list(doc, "annotations", path, required=False)
    broken: dict[int, str] = {}
    used_ids: set[int] = set()
    for a in anns:  # pycocotools indexes by id: a repeated id would silently drop annotations
        if isinstance(a, dict) and _is_int(a.get("id")):
            if a["id"] in used_ids:
                raise CocoAnnotationError(f"annotation id {a['id']} is listed twice in 'annotations'", path)
            used_ids.add(a["id"])
    # COCOeval stores a match as the ground truth's id, 0 meaning "no match": id 0 must not be used
    shift = 1 - min(used_ids) if 0 in used_ids else 0
    next_id = max(used_ids, default=0) + 1 + shift
    kept = []
    for i, a in enumerate(anns):
        if not isinstance(a, dict):
            raise CocoAnnotationError(f"annotation entry {i} is not an object", path)
        name = f"annotation {a['id']}" if "id" in a else f"annotation entry {i}"
        image_id, category_id = a.get("image_id"), a.get("category_id")
        if not (_is_int(image_id) and image_id in images):
            raise CocoAnnotationError(f"{name} has image_id {image_id!r}, which is not in 'images'", path)
        if not (_is_int(category_id) and category_id in cat_ids):
            raise CocoAnnotationError(
                f"{name} (image {image_id}) has category_id {category_id!r}, which is not in "
                f"'categories' (ids {sorted(cat_ids)[:20]})",
                path,
            )
        problem = _annotation_problem(a, images[image_id])
        if problem is not None:
            broken.setdefault(image_id, problem)
            continue
        a = dict(a)
        if not _is_int(a.get("id")):
            a["id"], next_id = next_id, next_id + 1
        else:
            a["id"] += shift
        a.setdefault("iscrowd", 0)
        a.setdefault("area", float(a["bbox"][2] * a["bbox"][3]))
        kept.append(a)
    return [a for a in kept if a["image_id"] not in broken], broken


def load_coco_annotations(path: str | os.PathLike) -> CocoAnnotations:
    """Read and check a COCO instances json; see the module docstring for what is an error."""
    path = Path(path)
    return check_coco_annotations(read_json(path, "annotation file"), path)  # a JsonError names the file


def check_coco_annotations(doc: Any, path: str | os.PathLike) -> CocoAnnotations:
    """Check a COCO instances document already in memory (read from, or converted from, ``path``).

    The checks of :func:`load_coco_annotations`, for data converted from another format
    (:mod:`peg_detr.data.layouts`); errors name ``path``.  ``doc`` is not modified.
    """
    path = Path(path)
    if not isinstance(doc, dict):
        raise CocoAnnotationError(
            f"annotation file is not a COCO object (its top level is a {type(doc).__name__})", path
        )
    images = _images(doc, path)
    categories = _categories(doc, path)
    anns, broken = _annotations(doc, path, {im["id"]: im for im in images}, {c["id"] for c in categories})
    coco = COCO()
    coco.dataset = {**doc, "images": images, "categories": categories, "annotations": anns}
    with contextlib.redirect_stdout(io.StringIO()):  # "creating index..."
        coco.createIndex()
    return CocoAnnotations(path, coco, broken)
