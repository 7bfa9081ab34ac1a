"""Clip transforms built on pytorchvideo's functional ops.

Chosen over torchvision.transforms.v2: pytorchvideo's ``short_side_scale`` / ``uniform_crop``
are the reference Kinetics recipe (SlowFast, X3D) and work directly on ``(C, T, H, W)``
tensors, which is also what pytorchvideo's own data path yields, so both data back-ends share
these transforms.  Randomness comes from an explicit ``torch.Generator`` (seeded per video and
epoch by the dataset), so a clip is the same whatever worker loads it: runs resume exactly.

Normalisation uses the Kinetics mean/std of pytorchvideo's model zoo (0.45, 0.225).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..compat import ensure_pytorchvideo_compat

ensure_pytorchvideo_compat()
from pytorchvideo.transforms.functional import short_side_scale, uniform_crop  # noqa: E402

__all__ = [
    "KINETICS_MEAN",
    "KINETICS_STD",
    "ClipTransformConfig",
    "EvalClipTransform",
    "TrainClipTransform",
    "frames_to_clip",
    "normalize_clip",
]

KINETICS_MEAN = (0.45, 0.45, 0.45)
KINETICS_STD = (0.225, 0.225, 0.225)


@dataclass(frozen=True)
class ClipTransformConfig:
    """Spatial recipe.  Training: random short side in ``train_scale``, random ``crop``
    (and a horizontal flip when ``hflip``; off by default because it swaps left/right motion
    classes).  Testing: short side ``test_scale``, ``num_crops`` (1 or 3) crops of ``crop``."""

    crop: int = 224
    train_scale: tuple[int, int] = (256, 320)
    test_scale: int = 256
    num_crops: int = 1
    hflip: bool = False
    mean: tuple[float, float, float] = KINETICS_MEAN
    std: tuple[float, float, float] = KINETICS_STD

    def __post_init__(self) -> None:
        if self.num_crops not in (1, 3):
            raise ValueError(f"num_crops must be 1 (centre) or 3 (left/centre/right), got {self.num_crops}")
        if self.train_scale[0] > self.train_scale[1] or self.test_scale < self.crop:
            raise ValueError(
                f"train_scale {self.train_scale} must be ordered and test_scale {self.test_scale} >= crop {self.crop}"
            )

    def check_train(self) -> None:
        """The training crop must fit the smallest training scale (checked only where training uses it,
        so a model can be evaluated with a larger crop than it was trained with)."""
        if self.train_scale[0] < self.crop:
            raise ValueError(f"train_scale {self.train_scale} must be >= crop {self.crop} for training")


def frames_to_clip(frames: torch.Tensor) -> torch.Tensor:
    """Decoded ``(T, H, W, C)`` uint8 frames -> ``(C, T, H, W)`` float32 in [0, 1]."""
    return frames.permute(3, 0, 1, 2).float().div_(255.0)


def normalize_clip(clip: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    """Per-channel ``(x - mean) / std`` of a ``(C, T, H, W)`` clip."""
    m = torch.tensor(mean, dtype=clip.dtype).view(-1, 1, 1, 1)
    s = torch.tensor(std, dtype=clip.dtype).view(-1, 1, 1, 1)
    return (clip - m) / s


class TrainClipTransform:
    """``(C, T, H, W)`` float clip -> ``(C, T, crop, crop)`` augmented, normalised clip."""

    def __init__(self, cfg: ClipTransformConfig) -> None:
        cfg.check_train()
        self.cfg = cfg

    def __call__(self, clip: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        cfg = self.cfg
        lo, hi = cfg.train_scale
        size = int(torch.randint(lo, hi + 1, (1,), generator=generator))
        clip = short_side_scale(clip, size)
        h, w = clip.shape[-2:]
        top = int(torch.randint(0, h - cfg.crop + 1, (1,), generator=generator))
        left = int(torch.randint(0, w - cfg.crop + 1, (1,), generator=generator))
        clip = clip[..., top : top + cfg.crop, left : left + cfg.crop]
        if cfg.hflip and bool(torch.rand((), generator=generator) < 0.5):
            clip = clip.flip(-1)
        return normalize_clip(clip, cfg.mean, cfg.std)


class EvalClipTransform:
    """``(C, T, H, W)`` float clip -> ``(num_crops, C, T, crop, crop)``: left/centre/right crops
    along the long side (top/centre/bottom for portrait videos), or the centre crop alone."""

    def __init__(self, cfg: ClipTransformConfig) -> None:
        self.cfg = cfg

    def __call__(self, clip: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        clip = normalize_clip(short_side_scale(clip, cfg.test_scale), cfg.mean, cfg.std)
        positions = (1,) if cfg.num_crops == 1 else (0, 1, 2)
        return torch.stack([uniform_crop(clip, cfg.crop, i) for i in positions])
