"""A padded image batch with its padding mask (DETR's NestedTensor), and moving DETR's outputs/targets."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "ImageBatch", "pad_images", "targets_to", "to_float"]

#: ImageNet's per-channel mean / std (RGB, in [0, 1]): the standardisation of every detector's input,
#: whether the data pipeline applies it (DETR, RT-DETR, D-FINE) or the backbone does (the ViTs of
#: DEIMv2 and RF-DETR), and of the ``preprocessor_config.json`` export-hf writes
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class ImageBatch(NamedTuple):
    """``tensors`` ``(B, 3, H, W)`` zero-padded images; ``mask`` ``(B, H, W)`` bool, True at padding."""

    tensors: Tensor
    mask: Tensor

    def to(self, device: torch.device | str, non_blocking: bool = False) -> ImageBatch:
        return ImageBatch(
            self.tensors.to(device, non_blocking=non_blocking),
            self.mask.to(device, non_blocking=non_blocking),
        )


def pad_images(images: list[Tensor], size_divisibility: int = 1) -> ImageBatch:
    """Pad ``(3, H_i, W_i)`` images bottom/right to a common size (a multiple of ``size_divisibility``)."""
    if not images:
        raise ValueError("pad_images needs at least one image")
    for i, im in enumerate(images):
        if im.dim() != 3:
            raise ValueError(f"image {i} has shape {tuple(im.shape)}; expected (C, H, W)")
    c = images[0].shape[0]
    h = max(im.shape[1] for im in images)
    w = max(im.shape[2] for im in images)
    if size_divisibility > 1:
        h = -(-h // size_divisibility) * size_divisibility
        w = -(-w // size_divisibility) * size_divisibility
    tensors = images[0].new_zeros(len(images), c, h, w)
    mask = torch.ones(len(images), h, w, dtype=torch.bool, device=images[0].device)
    for i, im in enumerate(images):
        tensors[i, :, : im.shape[1], : im.shape[2]].copy_(im)
        mask[i, : im.shape[1], : im.shape[2]] = False
    return ImageBatch(tensors, mask)


def to_float(x: Any) -> Any:
    """Floating tensors in nested outputs as float32 (matching, losses and boxes run in full precision)."""
    if isinstance(x, Tensor):
        return x.float() if x.is_floating_point() else x
    if isinstance(x, dict):
        return {k: to_float(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return type(x)(to_float(v) for v in x)
    return x


def targets_to(targets: list[dict[str, Any]], device: torch.device) -> list[dict[str, Any]]:
    """Each target's tensors on ``device``."""
    return [{k: v.to(device) if isinstance(v, Tensor) else v for k, v in t.items()} for t in targets]
