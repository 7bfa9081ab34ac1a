"""DEIMv2's encoders: the hybrid encoder with sum fusion and RepNCSPELAN5 blocks, and the lite encoder.

Hybrid encoder (S-X with DINOv3; N with HGNetv2)::

    input_proj      1x1 conv + BN per backbone map (HGNetv2 N only; the DINOv3 backbone projects itself)
    aifi            transformer layer(s) on the coarsest map, position encoding by name
                    (RT-DETR's :class:`~peg_detr.models.rtdetr.encoder.AIFI`: ``sincos`` for the
                    actual size, ``peg``, rotary kinds, biases, ``none``)
    FPN top-down    lateral_convs[i] (1x1 conv + BN) -> nearest 2x up -> ``+`` (or concat) the
                    finer map -> fpn_blocks[i] (RepNCSPELAN5)
    PAN bottom-up   downsample_convs[i] (D-FINE's SCDown: 1x1 conv + BN, depthwise 3x3 stride 2 + BN)
                    -> ``+`` (or concat) the FPN map -> pan_blocks[i]

D-FINE concatenates where DEIMv2 adds (``fuse_op="sum"``, so the blocks take ``hidden_dim``
channels), and DEIMv2's RepNCSPELAN5 has no convs between its two CSP branches.  The CSP layer
is one 1x1 conv split into a shortcut and a RepVGG path, added, then an optional trailing 3x3
conv (``trailing_conv``; transformers' ``encoder_has_trailing_conv``).

Lite encoder (atto / femto / pico: one stride-16 backbone map)::

    input_proj[0] (1x1 conv + BN)                        -> P4 (stride 16)
    avg-pool 3x3 s2 -> down_conv1 (1x1 + BN + act)        -> P5 (stride 32)
    P5 = bi_fusion_conv(P5 + global average of P5)
    out16 = fpn_block(P4 + nearest-2x(P5))
    out32 = pan_block(P5 + down_conv2(avg-pool(out16)))

It has no attention and so no position encoding at all (``pos_enc`` is not used).
Module names follow transformers' ``Deimv2HybridEncoder`` / ``Deimv2LiteEncoder``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from peg_core.peg import PegOptions

from ..dfine.encoder import SCDown
from ..rtdetr.encoder import ConvNormLayer, CSPOptions, HybridEncoderBase, RepVggBlock

__all__ = ["CSPLayer", "DEIMv2HybridEncoder", "LiteEncoder", "RepNCSPELAN5", "fuse_maps"]

FUSE_OPS = ("sum", "cat")


def fuse_maps(a: Tensor, b: Tensor, op: str) -> Tensor:
    """``a + b`` (DEIMv2) or ``cat([a, b], 1)`` (D-FINE) of two ``(B, C, H, W)`` maps."""
    return a + b if op == "sum" else torch.cat([a, b], dim=1)


class CSPLayer(nn.Module):
    """DEIMv2's CSP layer: ``conv2(shortcut + blocks(path))`` with ``shortcut, path = chunk(conv1(x))``.

    ``(B, cin, H, W) -> (B, cout, H, W)``; ``conv1``: 1x1 to ``2 * hidden`` (``hidden = int(cout *
    expansion)``), ``bottlenecks``: RepVGG blocks, ``conv2``: 3x3 to ``cout`` when ``trailing_conv``,
    else identity (then ``hidden`` must equal ``cout``).  ``options``: the blocks, expansion,
    activation and eps (:class:`~peg_detr.models.rtdetr.encoder.CSPOptions`; None: its defaults).
    """

    def __init__(
        self, cin: int, cout: int, options: CSPOptions | None = None, *, trailing_conv: bool = True
    ) -> None:
        super().__init__()
        opt = options or CSPOptions()
        hidden = int(cout * opt.expansion)
        if not trailing_conv and hidden != cout:
            raise ValueError(f"without the trailing conv the CSP width {hidden} must equal cout={cout}")
        self.conv1 = ConvNormLayer(cin, 2 * hidden, 1, act=opt.act, eps=opt.eps)
        self.bottlenecks = nn.ModuleList(RepVggBlock(hidden, opt.act, opt.eps) for _ in range(opt.num_blocks))
        self.conv2 = (
            ConvNormLayer(hidden, cout, 3, act=opt.act, eps=opt.eps) if trailing_conv else nn.Identity()
        )

    def forward(self, x: Tensor) -> Tensor:
        shortcut, path = self.conv1(x).chunk(2, dim=1)
        for block in self.bottlenecks:
            path = block(path)
        return self.conv2(shortcut + path)


class RepNCSPELAN5(nn.Module):
    """DEIMv2's ELAN block: ``conv2(cat[a, b, c1, c2])`` with ``a, b = chunk(conv1(x))``, ``c1 = csp1(b)``, ``c2 = csp2(c1)``.

    ``(B, cin, H, W) -> (B, dim, H, W)``; ``conv1``: 1x1 to ``2 * dim``; the CSP layers have
    ``round(expansion * dim // 2)`` channels (no expansion inside them).  ``options``: the CSP
    layers' blocks, this block's expansion, every conv's activation and eps
    (:class:`~peg_detr.models.rtdetr.encoder.CSPOptions`); ``trailing_conv``: the CSP layers'.
    """

    def __init__(
        self,
        dim: int,
        cin: int | None = None,
        options: CSPOptions | None = None,
        *,
        trailing_conv: bool = True,
    ) -> None:
        super().__init__()
        opt = options or CSPOptions()
        cin = dim if cin is None else cin
        csp = round(opt.expansion * dim // 2)
        inner = replace(opt, expansion=1.0)
        self.conv1 = ConvNormLayer(cin, 2 * dim, 1, act=opt.act, eps=opt.eps)
        self.csp_rep1 = CSPLayer(dim, csp, inner, trailing_conv=trailing_conv)
        self.csp_rep2 = CSPLayer(csp, csp, inner, trailing_conv=trailing_conv)
        self.conv2 = ConvNormLayer(2 * dim + 2 * csp, dim, 1, act=opt.act, eps=opt.eps)

    def forward(self, x: Tensor) -> Tensor:
        a, b = self.conv1(x).chunk(2, dim=1)
        c1 = self.csp_rep1(b)
        c2 = self.csp_rep2(c1)
        return self.conv2(torch.cat([a, b, c1, c2], dim=1))


class DEIMv2HybridEncoder(HybridEncoderBase):
    """DEIMv2's hybrid encoder on projected maps ``(B, hidden_dim, H_l, W_l)``, finest first.

    The constructor, AIFI and the fusion loop are RT-DETR's
    (:class:`~peg_detr.models.rtdetr.encoder.HybridEncoderBase`); DEIMv2's are the input
    projections (optional), the RepNCSPELAN5 / SCDown fusion modules and the merge (``fuse_op``).

    Args:
        num_levels: maps in (3 for the DINOv3 sizes, 2 for HGNetv2 N).
        hidden_dim: the encoder's width (HF ``encoder_hidden_dim``).
        in_channels: widths of the backbone maps, which then get a 1x1 conv + BN projection each
            (``input_proj``; HGNetv2 N, transformers' ``conv_encoder.encoder_input_proj``); None: the
            maps come projected (the DINOv3 backbone's ``fusion_proj``), no ``input_proj`` keys.
        fuse_op: ``"sum"`` (DEIMv2) or ``"cat"``.
        trailing_conv: the CSP layers' trailing 3x3 conv (HF ``encoder_has_trailing_conv``).
        use_encoder_idx: the levels AIFI runs on (DEIMv2: the coarsest, ``-1``).
        peg_kernel_size, peg_separable, peg_padding: the PEG's kernel, factorisation and border mode.
        options: the rest of :class:`~peg_detr.models.rtdetr.encoder.HybridEncoder`'s keywords, the
            same names and defaults (num_heads, dim_feedforward, dropout, act, conv_act, expansion,
            depth_mult, num_layers, pos_enc, temperature, normalize_before, layer_norm_eps,
            batch_norm_eps, peg_at, learned_grid, pos_interpolation); ``conv_act``, ``expansion``,
            ``depth_mult`` and ``batch_norm_eps`` shape the ELAN / CSP / RepVGG convs.

    ``forward(maps) -> list of (B, hidden_dim, H_l, W_l)`` (the PAN outputs, finest first).
    :attr:`hparams` holds the constructor arguments (json-safe).
    """

    def __init__(
        self,
        num_levels: int = 3,
        hidden_dim: int = 256,
        *,
        in_channels: Sequence[int] | None = None,
        fuse_op: str = "sum",
        trailing_conv: bool = False,
        use_encoder_idx: Sequence[int] = (-1,),
        peg_kernel_size: int = 3,
        peg_separable: bool = False,
        peg_padding: str = "zeros",
        **options: Any,
    ) -> None:
        if fuse_op not in FUSE_OPS:
            raise ValueError(f"fuse_op must be one of {FUSE_OPS}; got {fuse_op!r}")
        if in_channels is not None and len(in_channels) != num_levels:
            raise ValueError(f"in_channels {list(in_channels)} needs one width per level ({num_levels})")
        # read by make_input_proj / build_fusion / merge, which the shared constructor calls (plain
        # values, so they may be set before nn.Module's own __init__)
        self.num_levels, self.fuse_op, self.trailing_conv = num_levels, fuse_op, trailing_conv
        self.projected = in_channels is None
        peg = PegOptions(kernel_size=peg_kernel_size, separable=peg_separable, padding_mode=peg_padding)
        widths = [hidden_dim] * num_levels if in_channels is None else in_channels
        super().__init__(widths, hidden_dim, use_encoder_idx=use_encoder_idx, peg=peg, **options)
        self.hparams.update(
            num_levels=num_levels,
            in_channels=None if in_channels is None else list(in_channels),
            fuse_op=fuse_op,
            trailing_conv=trailing_conv,
        )

    def make_input_proj(self) -> nn.ModuleList:
        """A 1x1 conv + BN (``conv`` / ``norm``, the batch-norm eps) per backbone map; none for projected maps."""
        if self.projected:
            return nn.ModuleList(nn.Identity() for _ in self.in_channels)  # no keys
        eps = self.hparams["batch_norm_eps"]
        return nn.ModuleList(ConvNormLayer(c, self.hidden_dim, 1, eps=eps) for c in self.in_channels)

    def build_fusion(self) -> None:
        """1x1 lateral convs and RepNCSPELAN5 blocks top-down, SCDown and RepNCSPELAN5 blocks bottom-up."""
        hp = self.hparams
        hidden_dim, eps, n = self.hidden_dim, hp["batch_norm_eps"], self.num_levels - 1
        cin = hidden_dim if self.fuse_op == "sum" else 2 * hidden_dim
        csp = CSPOptions(round(3 * hp["depth_mult"]), hp["expansion"], hp["conv_act"], eps)
        self.lateral_convs = nn.ModuleList(
            ConvNormLayer(hidden_dim, hidden_dim, 1, eps=eps) for _ in range(n)
        )
        self.fpn_blocks = nn.ModuleList(
            RepNCSPELAN5(hidden_dim, cin, csp, trailing_conv=self.trailing_conv) for _ in range(n)
        )
        self.downsample_convs = nn.ModuleList(SCDown(hidden_dim, 3, 2, eps=eps) for _ in range(n))
        self.pan_blocks = nn.ModuleList(
            RepNCSPELAN5(hidden_dim, cin, csp, trailing_conv=self.trailing_conv) for _ in range(n)
        )

    def merge(self, a: Tensor, b: Tensor) -> Tensor:
        """DEIMv2 adds the two maps (``fuse_op="sum"``); ``"cat"`` concatenates them (D-FINE)."""
        return fuse_maps(a, b, self.fuse_op)


class LiteEncoder(nn.Module):
    """DEIMv2's lite encoder: one backbone map (stride 16) -> two maps (strides 16, 32), no attention.

    ``forward([x (B, in_channels, H, W)]) -> [(B, hidden_dim, H, W), (B, hidden_dim, ceil(H/2), ceil(W/2))]``.
    """

    def __init__(
        self,
        in_channels: Sequence[int] = (512,),
        hidden_dim: int = 112,
        *,
        expansion: float = 0.34,
        depth_mult: float = 0.5,
        conv_act: str | None = "silu",
        trailing_conv: bool = True,
        batch_norm_eps: float = 1e-5,
    ) -> None:
        hparams = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        super().__init__()
        self.hparams = {k: list(v) if isinstance(v, (list, tuple)) else v for k, v in hparams.items()}
        eps = batch_norm_eps
        self.hidden_dim = hidden_dim
        self.pos_enc = "none"  # no attention, so no position encoding (the detectors report it)
        self.out_channels = [hidden_dim, hidden_dim]
        self.input_proj = nn.ModuleList(ConvNormLayer(c, hidden_dim, 1, eps=eps) for c in in_channels)
        self.down_pool1 = nn.AvgPool2d(kernel_size=3, stride=2, padding=1)
        self.down_conv1 = ConvNormLayer(hidden_dim, hidden_dim, 1, act=conv_act, eps=eps)
        self.down_pool2 = nn.AvgPool2d(kernel_size=3, stride=2, padding=1)
        self.down_conv2 = ConvNormLayer(hidden_dim, hidden_dim, 1, act=conv_act, eps=eps)
        self.bi_fusion_conv = ConvNormLayer(hidden_dim, hidden_dim, 1, act=conv_act, eps=eps)
        csp = CSPOptions(round(3 * depth_mult), expansion, conv_act, eps)
        self.fpn_block = RepNCSPELAN5(hidden_dim, options=csp, trailing_conv=trailing_conv)
        self.pan_block = RepNCSPELAN5(hidden_dim, options=csp, trailing_conv=trailing_conv)

    def forward(self, maps: Sequence[Tensor]) -> list[Tensor]:
        if len(maps) != len(self.input_proj):
            raise ValueError(f"the lite encoder takes {len(self.input_proj)} map(s); got {len(maps)}")
        feats = [proj(m) for proj, m in zip(self.input_proj, maps)]
        p5 = self.down_conv1(self.down_pool1(feats[-1]))
        p5 = self.bi_fusion_conv(p5 + F.adaptive_avg_pool2d(p5, 1))
        p4 = feats[0]
        out16 = self.fpn_block(p4 + F.interpolate(p5, size=p4.shape[-2:], mode="nearest"))
        out32 = self.pan_block(p5 + self.down_conv2(self.down_pool2(out16)))
        return [out16, out32]
