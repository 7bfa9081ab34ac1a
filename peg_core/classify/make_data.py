"""``make-data``: the generated shapes written as an ImageFolder tree of PNG/JPEG files.

    OUT/train/<class>/00000.png ...    OUT/val/<class>/00000.png ...

The same scenes as the in-memory set of ``train`` without ``--data-root`` (same ``--seed``,
``--num-train``, ``--num-val``), so a user sees the layout a real data set needs and can
train on it with ``python -m peg_core train --config demo --data-root OUT``.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ..engine import UserError, ensure_writable
from ..errors import require
from .shapes import CLASS_NAMES, ShapeScenes, make_shape_splits

__all__ = ["write_shapes_folder"]

FORMATS = {"png": ".png", "jpg": ".jpg"}


def _write_split(scenes: ShapeScenes, folder: Path, img_size: int, suffix: str) -> int:
    from PIL import Image

    for name in CLASS_NAMES:
        (folder / name).mkdir(parents=True, exist_ok=True)
    pixels = ((scenes.images(img_size) + 1) * 127.5).round().clamp(0, 255).to(torch.uint8)  # (N, 3, H, W)
    for i, label in enumerate(scenes.labels.tolist()):
        image = Image.fromarray(pixels[i].permute(1, 2, 0).contiguous().numpy())
        image.save(folder / CLASS_NAMES[label] / f"{i:05d}{suffix}", quality=95)
    return len(scenes)


def write_shapes_folder(
    out: str | os.PathLike, num_train: int = 2048, num_val: int = 512, img_size: int = 48, seed: int = 0,
    fmt: str = "png",
) -> dict[str, int]:  # fmt: skip
    """Write ``out/train`` and ``out/val``; returns the image count of each split.

    Refuses (one-line :class:`UserError`) a folder that already holds a ``train/`` or ``val/``.
    """
    out = Path(out)
    for split in ("train", "val"):
        if (out / split).exists():
            raise UserError(f"output folder already holds {split}/; remove it or choose another folder", out)
    ensure_writable(out)
    require("PIL", "vision", what="make-data")
    train, val = make_shape_splits(num_train, num_val, seed=seed)
    try:
        return {
            "train": _write_split(train, out / "train", img_size, FORMATS[fmt]),
            "val": _write_split(val, out / "val", img_size, FORMATS[fmt]),
        }
    except OSError as e:
        raise UserError(f"cannot write images ({e.strerror or e})", out) from None
