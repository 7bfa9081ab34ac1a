"""Deployment-time fusion of RT-DETR: every conv + batch norm folded, every RepVGG block one 3×3 conv.

RT-DETR trains its CCFM blocks in RepVGG's two-branch form, ``act(BN(conv3x3(x)) + BN(conv1x1(x)))``
(:class:`~peg_detr.models.rtdetr.encoder.RepVggBlock`), and every other convolution of the
backbone, the encoder and the decoder's input projections is followed by a (frozen) batch norm.
In eval mode a batch norm is an affine map per channel, so it folds into the convolution before it:

    BN(conv(x)) = conv'(x),  W' = W · γ / sqrt(σ² + ε),  b' = (b − μ) · γ / sqrt(σ² + ε) + β

and a 1×1 kernel is a 3×3 kernel that is zero outside its centre (same stride, padding 1 instead
of 0), so the two folded branches of a RepVGG block add up to one 3×3 convolution.

:func:`fuse_for_deploy` replaces those submodules by :class:`FusedConv` (``act(conv(x))``, the
convolution with a bias).  The result is inference-only: the folded weights stand for the running
statistics, which no longer exist, so :class:`FusedConv` refuses ``train()`` and holds its weights
with ``requires_grad=False``.  The fused model's state dict has other keys than the checkpoint's
(``...conv.weight``, ``...conv.bias`` where ``convolution`` / ``normalization`` were): keep the
unfused checkpoint, fuse at export time.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import skip_init
from torch.nn.utils.fusion import fuse_conv_bn_weights
from torchvision.ops import FrozenBatchNorm2d

from .backbone import ConvNormAct, Projection
from .encoder import ConvNormLayer, RepVggBlock
from .model import RTDETR

__all__ = ["FusedConv", "FusionStats", "fold_conv_bn", "fuse_for_deploy", "fusion_stats", "merge_repvgg"]

_Norm = nn.BatchNorm2d | FrozenBatchNorm2d


class FusedConv(nn.Module):
    """``activation(conv(x))``: ``branches`` conv + BN pairs folded into one biased ``conv`` (eval only).

    ``branches`` is 1 for a folded conv + BN, 2 for a merged RepVGG block.  Shapes are those of
    ``conv``: ``(B, C_in, H, W) -> (B, C_out, H', W')``.  ``train(True)`` raises ``RuntimeError``;
    raised from a parent's ``train()``, the modules visited before it are left in training mode,
    so the message says to call ``.eval()``.
    """

    def __init__(self, conv: nn.Conv2d, activation: nn.Module | None = None, *, branches: int = 1) -> None:
        super().__init__()
        if conv.bias is None:
            raise ValueError("a fused convolution carries the folded batch norm as its bias; got bias=None")
        self.conv = conv
        self.activation = activation if activation is not None else nn.Identity()
        self.branches = branches
        self.requires_grad_(False)
        super().train(False)

    def train(self, mode: bool = True) -> FusedConv:
        if mode:
            raise RuntimeError(
                "this RT-DETR was fused for deployment (fuse_for_deploy) and is inference-only: its batch "
                "norms are folded into the convolutions; train the unfused model and fuse it again "
                "(call .eval() to keep using this one)"
            )
        return super().train(False)

    def forward(self, x: Tensor) -> Tensor:
        return self.activation(self.conv(x))

    def extra_repr(self) -> str:
        return f"branches={self.branches}"


def fold_conv_bn(conv: nn.Conv2d, norm: _Norm) -> nn.Conv2d:
    """A new ``Conv2d`` with a bias computing ``norm(conv(x))`` of eval mode (running statistics).

    The fold runs in float64 and is cast back to ``conv``'s dtype, so it adds one rounding only.
    ``norm`` is an ``nn.BatchNorm2d`` (with running statistics) or a ``FrozenBatchNorm2d``.
    """
    if not isinstance(norm, _Norm):
        raise TypeError(
            f"expected BatchNorm2d or FrozenBatchNorm2d after the convolution; got {type(norm).__name__}"
        )
    if norm.running_mean is None or norm.running_var is None:
        raise ValueError("cannot fold a BatchNorm2d without running statistics (track_running_stats=False)")
    if norm.running_mean.shape[0] != conv.out_channels:
        raise ValueError(
            f"the batch norm has {norm.running_mean.shape[0]} channels, the conv {conv.out_channels}"
        )

    def f64(t: Tensor | None) -> Tensor | None:
        return None if t is None else t.detach().double()

    weight, bias = fuse_conv_bn_weights(
        f64(conv.weight), f64(conv.bias), f64(norm.running_mean), f64(norm.running_var), norm.eps,
        f64(norm.weight), f64(norm.bias),
    )  # fmt: skip
    return _conv_like(conv, weight, bias)


def merge_repvgg(block: RepVggBlock) -> FusedConv:
    """One 3×3 :class:`FusedConv` equal to ``block`` in eval mode: ``act(BN(conv3x3 x) + BN(conv1x1 x))``."""
    big = fold_conv_bn(block.conv1.conv, block.conv1.norm)
    small = fold_conv_bn(block.conv2.conv, block.conv2.norm)
    if (big.kernel_size, big.padding, small.kernel_size, small.padding) != ((3, 3), (1, 1), (1, 1), (0, 0)):
        raise ValueError(
            f"a RepVGG block needs a 3x3 (padding 1) and a 1x1 (padding 0) branch; got "
            f"{big.kernel_size}/{big.padding} and {small.kernel_size}/{small.padding}"
        )
    if (big.stride, big.groups, big.dilation) != (small.stride, small.groups, small.dilation):
        raise ValueError("the RepVGG branches differ in stride, groups or dilation")
    # The 1x1 kernel is the centre tap of a 3x3 one (same output grid: padding 1 vs 0).
    weight = big.weight.double() + F.pad(small.weight.double(), (1, 1, 1, 1))
    bias = big.bias.double() + small.bias.double()
    return FusedConv(_conv_like(big, weight, bias), block.activation, branches=2)


def _conv_like(conv: nn.Conv2d, weight: Tensor, bias: Tensor) -> nn.Conv2d:
    """A biased copy of ``conv``'s geometry holding ``weight``, ``bias`` (cast to ``conv``'s dtype and device)."""
    # skip_init: no random initialisation of weights that are overwritten at once
    out = skip_init(
        nn.Conv2d, conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride, conv.padding,
        conv.dilation, conv.groups, bias=True, padding_mode=conv.padding_mode, device=conv.weight.device,
        dtype=conv.weight.dtype,
    )  # fmt: skip
    with torch.no_grad():
        out.weight.copy_(weight)
        out.bias.copy_(bias)
    return out


def _fused(module: nn.Module) -> FusedConv | None:
    """The :class:`FusedConv` replacing ``module``, or None when it is not a conv + BN unit."""
    if isinstance(module, RepVggBlock):
        return merge_repvgg(module)
    if isinstance(module, ConvNormLayer):
        return FusedConv(fold_conv_bn(module.conv, module.norm), module.activation)
    if isinstance(module, ConvNormAct):
        return FusedConv(fold_conv_bn(module.convolution, module.normalization), module.activation)
    if isinstance(module, Projection):
        return FusedConv(fold_conv_bn(module.convolution, module.normalization))
    # The encoder's and the decoder's input projections: Sequential(Conv2d, BatchNorm2d).
    if (
        isinstance(module, nn.Sequential)
        and len(module) == 2
        and isinstance(module[0], nn.Conv2d)
        and isinstance(module[1], _Norm)
    ):
        return FusedConv(fold_conv_bn(module[0], module[1]))
    return None


def _replace_in(parent: nn.Module) -> None:
    """Replace every conv + BN unit below ``parent`` (depth first) by its :class:`FusedConv`."""
    for name, child in list(parent.named_children()):
        fused = _fused(child)
        if fused is None:
            _replace_in(child)
        else:
            setattr(parent, name, fused)  # Sequential / ModuleList children are set by their index name


def fuse_for_deploy(model: RTDETR, *, inplace: bool = False) -> RTDETR:
    """An inference-only RT-DETR with every conv + batch norm folded and every RepVGG block merged.

    Folds, in the backbone (ResNet-vd: stem, block and shortcut convs, frozen or trainable BN), the
    encoder (input projections, CCFM convs, CSP layers) and the decoder's input projections, each
    conv + BN pair into one biased convolution, and each RepVGG block's 3×3 and 1×1 branches into
    one 3×3 convolution (:class:`FusedConv`).  Eval-mode outputs equal the unfused model's up to
    float rounding (~1e-6 in float32).

    Args:
        model: a built :class:`~peg_detr.models.rtdetr.RTDETR`; set to eval mode (the fold uses the
            running statistics, i.e. the eval-mode function).
        inplace: modify ``model`` itself; by default a deep copy is fused and ``model`` is untouched.

    Returns:
        The fused model in eval mode.  It is inference-only: ``train()`` raises ``RuntimeError``
        and the fused weights do not require gradients.  :func:`fusion_stats` counts what was fused.
    """
    if not isinstance(model, RTDETR):
        raise TypeError(
            f"fuse_for_deploy takes an RT-DETR model (peg_detr.models.rtdetr.RTDETR); got {type(model).__name__}"
        )
    fused = model if inplace else copy.deepcopy(model)
    fused.eval()
    _replace_in(fused)
    return fused


@dataclass(frozen=True)
class FusionStats:
    """What :func:`fuse_for_deploy` folded: ``convs`` fused convolutions made from ``conv_bn_pairs``
    conv + BN pairs, ``repvgg_blocks`` of them RepVGG blocks (two pairs each)."""

    convs: int
    conv_bn_pairs: int
    repvgg_blocks: int

    def as_dict(self) -> dict[str, int]:
        return {"convs": self.convs, "conv_bn_pairs": self.conv_bn_pairs, "repvgg_blocks": self.repvgg_blocks}


def fusion_stats(model: nn.Module) -> FusionStats:
    """Counts of the :class:`FusedConv` modules of a fused model (all zero for an unfused one)."""
    fused = [m for m in model.modules() if isinstance(m, FusedConv)]
    return FusionStats(
        convs=len(fused),
        conv_bn_pairs=sum(m.branches for m in fused),
        repvgg_blocks=sum(m.branches == 2 for m in fused),
    )
