"""Classifier data: the generated shapes in memory, or an ImageFolder tree on disk.

ImageFolder layout (``--data PATH``)::

    PATH/train/<class>/*.jpg|png|...    PATH/val/<class>/*.jpg|png|...

Class indices follow the sorted ``train/`` folder names; ``val/`` may hold a subset.
torchvision (transforms.v2, folder scanning, the PIL loader) is imported only when a
folder is used, so ``import peg_core`` stays torch-only.  An image that cannot be
decoded (truncated, not an image) raises :class:`~peg_core.engine.BrokenSample`:
the engine skips, counts and lists it.  A tree that cannot be used at all (no ``train/``,
no class folders, an unreadable folder) is an :class:`ImageFolderError`, an
:class:`~peg_core.errors.InputError` naming the folder.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset

from ..engine import BrokenSample
from ..engine.predictor import rgb_image
from ..errors import InputError, require
from .shapes import ShapeScenes

__all__ = [
    "NORMALIZE",
    "FolderImages",
    "ImageFolderData",
    "ImageFolderError",
    "ShapeImages",
    "check_layout",
    "folder_transform",
    "load_image",
    "open_image_folder",
    "open_val_split",
    "require_torchvision",
    "scan_split",
]

IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
HALF = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))  # x -> 2x - 1: what the generated scenes use
#: ``--normalize`` choices: (mean, std) per RGB channel
NORMALIZE = {"imagenet": IMAGENET, "half": HALF}
AUGMENTS = ("flip-crop", "none")
LAYOUT = "expected PATH/train/<class>/*.jpg and PATH/val/<class>/*.jpg"


class ImageFolderError(InputError):
    """An ImageFolder tree that cannot be used: ``what`` says why, ``where`` names the folder."""


class ShapeImages(Dataset):
    """Generated scenes rendered once at ``img_size``: items ``(image (3, H, W) float32, label)``.

    Args:
        scenes: the scene parameters (:func:`~peg_core.classify.shapes.sample_scenes`).
        img_size: side of the rendered images.
        mean, std: normalisation of RGB in ``[0, 1]`` (the default equals the scenes' own ``2 rgb - 1``).
        classes: the model's class names; labels are mapped to their index in it (a model trained
            on a ``make-data`` folder orders them alphabetically).  ``None``: label order.
    """

    def __init__(
        self,
        scenes: ShapeScenes,
        img_size: int,
        mean: Sequence[float] = HALF[0],
        std: Sequence[float] = HALF[1],
        classes: Sequence[str] | None = None,
    ) -> None:
        x = scenes.images(img_size)  # 2 rgb - 1 (+ noise)
        if (tuple(mean), tuple(std)) != HALF:
            m, s = torch.tensor(mean).view(3, 1, 1), torch.tensor(std).view(3, 1, 1)
            x = ((x + 1) / 2 - m) / s
        self.images = x
        self.classes = list(classes) if classes is not None else list(scenes.class_names)
        order = torch.tensor([self.classes.index(name) for name in scenes.class_names])
        self.labels = order[scenes.labels]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        return self.images[i], self.labels[i]


def load_image(path: str | os.PathLike) -> Any:
    """The image file as an 8-bit RGB PIL image; an unreadable file raises :class:`BrokenSample`.

    As torchvision's ImageFolder loader, but 16-bit grey PNGs are scaled rather than clipped to
    white (:func:`~peg_core.engine.predictor.rgb_image`, shared with ``predict``).
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            return rgb_image(im)  # decodes now: a truncated file fails here
    except FileNotFoundError:
        raise BrokenSample(path, "file not found") from None
    except UnidentifiedImageError:
        raise BrokenSample(path, "not an image (no image format recognised)") from None
    except (OSError, ValueError, SyntaxError, struct.error, Image.DecompressionBombError) as e:
        # PIL: OSError "image file is truncated", SyntaxError "broken PNG file", struct.error on garbage.
        raise BrokenSample(path, f"cannot decode image ({type(e).__name__}: {e})") from None


class FolderImages(Dataset):
    """Images listed as ``(path, class index)``, decoded with :func:`load_image` and ``transform``."""

    def __init__(
        self, samples: Sequence[tuple[str, int]], classes: Sequence[str], transform: Callable[[Any], Tensor]
    ) -> None:
        self.samples = list(samples)
        self.classes = list(classes)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[Tensor, int]:
        path, target = self.samples[i]
        return self.transform(load_image(path)), target


def folder_transform(
    img_size: int,
    train: bool,
    augment: str = "flip-crop",
    crop_ratio: float = 0.875,
    mean: Sequence[float] = IMAGENET[0],
    std: Sequence[float] = IMAGENET[1],
) -> Callable[[Any], Tensor]:
    """PIL image -> ``(3, img_size, img_size)`` float32, normalised.

    Training with ``augment="flip-crop"``: random-resized crop + horizontal flip.  Otherwise
    (evaluation, or ``augment="none"``): resize the short side to ``img_size / crop_ratio``, centre crop.
    """
    from torchvision.transforms import v2

    if train and augment == "flip-crop":
        geometry = [v2.RandomResizedCrop(img_size, antialias=True), v2.RandomHorizontalFlip()]
    else:
        geometry = [v2.Resize(round(img_size / crop_ratio), antialias=True), v2.CenterCrop(img_size)]
    return v2.Compose(
        [v2.ToImage(), *geometry, v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(mean), list(std))]
    )


def require_torchvision(what: str = "an image folder (--data)") -> None:
    """A one-line ``MissingDependency`` naming ``peg-core[vision]`` when torchvision or its PIL is missing."""
    require("torchvision", "vision", what=what)
    require("PIL", "vision", what=what)


def _torchvision_folder() -> Any:
    require_torchvision()
    from torchvision.datasets import folder

    return folder


def _subfolders(path: Path) -> list[str]:
    try:
        return sorted(e.name for e in os.scandir(path) if e.is_dir() and not e.name.startswith("."))
    except OSError as e:
        raise ImageFolderError(f"cannot read folder ({e.strerror or e})", path) from None


def scan_split(
    split_dir: Path, classes: Sequence[str] | None = None
) -> tuple[list[tuple[str, int]], list[str]]:
    """The ``(path, index)`` samples of one split folder and the class names.

    ``classes=None`` (training): the sorted class folders, each of which must hold images.
    Otherwise every class folder must be one of ``classes`` (indices follow ``classes``).
    """
    folder = _torchvision_folder()
    found = _subfolders(split_dir)
    if not found:
        raise ImageFolderError(f"no class folders ({LAYOUT})", split_dir)
    training = classes is None
    if classes is None:
        classes = found
    else:
        unknown = [c for c in found if c not in classes]
        if unknown:
            raise ImageFolderError(
                f"class folder {unknown[0]!r} is not one of the model's {len(classes)} classes",
                split_dir / unknown[0],
            )
    index = {c: i for i, c in enumerate(classes)}
    samples: list[tuple[str, int]] = []
    for name in found:
        try:
            # make_dataset keeps files with an image extension (a text file named .jpg too: that one
            # becomes a BrokenSample when read).
            files = folder.make_dataset(
                str(split_dir), {name: index[name]}, extensions=folder.IMG_EXTENSIONS, allow_empty=True
            )
        except OSError as e:
            raise ImageFolderError(f"cannot read folder ({e.strerror or e})", split_dir / name) from None
        if not files and training:
            raise ImageFolderError(f"class folder holds no images ({', '.join(folder.IMG_EXTENSIONS[:4])}, ...)",
                            split_dir / name)  # fmt: skip
        samples += files
    if not samples:
        raise ImageFolderError(f"no images ({LAYOUT})", split_dir)
    return samples, list(classes)


@dataclass
class ImageFolderData:
    """The scanned ``train/`` and ``val/`` splits of an ImageFolder root."""

    root: Path
    classes: list[str]
    train: list[tuple[str, int]]
    val: list[tuple[str, int]]


def _split_dir(root: Path, split: str) -> Path:
    if not root.exists():
        raise ImageFolderError("data folder not found", root)
    if not root.is_dir():
        raise ImageFolderError("data path is not a folder", root)
    if not (root / split).is_dir():
        raise ImageFolderError(f"data folder has no {split}/ folder ({LAYOUT})", root)
    return root / split


def check_layout(root: str | os.PathLike) -> None:
    """The quick checks of an ImageFolder root (exists, has ``train/`` and ``val/``), without scanning."""
    for split in ("train", "val"):
        _split_dir(Path(root), split)


def open_image_folder(root: str | os.PathLike) -> ImageFolderData:
    """Check and scan an ImageFolder root; every problem is an :class:`ImageFolderError` naming the path."""
    root = Path(root)
    train_dir, val_dir = _split_dir(root, "train"), _split_dir(root, "val")
    train, classes = scan_split(train_dir)
    val, _ = scan_split(val_dir, classes)
    return ImageFolderData(root, classes, train, val)


def open_val_split(root: str | os.PathLike, classes: Sequence[str]) -> list[tuple[str, int]]:
    """The samples of ``root/val`` indexed by a model's ``classes`` (``train/`` is not needed)."""
    return scan_split(_split_dir(Path(root), "val"), classes)[0]
