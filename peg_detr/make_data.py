"""``python -m peg_detr make-data OUT``: the synthetic shapes set written in COCO layout.

``OUT/train2017/``, ``OUT/val2017/`` and ``OUT/annotations/instances_{train,val}2017.json``,
the layout ``train --data-root OUT`` reads (:mod:`peg_detr.data.synthetic` draws the images).
"""

from __future__ import annotations

import os
from pathlib import Path

from .data import SyntheticSpec, make_synthetic_coco

__all__ = ["write_shapes_coco"]


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
