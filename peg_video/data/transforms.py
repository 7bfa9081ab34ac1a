"""Clip transforms built on pytorchvideo's functional ops.

Chosen over torchvision.transforms.v2: pytorchvideo's ``short_side_scale`` / ``uniform_crop``
are the reference Kinetics recipe (SlowFast, X3D) and work directly on ``(C, T, H, W)``
tensors, which is also what pytorchvideo's own data path yields, so both data back-ends share
these transforms.  Randomness comes from an explicit ``torch.Generator`` (seeded per video and
epoch by the dataset), so a clip is the same whatever worker loads it: runs resume exactly.

Normalisation uses the Kinetics mean/std of pytorchvideo's model zoo (0.45, 0.225).

VideoMAE's fine-tuning augmentations are opt-in (:class:`ClipTransformConfig` ``rand_augment`` /
``random_erasing``, both off by default) and come from ``torchvision.transforms.v2``: a v2
transform on a ``tv_tensors.Video`` ``(T, C, H, W)`` draws its parameters once and applies them
to every frame, so a clip is augmented as one.  Their draws use the global CPU generator, seeded
for the call from the clip's ``torch.Generator`` (:class:`ClipAugment`), so they too are functions
of (seed, epoch, index).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torchvision import tv_tensors
from torchvision.transforms import v2

from ..compat import ensure_pytorchvideo_compat

ensure_pytorchvideo_compat()
from pytorchvideo.transforms.functional import short_side_scale, uniform_crop  # noqa: E402

__all__ = [
    "KINETICS_MEAN",
    "KINETICS_STD",
    "RAND_AUGMENT_LEVELS",
    "ClipAugment",
    "ClipTransformConfig",
    "EvalClipTransform",
    "TrainClipTransform",
    "clip_rand_augment",
    "clip_random_erasing",
    "frames_to_clip",
    "normalize_clip",
    "parse_rand_augment",
]

KINETICS_MEAN = (0.45, 0.45, 0.45)
KINETICS_STD = (0.225, 0.225, 0.225)
#: RandAugment magnitudes count in tenths of each op's largest change, as timm's ``m`` (0 .. 10)
RAND_AUGMENT_LEVELS = 10
_RAND_AUGMENT = re.compile(r"m(\d+)-n(\d+)")


def parse_rand_augment(spec: str) -> tuple[int, int]:
    """``"mM-nN"`` (timm's spelling, e.g. ``"m7-n4"``) -> ``(num_ops N, magnitude M)``.

    ``N`` >= 1 ops per clip, magnitude ``M`` in 0 .. :data:`RAND_AUGMENT_LEVELS`.
    """
    match = _RAND_AUGMENT.fullmatch(str(spec).strip().lower())
    if match is None:
        raise ValueError(f"expected mM-nN (magnitude M, N ops; e.g. m7-n4) or off, got {spec!r}")
    magnitude, num_ops = int(match[1]), int(match[2])
    if num_ops < 1 or magnitude > RAND_AUGMENT_LEVELS:
        raise ValueError(f"expected N >= 1 ops and a magnitude M in 0..{RAND_AUGMENT_LEVELS}, got {spec!r}")
    return num_ops, magnitude


@dataclass(frozen=True)
class ClipTransformConfig:
    """Spatial recipe.  Training: random short side in ``train_scale``, random ``crop``
    (and a horizontal flip when ``hflip``; off by default because it swaps left/right motion
    classes).  Testing: short side ``test_scale``, ``num_crops`` (1 or 3) crops of ``crop``.

    Training only, off by default: ``rand_augment`` ``"mM-nN"`` (:func:`parse_rand_augment`) on
    the cropped clip, before normalisation; ``random_erasing``: the probability of one erased box
    of normal noise, after normalisation.
    """

    crop: int = 224
    train_scale: tuple[int, int] = (256, 320)
    test_scale: int = 256
    num_crops: int = 1
    hflip: bool = False
    mean: tuple[float, float, float] = KINETICS_MEAN
    std: tuple[float, float, float] = KINETICS_STD
    rand_augment: str | None = None
    random_erasing: float = 0.0

    def __post_init__(self) -> None:
        if self.rand_augment is not None:
            parse_rand_augment(self.rand_augment)
        if not 0.0 <= self.random_erasing <= 1.0:
            raise ValueError(f"random_erasing must be a probability in [0, 1], got {self.random_erasing}")
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


class ClipAugment:
    """A ``torchvision.transforms.v2`` transform applied to a ``(C, T, H, W)`` clip as one video.

    The clip is handed over as a ``tv_tensors.Video`` ``(T, C, H, W)`` (a transposed view), so
    every draw of the transform (op, magnitude, sign, box) holds for all frames.  With ``uint8``
    the float clip in [0, 1] is rounded to bytes around the call: the dtype RandAugment's
    thresholds (posterize, solarize) are defined on, as in VideoMAE's PIL frames.
    """

    def __init__(self, transform: v2.Transform, uint8: bool = False) -> None:
        self.transform = transform
        self.uint8 = uint8

    def __call__(self, clip: torch.Tensor, seed: int) -> torch.Tensor:
        """``(C, T, H, W)`` float clip -> the augmented clip (same shape, dtype); draws seeded by ``seed``."""
        video = clip.transpose(0, 1)
        if self.uint8:
            video = video.mul(255.0).round_().clamp_(0, 255).to(torch.uint8)
        # seed the global CPU generator (the one v2 draws from) for this call only
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(seed)
            out = self.transform(tv_tensors.Video(video)).as_subclass(torch.Tensor)
        if self.uint8:
            out = out.float().div_(255.0)
        return out.transpose(0, 1)


def clip_rand_augment(spec: str, mean: tuple[float, ...]) -> ClipAugment:
    """RandAugment ``"mM-nN"``: ``N`` ops of v2's space, each at ``M / 10`` of its largest change.

    ``num_magnitude_bins = 11`` puts torchvision's bin ``M`` at ``M / 10`` of each op's range,
    timm's magnitude scale; geometric ops fill the uncovered border with ``mean`` (it normalises
    to 0), bilinear as the clip resize.
    """
    num_ops, magnitude = parse_rand_augment(spec)
    transform = v2.RandAugment(
        num_ops,
        magnitude,
        num_magnitude_bins=RAND_AUGMENT_LEVELS + 1,
        interpolation=v2.InterpolationMode.BILINEAR,
        fill=[round(255 * m) for m in mean],
    )
    return ClipAugment(transform, uint8=True)


def clip_random_erasing(p: float) -> ClipAugment:
    """With probability ``p`` one box of normal noise (timm's mode ``pixel``), the same in every frame.

    v2's default box (area 2 % .. 33 % of the frame, aspect 0.3 .. 3.3) is timm's.
    """
    return ClipAugment(v2.RandomErasing(p, value="random"))


def _draw_seed(generator: torch.Generator) -> int:
    return int(torch.randint(2**62, (1,), generator=generator))


class TrainClipTransform:
    """``(C, T, H, W)`` float clip -> ``(C, T, crop, crop)`` augmented, normalised clip.

    Order: scale jitter, crop, flip, RandAugment (uint8 values), normalisation, random erasing.
    """

    def __init__(self, cfg: ClipTransformConfig) -> None:
        cfg.check_train()
        self.cfg = cfg
        self.rand_augment = clip_rand_augment(cfg.rand_augment, cfg.mean) if cfg.rand_augment else None
        self.erasing = clip_random_erasing(cfg.random_erasing) if cfg.random_erasing > 0 else None

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
        # the augmentations draw from `generator` only when on: without them a clip is as before
        if self.rand_augment is not None:
            clip = self.rand_augment(clip, _draw_seed(generator))
        clip = normalize_clip(clip, cfg.mean, cfg.std)
        if self.erasing is not None:
            clip = self.erasing(clip, _draw_seed(generator))
        return clip


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
