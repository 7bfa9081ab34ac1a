"""COCO-format detection data: images and checked annotations -> DETR targets.

Any data set in COCO's json format works (COCO 2017, the synthetic shapes, your
own).  By default labels are the json's category ids, as in DETR, so the classifier
has ``max(category id) + 1`` outputs (91 for COCO) unless ``--num-classes`` says
otherwise; with a ``contiguous`` :class:`~peg_detr.labels.LabelMap` (``--labels
contiguous``, RT-DETR's) label ``k`` is the ``k``-th category by id (80 for COCO).  An
image that cannot be used (missing or truncated file, not an image, a malformed
annotation, a box outside the decoded image) raises :class:`~peg_core.engine.BrokenSample`.
A data set that cannot be used at all (no image folder, categories the labels do not map) is a
:class:`~peg_detr.data.annotations.CocoDataError`, an :class:`~peg_core.errors.InputError`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from PIL import Image, UnidentifiedImageError
from torch import Tensor
from torch.utils.data import Dataset

from peg_core.engine import BrokenSample, sample_seed, seeded
from peg_core.engine.predictor import rgb_image

from ..labels import LabelMap
from ..structures import ImageBatch, pad_images
from .annotations import (
    CocoAnnotationError,
    CocoAnnotations,
    CocoDataError,
    box_outside_image,
    load_coco_annotations,
)
from .transforms import make_boxes, to_detr_target

__all__ = ["CocoDetr", "collate_detr", "infer_num_classes", "read_rgb", "resolve_coco_paths"]


def read_rgb(path: str | os.PathLike) -> Image.Image:
    """Decode an image file to 8-bit RGB; :class:`BrokenSample` when it is missing, truncated or not an image.

    16-bit grey PNGs are scaled, not clipped to white (:func:`peg_core.engine.predictor.rgb_image`).
    """
    try:
        with Image.open(path) as im:
            return rgb_image(im)  # decodes now: a truncated file fails here, not in a transform
    except FileNotFoundError:
        raise BrokenSample(path, "image file not found") from None
    except UnidentifiedImageError:
        raise BrokenSample(path, "not an image file (PIL cannot identify it)") from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        raise BrokenSample(path, f"unreadable image ({e})") from None


class CocoDetr(Dataset):
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
        annotations: COCO instances json, or one already read by
            :func:`~peg_detr.data.annotations.load_coco_annotations` (shared by
            the datasets of several evaluation sizes).
        transforms: a v2 transform called as ``transforms(image, target)`` with
            ``target["boxes"]`` a XYXY ``BoundingBoxes`` and ``target["labels"]``.
        label_map: category ids -> labels (default: the ids themselves, DETR's convention).
        seed: with a seed, ``transforms`` draw from a generator seeded by ``(seed, epoch, index)``
            (:meth:`set_epoch`), so a sample's augmentation is the same whichever data-loader
            worker, and however many, produce it; ``None`` draws from torch's global generator.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        annotations: str | os.PathLike | CocoAnnotations,
        transforms: Callable | None = None,
        label_map: LabelMap | None = None,
        seed: int | None = None,
    ) -> None:
        self.root = Path(root)
        self.seed, self.epoch = seed, 0
        if not self.root.is_dir():
            raise CocoDataError("image folder not found", self.root)
        if not isinstance(annotations, CocoAnnotations):
            annotations = load_coco_annotations(annotations)
        self.annotations = annotations
        self.coco = annotations.coco
        self.ids = sorted(self.coco.imgs)
        self.transforms = transforms
        self.label_map = label_map or LabelMap.from_categories(annotations.categories, "ids")
        unmapped = sorted(
            {int(c["id"]) for c in annotations.categories} - {c for c, _ in self.label_map.categories}
        )
        if self.label_map.mode == "contiguous" and unmapped:
            raise CocoDataError(
                f"categories {unmapped[:5]} are not among the {len(self.label_map.categories)} the labels map "
                "(--labels contiguous maps the training categories)",
                annotations.path,
            )

    def __len__(self) -> int:
        return len(self.ids)

    def set_epoch(self, epoch: int) -> None:
        """New augmentation draws each epoch; call before the epoch's loader iterator is made."""
        self.epoch = epoch

    def __getitem__(self, index: int) -> tuple[Tensor, dict[str, Any]]:
        image, target = self.load_item(index)
        return self.finish_item(image, target, index)

    def load_item(self, index: int) -> tuple[Image.Image, dict[str, Any]]:
        """Sample ``index`` before augmentation: the RGB image and its target.

        ``target["boxes"]`` is a XYXY pixel ``BoundingBoxes`` on the image, ``labels`` int64
        ``(n,)``, ``image_id`` and ``orig_size`` as in :meth:`__getitem__`.  A
        :class:`~peg_core.engine.BrokenSample` when the image or its annotations cannot be used.
        (:class:`~peg_detr.data.dense_o2o.MosaicDataset` reads its partner images through it.)
        """
        image_id = self.ids[index]
        path = self.root / self.coco.imgs[image_id]["file_name"]
        if image_id in self.annotations.broken:
            raise BrokenSample(path, self.annotations.broken[image_id])
        image = read_rgb(path)
        w, h = image.size
        for a in self.coco.imgToAnns[image_id]:  # the file's width / height may not be the picture's
            if box_outside_image(a["bbox"], w, h):
                raise BrokenSample(
                    path, f"annotation {a['id']} has bbox {a['bbox']} outside its {w}x{h} image"
                )
        kept = [a for a in self.coco.imgToAnns[image_id] if not a.get("iscrowd", 0)]
        xywh = torch.tensor([a["bbox"] for a in kept], dtype=torch.float32).reshape(-1, 4)
        xyxy = torch.cat([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], dim=1)
        target: dict[str, Any] = {
            "boxes": make_boxes(xyxy, (h, w)),
            "labels": self.label_map.labels_of(
                torch.tensor([a["category_id"] for a in kept], dtype=torch.int64)
            ),
            "image_id": torch.tensor(image_id),
            "orig_size": torch.tensor([h, w]),
        }
        return image, target

    def finish_item(
        self, image: Any, target: dict[str, Any], index: int, transforms: Callable | None = None
    ) -> tuple[Tensor, dict[str, Any]]:
        """``transforms`` (default: the dataset's) under sample ``index``'s seed, then DETR's target.

        ``image`` and ``target`` as :meth:`load_item` returns them (or a mosaic of several).
        """
        transforms = self.transforms if transforms is None else transforms
        if transforms is not None and self.seed is not None:
            with seeded(sample_seed(self.seed, self.epoch, index)):
                image, target = transforms(image, target)
        elif transforms is not None:
            image, target = transforms(image, target)
        if not isinstance(image, Tensor):
            raise TypeError(f"transforms must end with a tensor image, got {type(image).__name__}")
        return image, to_detr_target(target, image)

    @property
    def categories(self) -> list[dict[str, Any]]:
        """The json's categories, sorted by id."""
        return self.annotations.categories


def infer_num_classes(categories: list[dict[str, Any]], source: Any = None, labels: str = "ids") -> int:
    """The classifier size of ``categories``: ``max id + 1`` (``labels="ids"``, DETR's) or their count (``contiguous``)."""
    if not categories:
        raise CocoAnnotationError("the annotation file lists no categories; pass --num-classes", source)
    return LabelMap.from_categories(categories, labels).num_labels


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
