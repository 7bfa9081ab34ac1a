"""``python -m peg_detr make-data OUT``: the synthetic shapes set, in COCO layout or as users share data sets.

``OUT/train2017/``, ``OUT/val2017/`` and ``OUT/annotations/instances_{train,val}2017.json``,
the layout ``train --data-root OUT`` reads (:mod:`peg_detr.data.synthetic` draws the images);
``--layout roboflow`` / ``yolo`` writes the same images as a Roboflow COCO export or an ultralytics
YOLO set (:func:`peg_detr.data.layouts.write_layout`), which ``--data-root OUT`` reads too.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .data import SyntheticSpec, make_synthetic_coco
from .data.layouts import write_layout

__all__ = ["MAKE_DATA_LAYOUTS", "write_shapes", "write_shapes_coco"]

#: ``make-data --layout``: the layouts the shapes set is written in
MAKE_DATA_LAYOUTS = ("coco", "roboflow", "yolo")


def write_shapes_coco(
    out: str | os.PathLike,
    num_train: int,
    num_val: int,
    *,
    size: int = 160,
    num_classes: int = 3,
    min_objects: int = 1,
    max_objects: int = 3,
    seed: int = 0,
) -> Path:
    """Write ``num_train`` + ``num_val`` square ``size`` px images with 1..``num_classes`` shape kinds; returns ``out``.

    Each image holds ``min_objects`` .. ``max_objects`` shapes (``ValueError`` when min > max).
    """
    if min_objects > max_objects:
        raise ValueError(f"min_objects {min_objects} is more than max_objects {max_objects}")
    spec = SyntheticSpec(size, num_classes, min_objects, max_objects)
    return make_synthetic_coco(out, num_train, num_val, seed=seed, spec=spec)


def write_shapes(
    out: str | os.PathLike, num_train: int, num_val: int, *, layout: str = "coco", **kwargs
) -> Path:
    """:func:`write_shapes_coco` in ``layout`` (one of :data:`MAKE_DATA_LAYOUTS`); returns ``out``.

    ``roboflow`` / ``yolo``: the COCO set is drawn into a temporary folder and re-exported
    (:func:`~peg_detr.data.layouts.write_layout`; the Roboflow filler category is named ``shapes``).
    """
    if layout == "coco":
        return write_shapes_coco(out, num_train, num_val, **kwargs)
    if layout not in MAKE_DATA_LAYOUTS:
        raise ValueError(f"layout must be one of {MAKE_DATA_LAYOUTS}, got {layout!r}")
    with tempfile.TemporaryDirectory() as tmp:
        coco = write_shapes_coco(Path(tmp) / "shapes", num_train, num_val, **kwargs)
        return write_layout(coco, out, layout)
