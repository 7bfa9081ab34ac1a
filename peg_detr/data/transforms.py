"""DETR's augmentation on ``torchvision.transforms.v2`` with ``tv_tensors.BoundingBoxes``.

Training (DETR, ``main.py``'s recipe): horizontal flip, then with equal odds
either a random short side from ``scales`` (long side capped at ``max_size``),
or a resize to one of ``crop_resize`` followed by a random crop whose sides lie
in ``crop_size`` and then the same multi-scale resize.  Validation: a fixed
short side.  Boxes move with the image; boxes that shrink to nothing after a
crop are removed by ``SanitizeBoundingBoxes`` (together with their labels).

The pipelines return an image tensor normalised with ImageNet mean/std and the
target with XYXY pixel boxes; :func:`to_detr_target` turns those into DETR's
normalised cxcywh boxes.

RT-DETR (``--arch rtdetr``) has its own pipelines below (:func:`make_rtdetr_train_transforms`,
:func:`make_rtdetr_val_transforms`, :class:`MultiScaleCollate`); DETR's are unchanged by them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from torchvision import tv_tensors
from torchvision.ops import box_convert
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from peg_core.engine import sample_seed

from ..structures import IMAGENET_MEAN, IMAGENET_STD, ImageBatch, pad_images

__all__ = [
    "DETR_CROP_RESIZE",
    "DETR_CROP_SIZE",
    "DETR_MAX_SIZE",
    "DETR_SCALES",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "RTDETR_SIZE",
    "RTDETR_TRAIN_SIZES",
    "MultiScaleCollate",
    "RandomSizeCrop",
    "make_boxes",
    "make_rtdetr_train_transforms",
    "make_rtdetr_val_transforms",
    "make_train_transforms",
    "make_val_transforms",
    "scaled_max_size",
    "to_detr_target",
]

DETR_SCALES: tuple[int, ...] = tuple(range(480, 801, 32))  # 480, 512, ..., 800
DETR_MAX_SIZE = 1333
DETR_CROP_RESIZE: tuple[int, ...] = (400, 500, 600)
DETR_CROP_SIZE: tuple[int, int] = (384, 600)


class RandomSizeCrop(v2.Transform):
    """Crop a random window whose height and width are drawn uniformly from ``[min_size, max_size]``.

    A side larger than the image is clipped to the image.  Boxes are cropped
    with the image (``F.crop`` on ``BoundingBoxes``) and may become empty; run
    ``SanitizeBoundingBoxes`` afterwards.
    """

    def __init__(self, min_size: int, max_size: int) -> None:
        super().__init__()
        if not 0 < min_size <= max_size:
            raise ValueError(f"RandomSizeCrop needs 0 < min_size <= max_size, got {min_size}, {max_size}")
        self.min_size = min_size
        self.max_size = max_size

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        h, w = v2.query_size(flat_inputs)
        ch = int(torch.randint(min(self.min_size, h), min(h, self.max_size) + 1, ()))
        cw = int(torch.randint(min(self.min_size, w), min(w, self.max_size) + 1, ()))
        top = int(torch.randint(0, h - ch + 1, ()))
        left = int(torch.randint(0, w - cw + 1, ()))
        return {"top": top, "left": left, "height": ch, "width": cw}

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        return self._call_kernel(F.crop, inpt, **params)


def scaled_max_size(short_side: int, ref_short: int = 800, ref_max: int = DETR_MAX_SIZE) -> int:
    """Long-side cap that keeps DETR's 800/1333 ratio for another short side."""
    return round(short_side * ref_max / ref_short)


def _finish(with_boxes: bool = True) -> list[v2.Transform]:
    boxes = [v2.ClampBoundingBoxes(), v2.SanitizeBoundingBoxes(min_size=1.0)] if with_boxes else []
    return [
        *boxes,
        v2.ToImage(),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(IMAGENET_MEAN, IMAGENET_STD),
    ]


def make_train_transforms(
    scales: Sequence[int] = DETR_SCALES,
    max_size: int = DETR_MAX_SIZE,
    crop_resize: Sequence[int] | None = DETR_CROP_RESIZE,
    crop_size: tuple[int, int] = DETR_CROP_SIZE,
    hflip: float = 0.5,
) -> v2.Compose:
    """DETR's training augmentation; ``crop_resize=None`` disables the resize-crop branch."""
    multi_scale = v2.RandomShortestSize(list(scales), max_size=max_size)
    if crop_resize:
        resize = v2.RandomChoice(
            [
                multi_scale,
                v2.Compose(
                    [
                        v2.RandomShortestSize(list(crop_resize)),
                        RandomSizeCrop(*crop_size),
                        v2.RandomShortestSize(list(scales), max_size=max_size),
                    ]
                ),
            ]
        )
    else:
        resize = multi_scale
    return v2.Compose([v2.RandomHorizontalFlip(hflip), resize, *_finish()])


def make_val_transforms(
    size: int | None = 800, max_size: int | None = DETR_MAX_SIZE, with_boxes: bool = True
) -> v2.Compose:
    """Deterministic resize of the short side to ``size`` (long side at most ``max_size``).

    ``size=None`` keeps the image at its own resolution (only normalises);
    ``with_boxes=False`` for images without targets (inference).
    """
    # v2.Resize, not RandomShortestSize([size]): the latter draws from the global RNG even with one
    # choice, so evaluating would shift the training run's random stream (and break exact resume).
    resize = [] if size is None else [v2.Resize(size, max_size=max_size)]
    return v2.Compose([*resize, *_finish(with_boxes)])


def to_detr_target(target: dict[str, Any], image: Tensor) -> dict[str, Tensor]:
    """XYXY pixel ``BoundingBoxes`` -> DETR's cxcywh boxes normalised by the (augmented) image size.

    Returns ``labels`` int64 ``(n,)``, ``boxes`` float32 ``(n, 4)``, ``size``
    ``(2,)`` = (h, w) after augmentation, and passes the other keys through.
    """
    h, w = image.shape[-2:]
    boxes = torch.as_tensor(target["boxes"]).float().reshape(-1, 4)
    boxes = box_convert(boxes, "xyxy", "cxcywh") / torch.tensor([w, h, w, h], dtype=torch.float32)
    out = {k: v for k, v in target.items() if k not in ("boxes", "labels")}
    out["boxes"] = boxes
    out["labels"] = torch.as_tensor(target["labels"], dtype=torch.int64).reshape(-1)
    out["size"] = torch.tensor([h, w])
    return out


def make_boxes(xyxy: Tensor, canvas_size: tuple[int, int]) -> tv_tensors.BoundingBoxes:
    """``(n, 4)`` XYXY pixel boxes as a ``BoundingBoxes`` on an image of size ``(h, w)``."""
    return tv_tensors.BoundingBoxes(xyxy.reshape(-1, 4), format="XYXY", canvas_size=canvas_size)


# ----------------------------------------------------------------------------------------- RT-DETR

#: RT-DETR's multi-scale training sides (square), drawn once per batch by :class:`MultiScaleCollate`:
#: DETR's short sides, 480..800 step 32
RTDETR_TRAIN_SIZES: tuple[int, ...] = DETR_SCALES
#: RT-DETR's training and evaluation side (its ``eval_spatial_size``)
RTDETR_SIZE = 640


def _to_unit_range() -> list[v2.Transform]:
    # RT-DETR (and transformers' RTDetrImageProcessor) feeds pixels scaled to [0, 1], not
    # ImageNet-normalised ones: weights trained there expect exactly that input.
    return [v2.ToImage(), v2.ToDtype(torch.float32, scale=True)]


def make_rtdetr_train_transforms(
    size: int = RTDETR_SIZE, hflip: float = 0.5, *, strong: bool = True
) -> v2.Compose:
    """RT-DETR's training augmentation, ending in a ``size`` × ``size`` image in ``[0, 1]``.

    Photometric distortion (p 0.5), zoom-out onto a black canvas (p 0.5), IoU crop (p 0.8),
    box sanitising, horizontal flip and a square resize, as in lyuwenyu/RT-DETR's
    ``rtdetr_r50vd_6x`` recipe.  ``strong=False`` leaves out the first three (RT-DETRv2's
    ``stop_epoch`` policy, :class:`StopEpochTransforms`).  The per-batch multi-scale resize comes
    later, in :class:`MultiScaleCollate`, so that every image of a batch has the same size.
    """
    strong_ops = [
        v2.RandomPhotometricDistort(p=0.5),
        v2.RandomZoomOut(fill=0),
        v2.RandomApply([v2.RandomIoUCrop()], p=0.8),
    ]
    return v2.Compose(
        [
            *(strong_ops if strong else []),
            v2.SanitizeBoundingBoxes(min_size=1.0),
            v2.RandomHorizontalFlip(hflip),
            v2.Resize((size, size)),
            v2.ClampBoundingBoxes(),
            v2.SanitizeBoundingBoxes(min_size=1.0),
            *_to_unit_range(),
        ]
    )


def make_rfdetr_train_transforms(
    size: int = RTDETR_SIZE, hflip: float = 0.5, *, strong: bool = True
) -> v2.Compose:
    """RF-DETR's training augmentation (rf-detr's ``make_coco_transforms_square_div_64``), ending in a
    ``size`` x ``size`` image in ``[0, 1]``: a horizontal flip, then one of a square resize or DETR's
    resize-crop (short side 400 / 500 / 600, a random 384..600 px crop) before it.

    What differs from rf-detr: the crop sizes scale with ``size / 384`` below 384 px (the CPU demos'
    small images; every published size trains at 384 px or more, with rf-detr's numbers), and the
    multi-scale side is drawn per batch (:class:`MultiScaleCollate`), not per image.
    ``strong=False`` (``--no-aug-epochs``) keeps the flip and the resize.
    """
    k = min(1.0, size / 384)
    crop = v2.Compose(
        [
            v2.RandomShortestSize([round(s * k) for s in DETR_CROP_RESIZE]),
            RandomSizeCrop(*(round(s * k) for s in DETR_CROP_SIZE)),
        ]
    )
    branch = [v2.RandomChoice([v2.Identity(), crop])] if strong else []
    return v2.Compose(
        [
            v2.RandomHorizontalFlip(hflip),
            *branch,
            v2.Resize((size, size)),
            v2.ClampBoundingBoxes(),
            v2.SanitizeBoundingBoxes(min_size=1.0),
            *_to_unit_range(),
        ]
    )


def make_rtdetr_val_transforms(size: int | None = RTDETR_SIZE, with_boxes: bool = True) -> v2.Compose:
    """A square resize to ``size`` × ``size`` (``None``: the image's own size), pixels in ``[0, 1]``."""
    resize = [] if size is None else [v2.Resize((size, size))]
    boxes = [v2.ClampBoundingBoxes(), v2.SanitizeBoundingBoxes(min_size=1.0)] if with_boxes else []
    return v2.Compose([*resize, *boxes, *_to_unit_range()])


class StopEpochTransforms:
    """RT-DETRv2's ``stop_epoch`` policy: ``strong`` transforms before ``stop_epoch``, ``plain`` from it on.

    lyuwenyu/RT-DETR ``rtdetrv2_pytorch/configs/rtdetrv2/include/dataloader.yml`` stops the
    photometric distortion, zoom-out and IoU crop (and the multi-scale collate) for the last
    epoch(s), so the model ends on images like the evaluation's.  Call :meth:`set_epoch` before
    each epoch's loader iterator is made (workers copy the data set then).  ``__call__(image,
    target)`` is the current transform's.
    """

    def __init__(self, strong: Any, plain: Any, stop_epoch: int) -> None:
        if stop_epoch < 0:
            raise ValueError(f"stop_epoch must be >= 0, got {stop_epoch}")
        self.strong, self.plain, self.stop_epoch = strong, plain, stop_epoch
        self.current = strong

    def set_epoch(self, epoch: int) -> None:
        self.current = self.strong if epoch < self.stop_epoch else self.plain

    def __call__(self, *inputs: Any) -> Any:
        return self.current(*inputs)


class MultiScaleCollate:
    """Stack a batch and resize it to one side drawn per batch from ``sizes`` (RT-DETR's multi-scale).

    Every image of the batch gets the same square size, so the batch needs no padding (the
    mask is all False); boxes are normalised cxcywh and so do not change.  With a ``seed`` the
    side is a function of ``(seed, epoch, the batch's image ids)``: the same whichever data-loader
    worker (or how many) collates the batch, and the same in a resumed run; without one it is
    drawn from torch's global generator.  ``sizes=()`` keeps the images as the transforms made
    them (images of several sizes are then padded, as for DETR).  With ``stop_epoch``, epochs
    from ``stop_epoch`` on (:meth:`set_epoch`) keep them too: RT-DETRv2's collate ``stop_epoch``.

    ``__call__(batch)`` takes ``[(image (3, H, W), target), ...]`` and returns
    ``(ImageBatch (B, 3, S, S), targets)`` with each target's ``size`` set to ``(S, S)``.
    """

    def __init__(
        self, sizes: Sequence[int] = (), stop_epoch: int | None = None, seed: int | None = None
    ) -> None:
        if any(int(s) < 1 for s in sizes):
            raise ValueError(f"multi-scale sizes must be positive, got {list(sizes)}")
        self.sizes = [int(s) for s in sizes]
        self.stop_epoch, self.seed, self.epoch = stop_epoch, seed, 0
        self.multi_scale = True

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.multi_scale = self.stop_epoch is None or epoch < self.stop_epoch

    def _side(self, targets: list[dict[str, Any]]) -> int:
        if self.seed is None:
            return self.sizes[int(torch.randint(len(self.sizes), ()))]
        ids = [int(t["image_id"]) for t in targets]
        return self.sizes[sample_seed("side", self.seed, self.epoch, *ids) % len(self.sizes)]

    def __call__(self, batch: list[tuple[Tensor, dict[str, Any]]]) -> tuple[Any, list[dict[str, Any]]]:
        images, targets = (list(x) for x in zip(*batch))
        if not self.sizes or not self.multi_scale:
            return pad_images(images), targets
        side = self._side(targets)
        resized = torch.cat([_resize_image(im, side) for im in images])
        mask = torch.zeros(len(images), side, side, dtype=torch.bool)
        size = torch.tensor([side, side])
        return ImageBatch(resized, mask), [{**t, "size": size} for t in targets]


def _resize_image(image: Tensor, side: int) -> Tensor:
    """``(3, H, W)`` -> ``(1, 3, side, side)`` with ``F.interpolate``'s default (nearest), as RT-DETR's
    batch collate does, so the recipe's inputs are the published ones."""
    if tuple(image.shape[-2:]) == (side, side):
        return image[None]
    return torch.nn.functional.interpolate(image[None], size=(side, side))
