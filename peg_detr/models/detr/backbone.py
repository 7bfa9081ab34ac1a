"""Convolutional backbones for DETR, and the joiner that carries the padding mask.

* ``resnet50`` / ``resnet101`` / ``resnet18``: torchvision ResNets with
  :class:`torchvision.ops.FrozenBatchNorm2d`, the stem and ``layer1`` frozen
  (as in DETR), ``layer4`` optionally dilated instead of strided (DC5), ImageNet
  weights read from a local file (nothing is downloaded).  Output stride 32
  (16 with ``dilation``); keys ``backbone.0.body.{conv1,bn1,layer1..4}.*``.
* ``tiny``: four 3×3 stride-2 convolutions (BatchNorm + ReLU), output stride 16,
  256 channels; fast on CPU at 128-256 px, for the demo and the tests.  With
  kernel 3, padding 1, stride 2 and even input sides, no output cell reads the
  bottom/right border, so for images whose sides are multiples of 16 the
  features of an image padded into a larger batch equal the features of the
  image alone (in eval mode).  The ResNets do not have that property: their
  stride-1 3×3 convolutions let the zero padding leak into the last real row
  and column (DETR behaves the same).
"""

from __future__ import annotations

import os
import warnings
from collections import OrderedDict

import torch
import torch.nn.functional as F
import torchvision
from torch import Tensor, nn
from torchvision.ops import FrozenBatchNorm2d

from peg_core.interop.io import LoadReport, WeightsError, read_state_file, strip_prefixes, unwrap_state_dict

from ...structures import ImageBatch

__all__ = ["BACKBONES", "Joiner", "ResNetBackbone", "TinyBackbone", "build_backbone", "downsample_mask"]

BACKBONES = ("resnet50", "resnet101", "resnet18", "tiny")


class ResNetBackbone(nn.Module):
    """A torchvision ResNet up to ``layer4`` as ``body`` (no pooling, no classifier).

    Args:
        name: ``resnet18`` / ``resnet50`` / ``resnet101``.
        train_backbone: when False every parameter is frozen; when True only
            ``layer2``-``layer4`` train (stem and ``layer1`` stay frozen, DETR).
        dilation: dilate ``layer4`` instead of striding it (DC5, stride 16).
        weights: local ImageNet state-dict file for the torchvision ResNet.

    Shapes: ``(B, 3, H, W)`` -> ``(B, num_channels, ceil(H/s), ceil(W/s))``.
    """

    def __init__(
        self,
        name: str,
        train_backbone: bool = True,
        dilation: bool = False,
        weights: str | os.PathLike | None = None,
    ) -> None:
        super().__init__()
        if dilation and name == "resnet18":
            raise ValueError("dilation (DC5) needs a bottleneck ResNet (resnet50/resnet101), not resnet18")
        resnet = getattr(torchvision.models, name)(
            weights=None, norm_layer=FrozenBatchNorm2d, replace_stride_with_dilation=[False, False, dilation]
        )
        if weights is None:
            warnings.warn(
                f"{name} backbone starts from random weights (no backbone_weights / --backbone-weights "
                "file given); DETR's results assume an ImageNet-initialised backbone",
                stacklevel=4,
            )
        else:
            load_backbone_weights(resnet, weights)
        # Same child names as torchvision's ResNet, so the keys are backbone.0.body.conv1.weight etc.
        self.body = nn.Sequential(
            OrderedDict((n, m) for n, m in resnet.named_children() if n not in ("avgpool", "fc"))
        )
        for pname, p in self.body.named_parameters():
            trainable = train_backbone and pname.split(".")[0] in ("layer2", "layer3", "layer4")
            p.requires_grad_(trainable)
        self.num_channels = 512 if name == "resnet18" else 2048
        self.stride = 16 if dilation else 32

    def forward(self, x: Tensor) -> Tensor:
        return self.body(x)


def load_backbone_weights(resnet: nn.Module, path: str | os.PathLike) -> LoadReport:
    """Load a local torchvision-style ImageNet checkpoint into ``resnet`` (its ``fc`` is ignored).

    The file is read by :func:`peg_core.interop.read_state_file` (``.pth`` with ``weights_only=True``
    or ``.safetensors``); ``{"model": ...}`` / ``{"state_dict": ...}`` wrappers and ``module.``
    prefixes are accepted.  An unreadable file or keys that do not match the ResNet raise a
    :class:`~peg_core.interop.WeightsError` (a ``ValueError``) naming the file.

    Returns the :class:`~peg_core.interop.LoadReport` of every loader: ``copied`` (the ResNet's
    keys), ``skipped`` (the classifier ``fc.*`` and batch-norm counters the frozen norms lack).
    """
    state = strip_prefixes(unwrap_state_dict(read_state_file(path, "backbone weights"), where=path))
    report = LoadReport(source=str(path))
    report.skipped = {
        k: "the ImageNet classifier: not part of the backbone" for k in state if k.startswith("fc.")
    }
    state = {k: v for k, v in state.items() if not k.startswith("fc.")}
    expected = {k for k in resnet.state_dict() if not k.startswith("fc.")}
    missing = sorted(expected - state.keys())
    unexpected = sorted(k for k in state.keys() - expected if not k.endswith("num_batches_tracked"))
    if missing or unexpected:
        raise WeightsError(
            f"backbone weights do not match {type(resnet).__name__}: "
            f"missing {missing[:10]}{'...' if len(missing) > 10 else ''}, "
            f"unexpected {unexpected[:10]}{'...' if len(unexpected) > 10 else ''}",
            path,
        )
    resnet.load_state_dict(state, strict=False)
    report.copied = sorted(expected)
    report.skipped.update(dict.fromkeys(sorted(state.keys() - expected), "no counter in frozen batch norm"))
    return report


class TinyBackbone(nn.Module):
    """Four ``conv3×3/2 -> BatchNorm -> ReLU`` blocks (3→32→64→128→256), output stride 16.

    Shapes: ``(B, 3, H, W)`` -> ``(B, 256, ceil(H/16), ceil(W/16))``.  See the
    module docstring for when padding cannot leak into the real features.
    """

    def __init__(self, train_backbone: bool = True, channels: tuple[int, ...] = (32, 64, 128, 256)) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c_in = 3
        for c in channels:
            layers += [nn.Conv2d(c_in, c, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU()]
            c_in = c
        self.body = nn.Sequential(*layers)
        self.body.requires_grad_(train_backbone)
        self.num_channels = c_in
        self.stride = 2 ** len(channels)

    def forward(self, x: Tensor) -> Tensor:
        return self.body(x)


def downsample_mask(mask: Tensor, size: tuple[int, int]) -> Tensor:
    """Nearest-neighbour resize of a ``(B, H, W)`` bool mask to ``(B, h, w)`` (DETR's rule)."""
    return F.interpolate(mask[:, None].float(), size=size).to(torch.bool)[:, 0]


class Joiner(nn.Sequential):
    """Holds the backbone at index 0 (official key prefix ``backbone.0.``) and carries the mask.

    ``forward(ImageBatch)`` -> ``(features (B, C, h, w), mask (B, h, w))``.
    """

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__(backbone)
        self.num_channels: int = backbone.num_channels
        self.stride: int = backbone.stride

    def forward(self, batch: ImageBatch) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        features = self[0](batch.tensors)
        return features, downsample_mask(batch.mask, tuple(features.shape[-2:]))


def build_backbone(
    name: str,
    train_backbone: bool = True,
    dilation: bool = False,
    weights: str | os.PathLike | None = None,
) -> Joiner:
    """Backbone by name (see :data:`BACKBONES`), wrapped in a :class:`Joiner`."""
    if name == "tiny":
        if dilation:
            raise ValueError("dilation applies to the ResNet backbones only, not 'tiny'")
        if weights is not None:
            raise ValueError("the 'tiny' backbone has no pretrained weights; drop backbone_weights")
        return Joiner(TinyBackbone(train_backbone))
    if name not in BACKBONES:
        raise ValueError(f"unknown backbone {name!r}; choose from {BACKBONES}")
    return Joiner(ResNetBackbone(name, train_backbone, dilation, weights))
