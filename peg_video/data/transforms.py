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

The training crop is the short-side jitter + random crop by default (``train_crop="jitter"``);
``"rrc"`` is VideoMAE's Inception-style random-resized crop instead (v2's ``RandomResizedCrop``,
one box for the whole clip, :class:`ClipResizedCrop`), seeded the same way.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch
from torchvision import tv_tensors
from torchvision.transforms import v2

from peg_core.engine import seeded

from ..compat import ensure_pytorchvideo_compat

ensure_pytorchvideo_compat()
from pytorchvideo.transforms.functional import short_side_scale, uniform_crop  # noqa: E402

__all__ = [
    "KINETICS_MEAN",
    "KINETICS_STD",
    "RAND_AUGMENT_LEVELS",
    "RRC_RATIO",
    "RRC_SCALE",
    "TRAIN_CROPS",
    "ClipAugment",
    "ClipResizedCrop",
    "ClipTransformConfig",
    "EvalClipTransform",
    "TrainClipTransform",
    "check_rrc_range",
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
#: training crops: short-side jitter + random crop, or VideoMAE's random-resized crop
TRAIN_CROPS = ("jitter", "rrc")
#: VideoMAE's random-resized crop (its kinetics / ssv2 datasets' ``spatial_sampling`` arguments):
#: the box covers 8 % .. 100 % of the frame, width / height 3/4 .. 4/3 (written 0.75, 1.3333 there)
RRC_SCALE = (0.08, 1.0)
RRC_RATIO = (0.75, 1.3333)


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


def check_rrc_range(bounds: tuple[float, float], what: str) -> tuple[float, float]:
    """``bounds`` as a ``(lo, hi)`` float pair of the random-resized crop's ``what``, checked.

    ``what`` is ``"scale"`` (area fractions, ``0 < lo <= hi <= 1``) or ``"ratio"`` (width / height,
    ``0 < lo <= hi``, finite).
    """
    lo, hi = (float(b) for b in bounds)
    top = 1.0 if what == "scale" else math.inf
    if not (0.0 < lo <= hi <= top and math.isfinite(hi)):
        rule = "area fractions 0 < LO <= HI <= 1" if what == "scale" else "aspect ratios 0 < LO <= HI"
        raise ValueError(f"expected {rule}, got {lo:g},{hi:g}")
    return lo, hi


@dataclass(frozen=True)
class ClipTransformConfig:
    """Spatial recipe.  Training: random short side in ``train_scale``, random ``crop``
    (and a horizontal flip when ``hflip``; off by default because it swaps left/right motion
    classes).  Testing: short side ``test_scale``, ``num_crops`` (1 or 3) crops of ``crop``.

    ``train_crop="rrc"``: the training clip is instead a random-resized crop to ``crop`` (box area
    ``rrc_scale`` of the frame, aspect ``rrc_ratio``; VideoMAE's), then the flip; ``train_scale``'s
    top is then only the short side large videos are decoded at.

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
    train_crop: str = "jitter"
    rrc_scale: tuple[float, float] = RRC_SCALE
    rrc_ratio: tuple[float, float] = RRC_RATIO

    def __post_init__(self) -> None:
        if self.train_crop not in TRAIN_CROPS:
            raise ValueError(f"train_crop must be one of {', '.join(TRAIN_CROPS)}, got {self.train_crop!r}")
        for what in ("scale", "ratio"):
            try:
                check_rrc_range(getattr(self, f"rrc_{what}"), what)
            except ValueError as e:
                raise ValueError(f"rrc_{what}: {e}") from None
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
        so a model can be evaluated with a larger crop than it was trained with); the random-resized
        crop resizes its box to ``crop`` whatever the frame size."""
        if self.train_crop == "jitter" and self.train_scale[0] < self.crop:
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
        """``(C, T, H, W)`` float clip -> the augmented clip (same dtype); draws seeded by ``seed``."""
        video = clip.transpose(0, 1)
        if self.uint8:
            video = video.mul(255.0).round_().clamp_(0, 255).to(torch.uint8)
        with seeded(seed):
            out = self.transform(tv_tensors.Video(video)).as_subclass(torch.Tensor)
        if self.uint8:
            out = out.float().div_(255.0)
        return out.transpose(0, 1)


class ClipResizedCrop(ClipAugment):
    """v2's ``RandomResizedCrop`` of a ``(C, T, H, W)`` clip: one box for all frames, resized to ``size``.

    Bilinear with antialiasing (a box of the whole frame is downscaled, as ``short_side_scale``).
    """

    def __init__(self, size: int, scale: tuple[float, float] = RRC_SCALE,
                 ratio: tuple[float, float] = RRC_RATIO) -> None:  # fmt: skip
        crop = v2.RandomResizedCrop(
            size, check_rrc_range(scale, "scale"), check_rrc_range(ratio, "ratio"), antialias=True
        )
        super().__init__(crop)

    def box(self, clip: torch.Tensor, seed: int) -> tuple[int, int, int, int]:
        """``(top, left, height, width)`` of the box that ``self(clip, seed)`` crops from each frame."""
        with seeded(seed):
            params = self.transform.make_params([tv_tensors.Video(clip.transpose(0, 1))])
        return params["top"], params["left"], params["height"], params["width"]


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

    Order: scale jitter and crop (or the random-resized crop), flip, RandAugment (uint8 values),
    normalisation, random erasing.
    """

    def __init__(self, cfg: ClipTransformConfig) -> None:
        cfg.check_train()
        self.cfg = cfg
        rrc = cfg.train_crop == "rrc"
        self.resized_crop = ClipResizedCrop(cfg.crop, cfg.rrc_scale, cfg.rrc_ratio) if rrc else None
        self.rand_augment = clip_rand_augment(cfg.rand_augment, cfg.mean) if cfg.rand_augment else None
        self.erasing = clip_random_erasing(cfg.random_erasing) if cfg.random_erasing > 0 else None

    def __call__(self, clip: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        cfg = self.cfg
        if self.resized_crop is not None:
            clip = self.resized_crop(clip, _draw_seed(generator))
        else:
            clip = self._jitter_crop(clip, generator)
        if cfg.hflip and bool(torch.rand((), generator=generator) < 0.5):
            clip = clip.flip(-1)
        # the augmentations draw from `generator` only when on: without them a clip is as before
        if self.rand_augment is not None:
            clip = self.rand_augment(clip, _draw_seed(generator))
        clip = normalize_clip(clip, cfg.mean, cfg.std)
        if self.erasing is not None:
            clip = self.erasing(clip, _draw_seed(generator))
        return clip

    def _jitter_crop(self, clip: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """A random short side in ``train_scale``, then a random ``crop x crop`` window."""
        crop = self.cfg.crop
        lo, hi = self.cfg.train_scale
        size = int(torch.randint(lo, hi + 1, (1,), generator=generator))
        clip = short_side_scale(clip, size)
        h, w = clip.shape[-2:]
        top = int(torch.randint(0, h - crop + 1, (1,), generator=generator))
        left = int(torch.randint(0, w - crop + 1, (1,), generator=generator))
        return clip[..., top : top + crop, left : left + crop]


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
