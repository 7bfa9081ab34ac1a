"""COCO-format detection data: ``torchvision.datasets.CocoDetection`` -> DETR targets.

Any data set in COCO's json format works (COCO 2017, the synthetic shapes, your
own).  Labels are the json's category ids, as in DETR, so the classifier has
``max(category id) + 1`` outputs (91 for COCO) unless ``--num-classes`` says
otherwise.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torchvision.datasets import CocoDetection

from ..structures import ImageBatch, pad_images
from .transforms import make_boxes, to_detr_target

__all__ = ["CocoDetr", "collate_detr", "infer_num_classes", "resolve_coco_paths"]


class CocoDetr(CocoDetection):
    """COCO detection with DETR targets.

    ``__getitem__`` returns ``(image, target)``: ``image`` ``(3, H, W)`` float
    after ``transforms``; ``target`` holds ``labels`` int64 ``(n,)``, ``boxes``
    float ``(n, 4)`` cxcywh normalised by the augmented ``(H, W)``,
    ``image_id`` int64 scalar, ``orig_size`` and ``size`` ``(2,)`` = (h, w).

    Crowd annotations (``iscrowd=1``) are left out of the targets (the COCO
    evaluator still ignores detections on them); boxes with no area after
    augmentation are dropped; images without objects are kept.

    Args:
        root: folder holding the images.
        ann_file: COCO instances json.
        transforms: a v2 transform called as ``transforms(image, target)`` with
            ``target["boxes"]`` a XYXY ``BoundingBoxes`` and ``target["labels"]``.
    """

    def __init__(self, root: str | Path, ann_file: str | Path, transforms: Callable | None = None) -> None:
        root, ann_file = Path(root), Path(ann_file)
        if not ann_file.is_file():
            raise FileNotFoundError(f"COCO annotation file not found: {ann_file}")
        if not root.is_dir():
            raise FileNotFoundError(f"COCO image folder not found: {root}")
        with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its loading steps
            super().__init__(str(root), str(ann_file))
        self._detr_transforms = transforms

    def __getitem__(self, index: int) -> tuple[Tensor, dict[str, Any]]:
        image, anns = super().__getitem__(index)
        image_id = self.ids[index]
        w, h = image.size
        kept = [a for a in anns if not a.get("iscrowd", 0)]
        xywh = torch.tensor([a["bbox"] for a in kept], dtype=torch.float32).reshape(-1, 4)
        xyxy = torch.cat([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], dim=1)
        target: dict[str, Any] = {
            "boxes": make_boxes(xyxy, (h, w)),
            "labels": torch.tensor([a["category_id"] for a in kept], dtype=torch.int64),
            "image_id": torch.tensor(image_id),
            "orig_size": torch.tensor([h, w]),
        }
        if self._detr_transforms is not None:
            image, target = self._detr_transforms(image, target)
        if not isinstance(image, Tensor):
            raise TypeError(f"transforms must end with a tensor image, got {type(image).__name__}")
        return image, to_detr_target(target, image)

    @property
    def categories(self) -> list[dict[str, Any]]:
        """The json's categories, sorted by id."""
        return [self.coco.cats[c] for c in sorted(self.coco.cats)]


def infer_num_classes(coco_json_categories: list[dict[str, Any]]) -> int:
    """DETR's convention: one logit per category id up to the largest (ids used directly as labels)."""
    if not coco_json_categories:
        raise ValueError("the annotation file lists no categories; pass --num-classes")
    return max(int(c["id"]) for c in coco_json_categories) + 1


def resolve_coco_paths(
    coco_path: str | os.PathLike, split: str, ann_json: str | os.PathLike | None = None
) -> tuple[Path, Path]:
    """``(image folder, annotation json)`` of ``split`` (``train``/``val``) in the COCO 2017 layout.

    ``ann_json`` overrides the json path (absolute, or relative to ``coco_path``).
    """
    root = Path(coco_path)
    img_dir = root / f"{split}2017"
    if ann_json is None:
        ann = root / "annotations" / f"instances_{split}2017.json"
    else:
        ann = Path(ann_json)
        if not ann.is_absolute() and not ann.exists():
            ann = root / ann
    return img_dir, ann


def collate_detr(batch: list[tuple[Tensor, dict[str, Any]]]) -> tuple[ImageBatch, list[dict[str, Any]]]:
    """Pad images to a common size (mask True at padding) and keep targets as a list."""
    images, targets = zip(*batch)
    return pad_images(list(images)), list(targets)
