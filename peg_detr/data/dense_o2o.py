"""DEIM's dense one-to-one matching on the data side: mosaic and mixup raise the targets per image.

DEIM (Huang et al., 2025, ShihuaHuang95/DEIM) keeps DETR's one-to-one matching but gives it more
positives per image by making the images denser: a *mosaic* of four training images on one canvas
and a batch *mixup* that blends each image with its neighbour and concatenates their targets.
Both run only in a window of epochs: DEIM's "data-augmentation warm-up" leaves the first epochs
plain, and the final ones go back to ordinary images so the model ends on pictures like the
evaluation's.  The recipe facts (``configs/base/dataloader.yml``, ``deim_hgnetv2_*_coco.yml``):

* transforms ``policy: {epoch: [4, 29, 50], ops: [Mosaic, RandomPhotometricDistort, RandomZoomOut,
  RandomIoUCrop]}`` with ``mosaic_prob: 0.5``: a sample is a mosaic with probability 0.5 for epochs
  in ``[4, 29)``; a mosaic sample skips the zoom-out and IoU crop (the two never meet in one sample);
  the policy ops are off before epoch 4 and from epoch 50 (the ``stop_epoch``) on;
* ``Mosaic(output_size=320, rotation_range=10, translation_range=[0.1, 0.1], scaling_range=[0.5,
  1.5], fill_value=0, use_cache=False)``: each of the four images is resized to a short side of 320,
  pasted in one quadrant of a canvas twice the largest tile, and the canvas goes through a random
  affine; the three partners are drawn from the whole data set (``use_cache: False``);
* collate ``mixup_prob: 0.5, mixup_epochs: [4, 29]``: per batch, with probability 0.5, image ``i``
  becomes ``beta * image_i + (1 - beta) * image_{i-1}`` with ``beta ~ U(0.45, 0.55)`` and gets both
  sets of boxes (``BatchImageCollateFunction``), before the multi-scale resize;
* the windows scale with the schedule: ``[4, 29, 50]`` in the 58-epoch L / X recipes, ``[4, 64, 120]``
  in the 132-epoch S recipe, i.e. ``[4, 4 + stop // 2, stop]`` (:meth:`DenseO2O.deim`).

Here the mosaic is a data-set wrapper (:class:`MosaicDataset`) and the mixup a collate wrapper
(:class:`MixupCollate`); :class:`DenseO2O` holds the four options and says which augmentations an
epoch uses.  Every random draw is a function of ``(seed, epoch, sample index)`` (mosaic) or
``(seed, epoch, the batch's image ids)`` (mixup), as the rest of :mod:`peg_detr.data` does, so
``--workers`` changes nothing.  With both probabilities at 0 nothing is wrapped and the pipeline is
exactly the one without this module.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from PIL import Image
from torch import Tensor
from torch.utils.data import Dataset
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from peg_core.engine import BrokenSample, sample_seed, seeded
from peg_core.errors import InputError

from .coco import CocoDetr
from .transforms import RTDETR_SIZE, make_rtdetr_train_transforms

__all__ = [
    "PER_BOX_KEYS",
    "DenseO2O",
    "MixupCollate",
    "Mosaic",
    "MosaicDataset",
    "active_augmentations",
    "dense_o2o_from_args",
    "dense_o2o_without_effect",
    "make_mosaic_transforms",
    "mixup_batch",
]

#: target entries with one row per box, moved and dropped together with the boxes (besides masks)
PER_BOX_KEYS = ("labels", "iscrowd", "area")


def _window(value: Any, name: str) -> tuple[int, int]:
    """``[start, end)`` epochs as a pair of ints; an :class:`InputError` naming ``name`` otherwise."""
    try:
        start, end = (int(v) for v in value)
    except (TypeError, ValueError):
        raise InputError(f"{name} must be two epochs [start, end)", value) from None
    if not 0 <= start <= end:
        raise InputError(f"{name} must satisfy 0 <= start <= end", f"{start} {end}")
    return start, end


@dataclass(frozen=True)
class DenseO2O:
    """DEIM's dense-O2O schedule: mosaic and mixup probabilities and their epoch windows.

    Attributes:
        mosaic_prob: probability that a training sample is a mosaic of four images (DEIM 0.5).
        mosaic_epochs: ``[start, end)``: the epochs that make mosaics (DEIM ``[4, 29)`` in the L / X
            recipes; ``end`` is where DEIM turns the mosaic off for the final epochs).
        mixup_prob: probability that a batch is mixed (DEIM 0.5).
        mixup_epochs: ``[start, end)`` of the mixup (DEIM: the mosaic's window).
        mixup_ratio: ``beta`` is drawn uniformly from ``[low, high]`` (DEIM ``[0.45, 0.55]``; equal
            bounds: a fixed ratio).

    Json-safe (:meth:`to_json` / :meth:`from_json`): lists of numbers, so a run's args record it.
    """

    mosaic_prob: float = 0.0
    mosaic_epochs: tuple[int, int] = (0, 0)
    mixup_prob: float = 0.0
    mixup_epochs: tuple[int, int] = (0, 0)
    mixup_ratio: tuple[float, float] = (0.45, 0.55)

    def __post_init__(self) -> None:
        for name in ("mosaic_prob", "mixup_prob"):
            p = float(getattr(self, name))
            if not 0.0 <= p <= 1.0:
                raise InputError(f"{name} must be in [0, 1]", p)
            object.__setattr__(self, name, p)
        for name in ("mosaic_epochs", "mixup_epochs"):
            object.__setattr__(self, name, _window(getattr(self, name), name))
        try:
            low, high = (float(v) for v in self.mixup_ratio)
        except (TypeError, ValueError):
            raise InputError("mixup_ratio must be two numbers [low, high]", self.mixup_ratio) from None
        if not 0.0 <= low <= high <= 1.0:
            raise InputError("mixup_ratio must satisfy 0 <= low <= high <= 1", f"{low} {high}")
        object.__setattr__(self, "mixup_ratio", (low, high))

    @classmethod
    def deim(cls, stop_epoch: int, prob: float = 0.5) -> DenseO2O:
        """DEIM's schedule for a run whose strong augmentation stops at ``stop_epoch``.

        Mosaic and mixup at ``prob`` in ``[4, 4 + stop_epoch // 2)``: ``[4, 29)`` for the L / X
        recipes' stop 50, ``[4, 64)`` for the S recipe's stop 120.
        """
        window = (4, 4 + int(stop_epoch) // 2)
        return cls(prob, window, prob, window)

    def active(self, epoch: int) -> frozenset[str]:
        """The augmentations epoch ``epoch`` uses: a subset of ``{"mosaic", "mixup"}``."""
        on = set()
        if self.mosaic_prob > 0 and self.mosaic_epochs[0] <= epoch < self.mosaic_epochs[1]:
            on.add("mosaic")
        if self.mixup_prob > 0 and self.mixup_epochs[0] <= epoch < self.mixup_epochs[1]:
            on.add("mixup")
        return frozenset(on)

    @property
    def uses_mosaic(self) -> bool:
        """Some epoch makes mosaics (the data set needs the wrapper)."""
        return self.mosaic_prob > 0 and self.mosaic_epochs[0] < self.mosaic_epochs[1]

    @property
    def uses_mixup(self) -> bool:
        """Some epoch mixes batches (the collate needs the wrapper)."""
        return self.mixup_prob > 0 and self.mixup_epochs[0] < self.mixup_epochs[1]

    def to_json(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DenseO2O:
        return cls(**data)


def active_augmentations(dense: DenseO2O | None, epoch: int) -> frozenset[str]:
    """The dense-O2O augmentations of ``epoch`` (none without a schedule)."""
    return frozenset() if dense is None else dense.active(epoch)


def dense_o2o_from_args(args: argparse.Namespace) -> DenseO2O | None:
    """The schedule ``--mosaic-prob`` / ``--mosaic-epochs`` / ``--mixup-prob`` / ``--mixup-epochs`` ask
    for, or None when neither augmentation is used (flags absent, probabilities 0 or empty windows).

    An epoch window may be one number ``N``, read as ``[0, N)``.  A bad value is an
    :class:`~peg_core.errors.InputError` naming its flag.
    """
    fields: dict[str, Any] = {}
    for name in ("mosaic_prob", "mixup_prob"):
        p = float(getattr(args, name, None) or 0.0)
        if not 0.0 <= p <= 1.0:
            raise InputError("must be in [0, 1]", f"--{name.replace('_', '-')} {p}")
        fields[name] = p
    for name in ("mosaic_epochs", "mixup_epochs"):
        value = getattr(args, name, None)
        if value is None:
            value = (0, 0)
        elif isinstance(value, (int, float)):
            value = (0, value)
        elif len(value) == 1:
            value = (0, *value)
        fields[name] = _window(value, f"--{name.replace('_', '-')}")
    dense = DenseO2O(**fields)
    return dense if dense.uses_mosaic or dense.uses_mixup else None


def dense_o2o_without_effect(args: argparse.Namespace) -> dict[str, str]:
    """The DEIM flags that would change nothing in this run -> why (for ``refuse_without_effect``).

    * a probability above 0 whose epoch window holds none of the run's epochs ``0 .. epochs - 1``
      (the default window is empty, so ``--mosaic-prob 1`` alone makes no mosaic): the window's
      flag and the probability's, so whichever the command line gave is named;
    * an epoch window given without a probability (0: nothing is ever drawn).

    The recipe's own values are not refused (``refuse_without_effect`` names only flags the command
    line gave).
    """
    epochs = int(getattr(args, "epochs", None) or 0)
    reasons: dict[str, str] = {}
    for aug, what in (("mosaic", "mosaic"), ("mixup", "mixed batch")):
        prob, window = f"{aug}_prob", f"{aug}_epochs"
        value = getattr(args, window, None)
        if value is None:
            start, end = 0, 0
        elif isinstance(value, int | float):
            start, end = 0, int(value)
        else:
            start, end = (0, int(value[0])) if len(value) == 1 else (int(value[0]), int(value[1]))
        if float(getattr(args, prob, None) or 0.0) > 0:
            if min(end, epochs) <= start:  # no epoch of [0, epochs) is in [start, end)
                where = (
                    f"its epoch window --{aug}-epochs is empty ({start},{end})"
                    if end <= start
                    else f"its epoch window --{aug}-epochs {start},{end} holds none of the run's epochs 0..{epochs - 1}"
                )
                why = f"makes no {what} in this run: {where}; give --{aug}-epochs START,END with START < END, START < {epochs} (--epochs)"
                reasons[window] = reasons[prob] = why
        else:
            reasons[window] = f"has no effect without --{aug}-prob (no {what} is drawn at probability 0)"
    return reasons


# -------------------------------------------------------------------------------------------- mosaic


def _as_image(image: Any) -> tv_tensors.Image:
    """A PIL image or ``(C, H, W)`` tensor as a ``tv_tensors.Image`` (same dtype)."""
    if isinstance(image, Image.Image):
        return tv_tensors.Image(F.pil_to_tensor(image))
    if isinstance(image, Tensor):
        return image if isinstance(image, tv_tensors.Image) else tv_tensors.Image(image)
    raise TypeError(f"mosaic tiles must be PIL images or tensors, got {type(image).__name__}")


def _xyxy(boxes: Any) -> Tensor:
    """``(n, 4)`` plain XYXY tensor of a ``BoundingBoxes`` in any format."""
    if isinstance(boxes, tv_tensors.BoundingBoxes):
        boxes = F.convert_bounding_box_format(boxes, new_format=tv_tensors.BoundingBoxFormat.XYXY)
    return torch.as_tensor(boxes).as_subclass(Tensor).reshape(-1, 4).float()


class Mosaic(v2.Transform):
    """Four ``(image, target)`` samples -> one: a 2 × 2 canvas, then a random affine and a box clean-up.

    ``forward(samples)`` takes four samples (``None`` for a tile left blank, e.g. an unreadable
    partner; the first must be given), each an image (PIL or ``(C, H, W)`` tensor) and a target
    whose ``boxes`` is a ``tv_tensors.BoundingBoxes``.  Each tile is resized to a short side of
    ``output_size`` (long side at most ``max_size``; ``None``: kept), tile ``k`` is pasted at the
    top-left corner of quadrant ``k`` (row-major) of a canvas ``(2 h, 2 w)`` filled with ``fill``,
    ``(h, w)`` the largest tile sides, and the boxes move with their tiles.  A
    ``v2.RandomAffine(degrees, translate, scale)`` of the canvas follows (left out when it is the
    identity).  Boxes are then clipped to the canvas; a box is dropped when a clipped side is below
    ``min_size`` pixels, its clipped area is 0, or less than ``min_visible`` of its area before
    clipping remains; the size rule also runs before the affine, whose rotation would otherwise
    inflate a degenerate box's hull into a target.  Every per-box entry (:data:`PER_BOX_KEYS`, e.g.
    ``labels`` and ``iscrowd``, and every ``tv_tensors.Mask`` ``(n, H, W)``, placed on the canvas
    like its image) moves and is dropped with its box, so crowd flags and masks stay aligned with
    the boxes; a per-box entry that some tile lacks is left out.  Other entries (``image_id``,
    ``orig_size``) are the first sample's.

    Returns ``(tv_tensors.Image (C, H', W'), target)`` with ``boxes`` a XYXY ``BoundingBoxes`` on
    the canvas: the input of a v2 pipeline.  Random draws come from torch's global generator (the
    caller seeds it, as :class:`MosaicDataset` does).  Defaults: DEIM's recipe values.
    """

    def __init__(
        self,
        output_size: int | None = 320,
        max_size: int | None = None,
        degrees: float = 10.0,
        translate: tuple[float, float] | None = (0.1, 0.1),
        scale: tuple[float, float] | None = (0.5, 1.5),
        fill: int | float = 0,
        min_size: float = 1.0,
        min_visible: float = 0.0,
    ) -> None:
        super().__init__()
        if output_size is not None and output_size < 1:
            raise ValueError(f"output_size must be positive, got {output_size}")
        if not 0.0 <= min_visible <= 1.0:
            raise ValueError(f"min_visible must be in [0, 1], got {min_visible}")
        self.resize = None if output_size is None else v2.Resize(output_size, max_size=max_size)
        self.fill, self.min_size, self.min_visible = fill, float(min_size), float(min_visible)
        identity = not degrees and not any(translate or ()) and tuple(scale or (1.0, 1.0)) == (1.0, 1.0)
        # masks are filled with 0 (no object), the image with ``fill``
        self.affine = (
            None
            if identity
            else v2.RandomAffine(
                degrees, translate=translate, scale=scale, fill={tv_tensors.Image: fill, tv_tensors.Mask: 0}
            )
        )

    # four samples in, one out: not v2.Transform's one-sample forward
    def forward(  # type: ignore[override]
        self, samples: Sequence[tuple[Any, dict[str, Any]] | None]
    ) -> tuple[Any, dict[str, Any]]:
        if len(samples) != 4 or samples[0] is None:
            raise ValueError("Mosaic takes four (image, target) samples, the first one given")
        tiles: list[tuple[tv_tensors.Image, dict[str, Any]] | None] = []
        for sample in samples:
            if sample is None:
                tiles.append(None)
                continue
            image, target = _as_image(sample[0]), dict(sample[1])
            if self.resize is not None:
                image, target = self.resize(image, target)
            tiles.append((image, target))
        canvas, target = self._paste(tiles)
        if self.affine is not None:
            # degenerate tile boxes first: the affine's rotation would inflate their hulls into targets
            canvas, target = self.affine(canvas, self._clean(target, clamping_mode=None))
        return canvas, self._clean(target)

    def _paste(
        self, tiles: list[tuple[tv_tensors.Image, dict[str, Any]] | None]
    ) -> tuple[tv_tensors.Image, dict[str, Any]]:
        given = [t for t in tiles if t is not None]
        first_image, first = given[0]
        h = max(int(im.shape[-2]) for im, _ in given)
        w = max(int(im.shape[-1]) for im, _ in given)
        canvas = torch.full((first_image.shape[0], 2 * h, 2 * w), self.fill, dtype=first_image.dtype)
        # per-box entries every tile has; one some tile lacks cannot stay aligned and is left out
        per_box = [k for k in PER_BOX_KEYS if all(k in t for _, t in given)]
        mask_keys = [k for k in first if all(isinstance(t.get(k), tv_tensors.Mask) for _, t in given)]
        boxes: list[Tensor] = []
        rows: dict[str, list[Tensor]] = {k: [] for k in (*per_box, *mask_keys)}
        for k, tile in enumerate(tiles):
            if tile is None:
                continue
            image, target = tile
            dy, dx = (k // 2) * h, (k % 2) * w
            ih, iw = image.shape[-2:]
            canvas[:, dy : dy + ih, dx : dx + iw] = image
            boxes.append(_xyxy(target["boxes"]) + torch.tensor([dx, dy, dx, dy], dtype=torch.float32))
            for key in per_box:
                rows[key].append(torch.as_tensor(target[key]).reshape(len(boxes[-1]), *target[key].shape[1:]))
            for key in mask_keys:
                m = target[key]
                placed = m.new_zeros((m.shape[0], 2 * h, 2 * w))
                placed[:, dy : dy + m.shape[-2], dx : dx + m.shape[-1]] = m
                rows[key].append(placed)
        merged = {
            k: v
            for k, v in first.items()
            if k != "boxes" and k not in PER_BOX_KEYS and not isinstance(v, tv_tensors.Mask)
        }
        # unclamped through the affine, so that the clean-up knows how much of each box was cut
        merged["boxes"] = tv_tensors.BoundingBoxes(
            torch.cat(boxes), format="XYXY", canvas_size=(2 * h, 2 * w), clamping_mode=None
        )
        for key in per_box:
            merged[key] = torch.cat(rows[key])
        for key in mask_keys:
            merged[key] = tv_tensors.Mask(torch.cat(rows[key]))
        return tv_tensors.Image(canvas), merged

    def _clean(self, target: dict[str, Any], clamping_mode: str | None = "soft") -> dict[str, Any]:
        boxes = target["boxes"]
        ch, cw = boxes.canvas_size
        xyxy = boxes.as_subclass(Tensor).float()
        before = (xyxy[:, 2:] - xyxy[:, :2]).clamp(min=0).prod(1)
        clipped = torch.stack(
            [
                xyxy[:, 0].clamp(0, cw),
                xyxy[:, 1].clamp(0, ch),
                xyxy[:, 2].clamp(0, cw),
                xyxy[:, 3].clamp(0, ch),
            ],
            1,
        )
        wh = clipped[:, 2:] - clipped[:, :2]
        area = wh.prod(1)
        keep = (wh >= self.min_size).all(1) & (area > 0) & (area >= self.min_visible * before)
        out = dict(target)
        out["boxes"] = tv_tensors.BoundingBoxes(
            clipped[keep], format="XYXY", canvas_size=(ch, cw), clamping_mode=clamping_mode
        )
        for key, value in target.items():
            if key in PER_BOX_KEYS:
                out[key] = value[keep]
            elif isinstance(value, tv_tensors.Mask):
                out[key] = tv_tensors.wrap(value[keep], like=value)
        return out


def make_mosaic_transforms(size: int = RTDETR_SIZE, hflip: float = 0.5) -> v2.Compose:
    """What follows a mosaic in the RT-DETR family (DEIM's order): photometric distortion (p 0.5),
    box sanitising, horizontal flip, a ``size`` × ``size`` resize, pixels in ``[0, 1]``.

    :func:`~peg_detr.data.make_rtdetr_train_transforms` without its zoom-out and IoU crop, which
    DEIM never applies to a mosaic sample.
    """
    plain = make_rtdetr_train_transforms(size, hflip, strong=False)
    return v2.Compose([v2.RandomPhotometricDistort(p=0.5), *plain.transforms])


class MosaicDataset(Dataset):
    """A :class:`~peg_detr.data.CocoDetr` whose samples are, with ``dense.mosaic_prob``, mosaics of four.

    In an epoch that :meth:`DenseO2O.active` gives ``"mosaic"``, sample ``index`` is drawn a mosaic
    with probability ``mosaic_prob``; its three partners are drawn uniformly from the whole data
    set; :class:`Mosaic` joins them, then ``transforms`` (default: the data set's own;
    :func:`make_mosaic_transforms` for the RT-DETR family) runs under the sample's seed and the
    target becomes DETR's (:meth:`CocoDetr.finish_item`).  Any other sample is the data set's
    ``dataset[index]``, bit for bit.  A partner that cannot be read leaves its tile blank (it is
    reported as broken when its own index comes); an unreadable ``index`` is a
    :class:`~peg_core.engine.BrokenSample` as without the wrapper.

    Why a data-set wrapper, not a collate op, and why no sample cache: a mosaic must be made
    *before* the per-sample geometry (DEIM: mosaic, then flip and the square resize; the affine
    crops tiles of the original resolution), which a collate only sees afterwards; a collate would
    also pick partners only inside its batch (with the demos' batch of 4, every mosaic would hold
    the same four images).  DEIM's ``use_cache`` mode draws partners from a cache of the images a
    worker happened to load before, which depends on ``--workers``; its recipe runs with
    ``use_cache: False``, drawing from the data set, and so does this: the decision, the partners
    and the affine are functions of ``(seed, epoch, index)``, whichever worker makes the sample.
    The cost is three extra image reads per mosaic, in the loader's workers.

    Call :meth:`set_epoch` before each epoch's iterator is made (it sets the wrapped set's too);
    other attributes (``coco``, ``categories``, ``transforms``...) are the wrapped set's.
    """

    def __init__(
        self,
        dataset: CocoDetr,
        dense: DenseO2O,
        mosaic: Mosaic | None = None,
        transforms: Callable | None = None,
    ) -> None:
        self.dataset, self.dense = dataset, dense
        self.mosaic = mosaic if mosaic is not None else Mosaic()
        self.mosaic_transforms = transforms
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.dataset)

    def __getattr__(self, name: str) -> Any:  # coco, categories, transforms, seed, ... of the wrapped set
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.dataset.set_epoch(epoch)

    def partners(self, index: int) -> list[int] | None:
        """The three partner indices of sample ``index`` this epoch, or None when it is no mosaic."""
        if "mosaic" not in self.dense.active(self.epoch):
            return None
        seed = self.dataset.seed
        # its own generator: the decision must not move the stream the sample's transforms draw from
        g = (
            None
            if seed is None
            else torch.Generator().manual_seed(sample_seed("mosaic", seed, self.epoch, index))
        )
        if float(torch.rand((), generator=g)) >= self.dense.mosaic_prob:
            return None
        return [int(i) for i in torch.randint(len(self.dataset), (3,), generator=g)]

    def __getitem__(self, index: int) -> tuple[Tensor, dict[str, Any]]:
        partners = self.partners(index)
        if partners is None:
            return self.dataset[index]
        samples: list[tuple[Any, dict[str, Any]] | None] = [self.dataset.load_item(index)]
        for j in partners:
            try:
                samples.append(self.dataset.load_item(j))
            except BrokenSample:
                samples.append(None)
        seed = self.dataset.seed
        if seed is None:
            image, target = self.mosaic(samples)
        else:
            with seeded(sample_seed("mosaic-affine", seed, self.epoch, index)):
                image, target = self.mosaic(samples)
        return self.dataset.finish_item(image, target, index, self.mosaic_transforms)


# --------------------------------------------------------------------------------------------- mixup


def _rescale(boxes: Tensor, size: tuple[int, int], canvas: tuple[int, int]) -> Tensor:
    """Normalised cxcywh boxes of an image of ``size`` pasted top-left on a ``canvas`` (both (h, w))."""
    (h, w), (ch, cw) = size, canvas
    return boxes * torch.tensor([w / cw, h / ch, w / cw, h / ch], dtype=boxes.dtype)


def mixup_batch(
    batch: Sequence[tuple[Tensor, dict[str, Any]]], beta: float
) -> list[tuple[Tensor, dict[str, Any]]]:
    """DEIM's batch mixup: image ``i`` -> ``beta * image_i + (1 - beta) * image_{i-1}`` (cyclic).

    ``batch`` holds ``(image (C, H, W), target)`` with DETR targets (normalised cxcywh ``boxes``).
    Target ``i`` gets its own boxes then those of ``i - 1`` (labels and the other
    :data:`PER_BOX_KEYS` alike) and ``mixup`` float32 ``(n_i + n_{i-1},)``: each box's image weight,
    ``beta`` or ``1 - beta``.  Images of different sizes are blended top-left aligned on a canvas of
    the larger sides (zeros elsewhere), their boxes renormalised to it and ``size`` set to it; images
    of one size (the RT-DETR family's square ones) are blended as DEIM does.
    """
    images = [im for im, _ in batch]
    targets = [t for _, t in batch]
    out = []
    for i, (a, ta) in enumerate(zip(images, targets)):
        b, tb = images[i - 1], targets[i - 1]
        ba, bb = ta["boxes"], tb["boxes"]
        extra: dict[str, Any] = {}
        if a.shape == b.shape:
            mixed = b * (1.0 - beta) + a * beta
        else:
            (ha, wa), (hb, wb) = a.shape[-2:], b.shape[-2:]
            canvas = (max(ha, hb), max(wa, wb))
            mixed = a.new_zeros((a.shape[0], *canvas))
            mixed[:, :hb, :wb] = b * (1.0 - beta)
            mixed[:, :ha, :wa] += a * beta
            ba, bb = _rescale(ba, (ha, wa), canvas), _rescale(bb, (hb, wb), canvas)
            extra["size"] = torch.tensor(canvas)
        target = {**ta, **extra, "boxes": torch.cat([ba, bb])}
        for key in PER_BOX_KEYS:
            if key in ta and key in tb:
                target[key] = torch.cat([ta[key], tb[key]])
        target["mixup"] = torch.cat(
            [
                torch.full((len(ba),), beta, dtype=torch.float32),
                torch.full((len(bb),), 1.0 - beta, dtype=torch.float32),
            ]
        )
        out.append((mixed, target))
    return out


class MixupCollate:
    """A collate function that first mixes the batch (:func:`mixup_batch`), then calls ``collate``.

    In an epoch that :meth:`DenseO2O.active` gives ``"mixup"``, a batch of two or more is mixed with
    probability ``dense.mixup_prob`` and ``beta`` drawn uniformly from ``dense.mixup_ratio``; with a
    ``seed`` both draws are functions of ``(seed, epoch, the batch's image ids)``, as
    :class:`~peg_detr.data.MultiScaleCollate`'s side is (any worker, any ``--workers``, a resumed
    run); without one they come from torch's global generator.  The mix comes before ``collate``, so
    RT-DETR's multi-scale resize sees the mixed images, as in DEIM.  :meth:`set_epoch` also sets
    ``collate``'s epoch when it has one.  A class, not a closure: spawned workers pickle it.
    """

    def __init__(self, collate: Callable[[list[Any]], Any], dense: DenseO2O, seed: int | None = None) -> None:
        self.collate, self.dense, self.seed = collate, dense, seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if hasattr(self.collate, "set_epoch"):
            self.collate.set_epoch(epoch)

    def ratio(self, targets: Sequence[dict[str, Any]]) -> float | None:
        """This batch's ``beta``, or None when it is not mixed."""
        if "mixup" not in self.dense.active(self.epoch) or len(targets) < 2:
            return None
        g = None
        if self.seed is not None:
            ids = [int(t["image_id"]) for t in targets]
            g = torch.Generator().manual_seed(sample_seed("mixup", self.seed, self.epoch, *ids))
        if float(torch.rand((), generator=g)) >= self.dense.mixup_prob:
            return None
        low, high = self.dense.mixup_ratio
        return low + (high - low) * float(torch.rand((), generator=g))

    def __call__(self, batch: list[tuple[Tensor, dict[str, Any]]]) -> Any:
        beta = self.ratio([t for _, t in batch])
        return self.collate(batch if beta is None else mixup_batch(batch, beta))
