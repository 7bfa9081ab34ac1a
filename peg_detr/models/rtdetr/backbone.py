"""ResNet-vd, RT-DETR's backbone: the "D" stem and average-pool shortcuts, frozen batch norm.

The "D" variant of ResNet (He et al., "Bag of Tricks", 2019) differs from torchvision's ResNet in
two places: the 7×7 stem convolution is three 3×3 convolutions (stride 2, 1, 1; widths
``stem/2, stem/2, stem``) followed by the same 3×3 max pool, and a downsampling block's shortcut
average-pools 2×2 *before* its 1×1 projection (so the shortcut sees every input pixel instead of
one in four).  Bottleneck blocks stride in their 3×3 convolution (``downsample_in_bottleneck``
moves it to the first 1×1, the "B" variant).

Module and parameter names follow transformers' ``RTDetrResNetBackbone``, so the state dict of
:class:`ResNetVd` is HF's ``model.backbone.model.*`` with that prefix removed::

    embedder.embedder.{0,1,2}.{convolution,normalization}.*          the three stem convs
    encoder.stages.{s}.layers.{b}.layer.{i}.{convolution,normalization}.*   block convs
    encoder.stages.{s}.layers.0.shortcut.{convolution,normalization}.*      1×1 projection (stride 1)
    encoder.stages.{s}.layers.0.shortcut.1.{convolution,normalization}.*    avg-pool + 1×1 projection

(``normalization`` holds ``weight``, ``bias``, ``running_mean``, ``running_var``: buffers of
:class:`torchvision.ops.FrozenBatchNorm2d`, eps 1e-5 as HF's ``RTDetrFrozenBatchNorm2d``.)

The first block of every stage has a projection shortcut, even where the channels and the
resolution do not change (stage 0 of R18/R34), as in RT-DETR's PResNet; the other blocks add
their input unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.ops import FrozenBatchNorm2d

__all__ = ["RESNET_VD", "BasicBlockVd", "BottleneckVd", "CeilAvgPool2x2", "ResNetVd", "build_resnet_vd"]

#: ``name -> ResNetVd keyword arguments``: the four RT-DETR backbones and a tiny CPU one.
RESNET_VD: dict[str, dict] = {
    "r18vd": {"depth": 18},
    "r34vd": {"depth": 34},
    "r50vd": {"depth": 50},
    "r101vd": {"depth": 101},
    # Demo / tests: R18's layout at a quarter of the width, one block per stage (~0.2 M parameters).
    "tiny": {"depth": 18, "depths": (1, 1, 1, 1), "widths": (16, 32, 64, 128), "stem_width": 16},
}

_DEPTHS = {18: (2, 2, 2, 2), 34: (3, 4, 6, 3), 50: (3, 4, 6, 3), 101: (3, 4, 23, 3)}
_STRIDES = (4, 8, 16, 32)  # output stride of stage 0..3 (stage 0 does not downsample by default)


def _norm(channels: int, frozen: bool) -> nn.Module:
    return FrozenBatchNorm2d(channels, eps=1e-5) if frozen else nn.BatchNorm2d(channels)


def conv_norm(conv: nn.Conv2d, norm: nn.Module, x: Tensor) -> Tensor:
    """``norm(conv(x))``; a frozen norm is folded into the convolution, recomputed on every call.

    A :class:`~torchvision.ops.FrozenBatchNorm2d` is the per-channel affine map
    ``y * scale + shift``, so ``conv`` with weight ``W * scale`` and bias ``shift`` computes the same
    (to float rounding, ~1e-6 relative) without the two extra passes over the ``(B, C, H, W)``
    activation, and without the one in backward: the backbone's train step is about 10% faster on
    a CPU.  The fold is taken from the live parameters each call, so ``W`` keeps training and the
    state dict keeps ``convolution.weight`` and the norm's buffers unchanged.  A trainable
    ``BatchNorm2d`` runs as usual.
    """
    if not isinstance(norm, FrozenBatchNorm2d):
        return norm(conv(x))
    scale = norm.weight * (norm.running_var + norm.eps).rsqrt()
    shift = norm.bias - norm.running_mean * scale
    weight = conv.weight * scale.view(-1, 1, 1, 1)
    return F.conv2d(x, weight, shift, conv.stride, conv.padding, conv.dilation, conv.groups)


class ConvNormAct(nn.Module):
    """``Conv2d`` (no bias, padding ``k // 2``) -> batch norm -> ReLU (or nothing, ``act=False``).

    Keys ``convolution.weight`` and ``normalization.*`` (HF's ``RTDetrResNetConvLayer``).
    """

    def __init__(
        self,
        cin: int,
        cout: int,
        kernel_size: int = 3,
        stride: int = 1,
        *,
        act: bool = True,
        frozen: bool = True,
    ) -> None:
        super().__init__()
        self.convolution = nn.Conv2d(cin, cout, kernel_size, stride, padding=kernel_size // 2, bias=False)
        self.normalization = _norm(cout, frozen)
        self.activation = nn.ReLU(inplace=True) if act else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        return self.activation(conv_norm(self.convolution, self.normalization, x))


class Projection(nn.Module):
    """The 1×1 projection of a shortcut: ``Conv2d`` (stride 1) + batch norm, no activation."""

    def __init__(self, cin: int, cout: int, *, frozen: bool = True) -> None:
        super().__init__()
        self.convolution = nn.Conv2d(cin, cout, 1, bias=False)
        self.normalization = _norm(cout, frozen)

    def forward(self, x: Tensor) -> Tensor:
        return conv_norm(self.convolution, self.normalization, x)


class CeilAvgPool2x2(nn.Module):
    """``nn.AvgPool2d(2, 2, 0, ceil_mode=True)`` in a form ``torch.export`` keeps dynamic.

    ``(B, C, H, W) -> (B, C, ceil(H/2), ceil(W/2))``; a window that hangs over the bottom / right
    edge averages only its pixels inside the image (``ceil_mode``'s divisor).  ``ceil_mode``'s
    output size carries a rule ("the last window must start inside the input") that becomes a
    symbolic-shape guard the exporter cannot prove for a dynamic height / width, so the export
    falls back to a much slower path.  Here the input gets one zero row and column
    (bottom / right) and an ordinary 2×2 pool runs on it: its output side is
    ``(n - 1) // 2 + 1``, the strided 3×3 convolution's own expression, with no guard.  Dividing by
    the same pool of a ones map (the fraction of each window inside the image: 1, 1/2 or 1/4)
    turns the zero-padded means into ``ceil_mode``'s means; every factor is a power of two, so the
    values are bit-identical to ``nn.AvgPool2d``'s.  Eager calls (nothing is being exported or
    compiled) run the native ``ceil_mode`` kernel instead, which saves the padded copy.
    """

    def forward(self, x: Tensor) -> Tensor:
        if not (torch.compiler.is_exporting() or torch.compiler.is_compiling()):
            # Eager (training, evaluation): the native kernel, with no padded copy of ``x`` (the
            # same values); the guard-free form below is for graphs that keep H and W symbolic.
            return F.avg_pool2d(x, 2, 2, ceil_mode=True)
        return self.guard_free(x)

    @staticmethod
    def guard_free(x: Tensor) -> Tensor:
        """The exported form: a zero row and column, a plain 2×2 pool, divided by the pool of ones."""
        pad = (0, 1, 0, 1)  # left, right, top, bottom
        mean = F.avg_pool2d(F.pad(x, pad), 2, 2)
        inside = F.avg_pool2d(F.pad(torch.ones_like(x[:1, :1]), pad), 2, 2)  # (1, 1, H', W')
        return mean / inside


def _shortcut(cin: int, cout: int, stride: int, project: bool, frozen: bool) -> nn.Module:
    """Identity, a 1×1 projection, or (stride 2, the "D" trick) a 2×2 average pool then the projection.

    The pool has ``ceil_mode``'s size (``ceil(n / 2)``, the strided 3×3 convolution's) and values
    (:class:`CeilAvgPool2x2`).
    """
    if stride == 2:
        return nn.Sequential(
            CeilAvgPool2x2(), Projection(cin, cout, frozen=frozen) if project else nn.Identity()
        )
    if stride != 1:
        raise ValueError(f"ResNet-vd blocks stride 1 or 2; got {stride}")
    return Projection(cin, cout, frozen=frozen) if project else nn.Identity()


class _Residual(nn.Module):
    """``relu(layer(x) + shortcut(x))``; subclasses build ``layer`` (keys ``layer.{i}.*``) and ``shortcut``."""

    layer: nn.Sequential
    shortcut: nn.Module

    def __init__(self, cin: int, cout: int, stride: int, project: bool, frozen: bool) -> None:
        super().__init__()
        self.shortcut = _shortcut(cin, cout, stride, project, frozen)
        self.activation = nn.ReLU(inplace=True)

    def forward(self, x: Tensor) -> Tensor:
        return self.activation(self.layer(x) + self.shortcut(x))


class BasicBlockVd(_Residual):
    """Two 3×3 convolutions (R18/R34), ``(B, cin, H, W) -> (B, cout, H/s, W/s)``."""

    def __init__(self, cin: int, cout: int, stride: int = 1, *, project: bool, frozen: bool = True) -> None:
        super().__init__(cin, cout, stride, project, frozen)
        self.layer = nn.Sequential(
            ConvNormAct(cin, cout, 3, stride, frozen=frozen),
            ConvNormAct(cout, cout, 3, act=False, frozen=frozen),
        )


class BottleneckVd(_Residual):
    """1×1 reduce (to ``cout / 4``), 3×3, 1×1 expand (R50/R101); strides in the 3×3 unless ``downsample_in_bottleneck``."""

    def __init__(self, cin: int, cout: int, stride: int = 1, *, project: bool, frozen: bool = True,
                 downsample_in_bottleneck: bool = False) -> None:  # fmt: skip
        super().__init__(cin, cout, stride, project, frozen)
        mid = cout // 4
        s1, s2 = (stride, 1) if downsample_in_bottleneck else (1, stride)
        self.layer = nn.Sequential(
            ConvNormAct(cin, mid, 1, s1, frozen=frozen),
            ConvNormAct(mid, mid, 3, s2, frozen=frozen),
            ConvNormAct(mid, cout, 1, act=False, frozen=frozen),
        )


class Stem(nn.Module):
    """The "D" stem: 3×3 convs (stride 2, 1, 1) to ``width/2, width/2, width``, then a 3×3 stride-2 max pool.

    ``(B, 3, H, W) -> (B, width, ceil(H/4), ceil(W/4))``; keys ``embedder.{0,1,2}.*`` (HF's embedder).
    """

    def __init__(self, width: int, in_channels: int = 3, *, frozen: bool = True) -> None:
        super().__init__()
        half = width // 2
        self.embedder = nn.Sequential(
            ConvNormAct(in_channels, half, 3, 2, frozen=frozen),
            ConvNormAct(half, half, 3, 1, frozen=frozen),
            ConvNormAct(half, width, 3, 1, frozen=frozen),
        )
        self.pooler = nn.MaxPool2d(3, 2, 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.pooler(self.embedder(x))


class Stage(nn.Module):
    """``depth`` blocks; the first changes width / resolution and has the projection shortcut."""

    def __init__(
        self, block: type[nn.Module], cin: int, cout: int, stride: int, depth: int, **options
    ) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            block(cin, cout, stride, project=True, **options),
            *[block(cout, cout, 1, project=False, **options) for _ in range(depth - 1)],
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)


class _Stages(nn.Module):
    """Holds ``stages`` so the keys read ``encoder.stages.N.*`` as in HF (its ``RTDetrResNetEncoder``)."""

    def __init__(self, stages: list[Stage]) -> None:
        super().__init__()
        self.stages = nn.ModuleList(stages)


class ResNetVd(nn.Module):
    """ResNet-vd (R18/R34/R50/R101, or any widths) returning the stride 8/16/32 maps for RT-DETR.

    Args:
        depth: 18 / 34 (basic blocks) or 50 / 101 (bottlenecks): sets the default block counts,
            widths and ``layer_type``.
        depths: blocks per stage (default: the depth's ``(2,2,2,2)`` / ``(3,4,6,3)`` / ``(3,4,23,3)``).
        widths: output channels of the four stages (default ``(64,128,256,512)`` basic,
            ``(256,512,1024,2048)`` bottleneck; HF ``hidden_sizes``).
        stem_width: stem output channels (default 64; HF ``embedding_size``).
        layer_type: ``"basic"`` or ``"bottleneck"`` (default by ``depth``).
        out_strides: which stage outputs to return, a subset of ``(4, 8, 16, 32)``, increasing.
        freeze_bn: :class:`torchvision.ops.FrozenBatchNorm2d` (RT-DETR, HF
            ``freeze_backbone_batch_norms``) instead of trainable ``nn.BatchNorm2d``.
        freeze_at: ``-1`` trains every convolution; ``0`` freezes the stem; ``k >= 1`` the stem
            and the first ``k`` stages (RT-DETR's PResNet ``freeze_at``).
        downsample_in_first_stage, downsample_in_bottleneck: HF's ``RTDetrResNetConfig`` options
            (stage 0 strides 2; bottlenecks stride in the first 1×1 instead of the 3×3).

    Shapes: ``(B, 3, H, W) -> [(B, C_i, ceil(H/s_i), ceil(W/s_i))]`` for ``s_i`` in ``out_strides``
    (exactly ``H/s_i`` when ``s_i`` divides ``H``); :attr:`out_channels` lists ``C_i``.  The
    resolved layout is kept as attributes (``layer_type``, ``depths``, ``widths``, ``stem_width``,
    ``out_strides``, ``freeze_bn``, ``downsample_in_*``).
    """

    def __init__(
        self,
        depth: int = 50,
        *,
        depths: Sequence[int] | None = None,
        widths: Sequence[int] | None = None,
        stem_width: int | None = None,
        layer_type: str | None = None,
        out_strides: Sequence[int] = (8, 16, 32),
        freeze_bn: bool = True,
        freeze_at: int = -1,
        in_channels: int = 3,
        downsample_in_first_stage: bool = False,
        downsample_in_bottleneck: bool = False,
    ) -> None:
        super().__init__()
        if depth not in _DEPTHS:
            raise ValueError(f"ResNet-vd depth must be one of {sorted(_DEPTHS)}; got {depth}")
        layer_type = layer_type or ("basic" if depth < 50 else "bottleneck")
        if layer_type not in ("basic", "bottleneck"):
            raise ValueError(f"layer_type must be 'basic' or 'bottleneck'; got {layer_type!r}")
        depths = tuple(depths or _DEPTHS[depth])
        basic = layer_type == "basic"
        widths = tuple(widths or ((64, 128, 256, 512) if basic else (256, 512, 1024, 2048)))
        stem_width = stem_width or 64
        if len(depths) != 4 or len(widths) != 4 or min(depths) < 1:
            raise ValueError(f"need 4 stages of >= 1 block; got depths={depths}, widths={widths}")
        strides = tuple(s * (2 if downsample_in_first_stage else 1) for s in _STRIDES)
        out_strides = tuple(out_strides)
        if (
            not out_strides
            or any(s not in strides for s in out_strides)
            or list(out_strides) != sorted(out_strides)
        ):
            raise ValueError(f"out_strides must be increasing values of {strides}; got {out_strides}")
        self.embedder = Stem(stem_width, in_channels, frozen=freeze_bn)
        block = BasicBlockVd if basic else BottleneckVd
        options = {"frozen": freeze_bn}
        if not basic:
            options["downsample_in_bottleneck"] = downsample_in_bottleneck
        cins = (stem_width, *widths[:-1])
        first = 2 if downsample_in_first_stage else 1
        self.encoder = _Stages(
            [Stage(block, cin, cout, first if i == 0 else 2, d, **options)
             for i, (cin, cout, d) in enumerate(zip(cins, widths, depths))]
        )  # fmt: skip
        self._out_idx = tuple(strides.index(s) for s in out_strides)
        self.out_strides = list(out_strides)
        self.out_channels = [widths[i] for i in self._out_idx]
        # The resolved layout (what an HF config.json records; see peg_detr.interop.hf_rtdetr.encoder_hf_config).
        self.layer_type = layer_type
        self.depths, self.widths, self.stem_width = list(depths), list(widths), stem_width
        self.freeze_bn = freeze_bn
        self.downsample_in_first_stage = downsample_in_first_stage
        self.downsample_in_bottleneck = downsample_in_bottleneck
        self._init_weights()
        self._freeze(freeze_at)

    def _init_weights(self) -> None:
        # He init for ReLU networks (HF's and torchvision's choice); frozen norms start as identity.
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def _freeze(self, freeze_at: int) -> None:
        if not -1 <= freeze_at <= 4:
            raise ValueError(f"freeze_at must be -1 (nothing), 0 (stem) .. 4 (all stages); got {freeze_at}")
        frozen = [] if freeze_at < 0 else [self.embedder, *self.encoder.stages[:freeze_at]]
        for module in frozen:
            module.requires_grad_(False)

    def forward(self, x: Tensor) -> list[Tensor]:
        x = self.embedder(x)
        outs = []
        for i, stage in enumerate(self.encoder.stages):
            x = stage(x)
            if i in self._out_idx:
                outs.append(x)
            if i == self._out_idx[-1]:
                break  # later stages are not needed (and not run)
        return outs


def build_resnet_vd(name: str = "r50vd", **options) -> ResNetVd:
    """A :class:`ResNetVd` by name (:data:`RESNET_VD`: ``r18vd``, ``r34vd``, ``r50vd``, ``r101vd``, ``tiny``).

    ``options`` override the preset's keywords (e.g. ``freeze_bn=False``, ``freeze_at=0``).
    """
    if name not in RESNET_VD:
        raise ValueError(f"unknown ResNet-vd backbone {name!r}; choose from {sorted(RESNET_VD)}")
    return ResNetVd(**{**RESNET_VD[name], **options})
