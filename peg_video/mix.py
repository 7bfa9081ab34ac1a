"""Mixup / CutMix on batches of clips, as VideoMAE fine-tunes (timm's ``Mixup`` in batch mode).

:class:`ClipMix` wraps ``torchvision.transforms.v2.MixUp`` / ``CutMix``: with both alphas it
picks one of the two per batch with probability 0.5 (timm's ``switch_prob``), pairs each clip
with the next one in the batch (the loader shuffles), and mixes the whole clip with one ``lam``
(CutMix: one box, the same in every frame).  Label smoothing is applied to the one-hot targets
before they are mixed, as timm's ``mixup_target`` does, so the loss is a plain soft-target
cross entropy.

The draws (``lam``, the box, the choice) come from a generator seeded per step
(:func:`mix_seed`), so a resumed run mixes what the uninterrupted one mixed.
"""

from __future__ import annotations

import random

import torch.nn.functional as F
from torch import Tensor
from torchvision import tv_tensors
from torchvision.transforms import v2

from peg_core.engine import seeded

__all__ = ["ClipMix", "build_clip_mix", "mix_seed", "smooth_one_hot"]


def smooth_one_hot(labels: Tensor, num_classes: int, smoothing: float = 0.0) -> Tensor:
    """Class indices ``(B,)`` -> targets ``(B, K)``: ``1 - s + s/K`` on the label, ``s/K`` elsewhere."""
    off = smoothing / num_classes
    return F.one_hot(labels.long(), num_classes).float() * (1.0 - smoothing) + off


def mix_seed(seed: int, rank: int, step: int) -> int:
    """The seed of the mix at global ``step`` on ``rank``: a function of these three alone.

    Every rank mixes its own batch with its own draw (as each process of timm's Mixup does);
    a string seed goes through SHA-512 in :class:`random.Random`, the same on every platform.
    """
    return random.Random(f"peg-video-mix:{seed}:{rank}:{step}").getrandbits(63)


class ClipMix:
    """Mixup and / or CutMix of a batch of clips ``(B, C, T, H, W)`` with soft targets ``(B, K)``.

    Args:
        num_classes: ``K``.
        mixup_alpha: Beta(alpha, alpha) of Mixup's ``lam``; 0: no Mixup.
        cutmix_alpha: Beta(alpha, alpha) of CutMix's box area; 0: no CutMix.
        label_smoothing: smoothing of the one-hot targets before mixing.
    """

    def __init__(
        self,
        num_classes: int,
        mixup_alpha: float = 0.0,
        cutmix_alpha: float = 0.0,
        label_smoothing: float = 0.0,
    ) -> None:
        if mixup_alpha < 0 or cutmix_alpha < 0:
            raise ValueError(f"alphas must be >= 0; got mixup {mixup_alpha}, cutmix {cutmix_alpha}")
        mixes: list[v2.Transform] = []
        if mixup_alpha > 0:
            mixes.append(v2.MixUp(alpha=mixup_alpha, num_classes=num_classes))
        if cutmix_alpha > 0:
            mixes.append(v2.CutMix(alpha=cutmix_alpha, num_classes=num_classes))
        if not mixes:
            raise ValueError("ClipMix needs mixup_alpha > 0 or cutmix_alpha > 0")
        # two: one of them per batch, each with probability 0.5 (timm's switch_prob default)
        self.transform = mixes[0] if len(mixes) == 1 else v2.RandomChoice(mixes)
        self.num_classes = num_classes
        self.label_smoothing = label_smoothing

    def __call__(self, video: Tensor, labels: Tensor, seed: int) -> tuple[Tensor, Tensor]:
        """Clips ``(B, C, T, H, W)`` and labels ``(B,)`` -> mixed clips (same shape), targets ``(B, K)``.

        Clip ``b`` is mixed with clip ``b - 1`` (the batch rolled by one, torchvision's pairing);
        the rows of the targets sum to 1.
        """
        if video.ndim != 5:
            raise ValueError(f"expected clips (B, C, T, H, W); got shape {tuple(video.shape)}")
        targets = smooth_one_hot(labels, self.num_classes, self.label_smoothing)
        # torchvision's video layout is (..., T, C, H, W); a transposed view, no copy.  The mixes
        # read only the batch dimension and the last two (H, W), so frames and channels mix alike.
        clips = tv_tensors.Video(video.transpose(1, 2))
        # The draws use the global CPU generator: seed it for this call only (torch.manual_seed
        # would reseed the CUDA generators too, and with them dropout / drop path).
        with seeded(seed):
            mixed, targets = self.transform(clips, targets)
        return mixed.as_subclass(Tensor).transpose(1, 2), targets


def build_clip_mix(
    num_classes: int, mixup_alpha: float = 0.0, cutmix_alpha: float = 0.0, label_smoothing: float = 0.0
) -> ClipMix | None:
    """A :class:`ClipMix`, or ``None`` when both alphas are 0 (training unchanged)."""
    if not mixup_alpha and not cutmix_alpha:
        return None
    return ClipMix(num_classes, mixup_alpha, cutmix_alpha, label_smoothing)
