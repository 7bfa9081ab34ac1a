"""Shared by the ``--labels`` tests: the synthetic shapes set with gappy category ids, a tiny contiguous run.

The shapes' category ids 1, 2, 3 are rewritten as 1, 3, 7 (COCO's 1..90 has gaps too), so a
``contiguous`` label k (0, 1, 2) differs from its category id for two of the three classes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from peg_detr.data import SyntheticSpec, make_synthetic_coco

#: rtdetr_demo_tiny at 64 px only: one step of 4 images, seconds on a CPU
SMALL_RUN = ("--train-sizes", "64", "--val-size", "64")
#: the synthetic shapes' ids 1, 2, 3 rewritten with gaps
GAP_IDS = {1: 1, 2: 3, 3: 7}
NAMES = {1: "square", 3: "disc", 7: "triangle"}


def with_gaps(root: Path) -> Path:
    """Rewrite the shapes set's category ids 1, 2, 3 as 1, 3, 7 in both splits (images untouched)."""
    for split in ("train", "val"):
        path = root / "annotations" / f"instances_{split}2017.json"
        doc = json.loads(path.read_text())
        doc["categories"] = [{**c, "id": GAP_IDS[c["id"]]} for c in doc["categories"]]
        # listed out of order: the map sorts by id
        doc["categories"].reverse()
        for a in doc["annotations"]:
            a["category_id"] = GAP_IDS[a["category_id"]]
        path.write_text(json.dumps(doc))
    return root


def make_gap_data(folder: Path) -> Path:
    """4 train and 3 val 64 px images of 1..3 shapes, category ids 1, 3, 7 (:func:`with_gaps`)."""
    spec = SyntheticSpec(size=64, num_classes=3, min_objects=1, max_objects=3, min_frac=0.3, max_frac=0.45)
    return with_gaps(make_synthetic_coco(folder, num_train=4, num_val=3, seed=2, spec=spec))


def train_contiguous(data: Path, out: Path) -> dict[str, Any]:
    """``--config rtdetr_r18vd_6x`` (no ``--labels``: the recipe's contiguous) shrunk to seconds on a CPU; the report."""
    from peg_detr.cli import train

    return train([
        "--config", "rtdetr_r18vd_6x", "--data-root", str(data), "--output-dir", str(out), "--backbone", "tiny",
        "--hidden-dim", "32", "--num-heads", "2", "--dim-feedforward", "64", "--dec-layers", "2",
        "--num-queries", "20", "--num-denoising", "10", "--total-batch-size", "4", "--warmup-steps", "10",
        "--ema-decay", "0.99", "--ema-warmups", "20", "--lr", "5e-4", "--lr-backbone", "5e-4", "--epochs", "1",
        "--eval-every", "0", "--workers", "0", "--device", "cpu", "--no-progress", "--seed", "3", *SMALL_RUN,
    ])  # fmt: skip
