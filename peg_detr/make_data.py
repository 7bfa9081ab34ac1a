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
from typing import Any

from .data import SyntheticSpec, make_synthetic_coco
from .data.layouts import write_layout

__all__ = ["MAKE_DATA_LAYOUTS", "write_shapes"]

#: ``make-data --layout``: the layouts the shapes set is written in
MAKE_DATA_LAYOUTS = ("coco", "roboflow", "yolo")


def write_shapes(
    out: str | os.PathLike, num_train: int, num_val: int, *, layout: str = "coco", seed: int = 0, **spec: Any
) -> Path:
    """Write ``num_train`` + ``num_val`` shapes images in ``layout`` (one of :data:`MAKE_DATA_LAYOUTS`); returns ``out``.

    ``spec``: the :class:`~peg_detr.data.SyntheticSpec` fields (``size``, ``num_classes``,
    ``min_objects``, ``max_objects``, ...; its defaults: 160 px squares, 3 kinds, 1 to 3 shapes),
    checked by :func:`~peg_detr.data.make_synthetic_coco` (a ``ValueError``).  ``roboflow`` /
    ``yolo``: the COCO set is drawn into a temporary folder and re-exported
    (:func:`~peg_detr.data.layouts.write_layout`; the Roboflow filler category is named ``shapes``).
    """
    if layout not in MAKE_DATA_LAYOUTS:
        raise ValueError(f"layout must be one of {MAKE_DATA_LAYOUTS}, got {layout!r}")
    shapes = SyntheticSpec(**spec)
    if layout == "coco":
        return make_synthetic_coco(out, num_train, num_val, seed=seed, spec=shapes)
    with tempfile.TemporaryDirectory() as tmp:
        coco = make_synthetic_coco(Path(tmp) / "shapes", num_train, num_val, seed=seed, spec=shapes)
        return write_layout(coco, out, layout)
