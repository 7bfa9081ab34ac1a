"""A small synthetic detection set in COCO layout: coloured shapes on a noisy background.

Each image holds zero to a few non-overlapping shapes; the class is the shape
(square, disc, triangle, ...), and each class has its own colour, so a tiny
DETR learns the task on a CPU in minutes.  The files follow COCO 2017's layout
so the same loader, evaluator and CLI handle it and real COCO alike::

    OUT/train2017/000000000001.jpg ...
    OUT/val2017/...
    OUT/annotations/instances_train2017.json, instances_val2017.json

Everything is drawn from ``numpy.random.default_rng(seed)``, so a seed gives
byte-identical json and images.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

__all__ = ["SHAPES", "SyntheticSpec", "make_synthetic_coco"]

# (name, RGB colour); the category id is the 1-based position, as in COCO (id 0 is unused).
SHAPES: tuple[tuple[str, tuple[int, int, int]], ...] = (
    ("square", (220, 40, 40)),
    ("disc", (40, 170, 60)),
    ("triangle", (40, 70, 220)),
    ("diamond", (230, 190, 30)),
)


@dataclass(frozen=True)
class SyntheticSpec:
    """Generator settings.

    Attributes:
        size: image side in pixels (square images).
        num_classes: how many of :data:`SHAPES` to use (1..4).
        max_objects: at most this many shapes per image.
        min_objects: at least this many (0 lets some images be empty).
        min_frac, max_frac: object side as a fraction of the image's shorter side.
        min_size: when set, each image's height and width are drawn from
            ``range(min_size, size + 1, 16)`` (mixed sizes, multiples of 16 when
            both bounds are); else every image is ``size`` × ``size``.
    """

    size: int = 160
    num_classes: int = 3
    min_objects: int = 1
    max_objects: int = 3
    min_frac: float = 0.2
    max_frac: float = 0.45
    min_size: int | None = None


def _draw_shape(draw: ImageDraw.ImageDraw, kind: str, box: tuple[int, int, int, int], colour) -> float:
    """Draw one shape filling ``box`` (x0, y0, x1, y1 exclusive); return its pixel area."""
    x0, y0, x1, y1 = box
    w, h = x1 - x0, y1 - y0
    # PIL's coordinates are inclusive, hence the -1 on the far edges.
    if kind == "square":
        draw.rectangle((x0, y0, x1 - 1, y1 - 1), fill=colour)
        return float(w * h)
    if kind == "disc":
        draw.ellipse((x0, y0, x1 - 1, y1 - 1), fill=colour)
        return math.pi * w * h / 4
    if kind == "triangle":
        draw.polygon([(x0 + w / 2, y0), (x1 - 1, y1 - 1), (x0, y1 - 1)], fill=colour)
        return w * h / 2
    if kind == "diamond":
        cx, cy = x0 + w / 2, y0 + h / 2
        draw.polygon([(cx, y0), (x1 - 1, cy), (cx, y1 - 1), (x0, cy)], fill=colour)
        return w * h / 2
    raise ValueError(f"unknown shape {kind!r}")


def _overlaps(box, boxes, gap: int) -> bool:
    x0, y0, x1, y1 = box
    return any(x0 < b[2] + gap and b[0] < x1 + gap and y0 < b[3] + gap and b[1] < y1 + gap for b in boxes)


def _make_image(rng: np.random.Generator, spec: SyntheticSpec) -> tuple[Image.Image, list[dict]]:
    if spec.min_size is None:
        ih = iw = spec.size
    else:
        ih, iw = (int(v) for v in rng.choice(np.arange(spec.min_size, spec.size + 1, 16), size=2))
    s = min(ih, iw)
    # Low-contrast grey noise so the background is not a constant the model can ignore trivially.
    base = rng.integers(90, 150)
    noise = rng.normal(0.0, 12.0, size=(ih, iw, 1)) + base
    img = Image.fromarray(np.clip(np.repeat(noise, 3, axis=2), 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    n = int(rng.integers(spec.min_objects, spec.max_objects + 1))
    boxes: list[tuple[int, int, int, int]] = []
    anns: list[dict] = []
    for _ in range(n):
        for _attempt in range(30):  # rejection sampling for non-overlapping boxes
            side = int(rng.uniform(spec.min_frac, spec.max_frac) * s)
            aspect = rng.uniform(0.75, 1.33)
            w = max(4, min(s, int(side * math.sqrt(aspect))))
            h = max(4, min(s, int(side / math.sqrt(aspect))))
            x0 = int(rng.integers(0, iw - w + 1))
            y0 = int(rng.integers(0, ih - h + 1))
            box = (x0, y0, x0 + w, y0 + h)
            if not _overlaps(box, boxes, gap=2):
                break
        else:
            continue
        cls = int(rng.integers(0, spec.num_classes))
        name, colour = SHAPES[cls]
        jitter = rng.integers(-25, 26, size=3)
        area = _draw_shape(
            draw, name, box, tuple(int(np.clip(c + j, 0, 255)) for c, j in zip(colour, jitter))
        )
        boxes.append(box)
        anns.append(
            {"category_id": cls + 1, "bbox": [float(x0), float(y0), float(w), float(h)], "area": area}
        )
    return img, anns


def _write_split(out: Path, split: str, count: int, spec: SyntheticSpec, rng, first_id: int) -> Path:
    img_dir = out / f"{split}2017"
    img_dir.mkdir(parents=True, exist_ok=True)
    images, annotations = [], []
    ann_id = 1
    for k in range(count):
        image_id = first_id + k
        img, anns = _make_image(rng, spec)
        file_name = f"{image_id:012d}.jpg"
        img.save(img_dir / file_name, quality=92)
        images.append({"id": image_id, "file_name": file_name, "height": img.height, "width": img.width})
        for a in anns:
            annotations.append({"id": ann_id, "image_id": image_id, "iscrowd": 0, **a})
            ann_id += 1
    categories = [
        {"id": i + 1, "name": name, "supercategory": "shape"}
        for i, (name, _) in enumerate(SHAPES[: spec.num_classes])
    ]
    ann_file = out / "annotations" / f"instances_{split}2017.json"
    ann_file.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "info": {"description": f"peg_detr synthetic shapes ({split})"},
        "images": images,
        "annotations": annotations,
        "categories": categories,
    }
    ann_file.write_text(json.dumps(doc))
    return ann_file


def make_synthetic_coco(
    out: str | Path,
    num_train: int = 512,
    num_val: int = 128,
    seed: int = 0,
    spec: SyntheticSpec | None = None,
) -> Path:
    """Write the synthetic set under ``out`` in COCO 2017 layout and return ``out``.

    Train and val use independent streams of the same seed, so changing
    ``num_train`` does not change the validation images.
    """
    spec = spec or SyntheticSpec()
    if not 1 <= spec.num_classes <= len(SHAPES):
        raise ValueError(f"num_classes must be in 1..{len(SHAPES)}, got {spec.num_classes}")
    if not 0 <= spec.min_objects <= spec.max_objects:
        raise ValueError(f"need 0 <= min_objects <= max_objects, got {spec.min_objects}, {spec.max_objects}")
    if spec.size < 16 or (spec.min_size is not None and not 16 <= spec.min_size <= spec.size):
        raise ValueError(f"need 16 <= min_size <= size, got size={spec.size}, min_size={spec.min_size}")
    out = Path(out)
    train_rng, val_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    _write_split(out, "train", num_train, spec, train_rng, first_id=1)
    _write_split(out, "val", num_val, spec, val_rng, first_id=1_000_001)
    return out
