"""D-FINE's hybrid encoder: RT-DETR's AIFI, then an FPN / PAN built of RepNCSPELAN4 blocks and SCDown.

Data flow for the backbone maps (strides 8/16/32, or 16/32 for D-FINE N), finest first::

    input_proj[l]        1×1 conv + BN to ``hidden_dim``                     (HF ``model.encoder_input_proj``)
    aifi                 RT-DETR's AIFI on the coarsest map, any registry encoding
    top-down (FPN)       lateral_convs[i] (1×1 conv + BN, no activation) -> nearest up to the finer
                         map's size -> cat -> fpn_blocks[i] (RepNCSPELAN4)
    bottom-up (PAN)      downsample_convs[i] (SCDown: 1×1 conv + BN, 3×3 depthwise stride-2 conv + BN)
                         -> cat with the FPN map -> pan_blocks[i] (RepNCSPELAN4)

The position encoding lives only in AIFI (:class:`peg_detr.models.rtdetr.encoder.AIFI`, reused as
is): ``sincos`` is computed for the actual size on every call (D-FINE's formula, never the
``eval_spatial_size`` table the reference implementations cache), ``peg`` is a zero-initialised
PEG (so the model equals the ``none`` one until trained), and every other kind of
:data:`~peg_detr.models.rtdetr.encoder.AIFI_ENCODINGS` works the same way as in RT-DETR.

Module names follow transformers' ``DFineHybridEncoder`` (``fpn_blocks.{i}.{conv1,csp_rep1,conv2,
csp_rep2,conv3,conv4}``, ``downsample_convs.{i}.{conv1,conv2}``), so :mod:`peg_detr.interop.hf_dfine`
maps keys by prefix.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..layers import ConvNormLayer
from ..rtdetr.encoder import AIFI_ENCODINGS, CSPOptions, CSPRepLayer, HybridEncoderBase

__all__ = ["DFINE_ENCODINGS", "DFineHybridEncoder", "RepNCSPELAN4", "SCDown"]

#: D-FINE's AIFI takes what RT-DETR's takes (the same module).
DFINE_ENCODINGS = AIFI_ENCODINGS


class SCDown(nn.Module):
    """Spatial-channel decoupled downsampling (YOLOv10's, D-FINE's PAN): 1×1 conv + BN, then depthwise k×k stride s + BN.

    ``(B, C, H, W) -> (B, C, ceil(H / s), ceil(W / s))`` for ``k = 3, s = 2``; neither conv has an
    activation (transformers' and D-FINE's ``SCDown``).
    """

    def __init__(self, channels: int, kernel_size: int = 3, stride: int = 2, eps: float = 1e-5) -> None:
        super().__init__()
        self.conv1 = ConvNormLayer(channels, channels, 1, eps=eps)
        # depthwise k×k, no activation (HF's DFineConvNormLayer with groups)
        self.conv2 = ConvNormLayer(channels, channels, kernel_size, stride, eps=eps, groups=channels)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv2(self.conv1(x))


class RepNCSPELAN4(nn.Module):
    """GELAN block of YOLOv9 as D-FINE uses it: ``(B, cin, H, W) -> (B, cout, H, W)``.

    ``conv1`` (1×1, ``cin -> c3``) splits into two halves of ``c3 / 2``; the second half runs
    through ``csp_rep1`` (CSP of RepVGG blocks to ``c4``) + ``conv2`` (3×3), then ``csp_rep2`` +
    ``conv3`` (3×3); ``conv4`` (1×1) fuses the two halves and both branch outputs
    (``c3 + 2 * c4 -> cout``).  D-FINE: ``cin = c3 = 2 * hidden``, ``cout = hidden``,
    ``c4 = round(expansion * hidden // 2)``.
    """

    def __init__(
        self,
        cin: int,
        cout: int,
        c3: int,
        c4: int,
        num_blocks: int = 3,
        act: str | None = "silu",
        conv_act: str | None = "silu",
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        if c3 % 2:
            raise ValueError(f"RepNCSPELAN4 splits c3 in two halves; got c3={c3}")
        self.half = c3 // 2
        self.conv1 = ConvNormLayer(cin, c3, 1, act=act, eps=eps)
        # the CSP layers keep their width (expansion 1: no conv3); their convs use the encoder's activation
        csp = CSPOptions(num_blocks, 1.0, conv_act, eps)
        self.csp_rep1 = CSPRepLayer(self.half, c4, csp)
        self.conv2 = ConvNormLayer(c4, c4, 3, act=act, eps=eps)
        self.csp_rep2 = CSPRepLayer(c4, c4, csp)
        self.conv3 = ConvNormLayer(c4, c4, 3, act=act, eps=eps)
        self.conv4 = ConvNormLayer(c3 + 2 * c4, cout, 1, act=act, eps=eps)

    def forward(self, x: Tensor) -> Tensor:
        a, b = self.conv1(x).split((self.half, self.half), dim=1)
        b1 = self.conv2(self.csp_rep1(b))
        b2 = self.conv3(self.csp_rep2(b1))
        return self.conv4(torch.cat([a, b, b1, b2], dim=1))


class DFineHybridEncoder(HybridEncoderBase):
    """D-FINE's hybrid encoder (module docstring).

    Args:
        in_channels: channels of the backbone maps, finest first (HGNetv2-B4: ``(512, 1024, 2048)``).
        hidden_dim: width of every encoder map (HF ``encoder_hidden_dim``).
        num_heads, dim_feedforward, dropout, act: AIFI's heads, MLP width, dropout and MLP activation.
        conv_act: activation of the RepVGG / CSP convolutions (HF ``activation_function``, ``silu``).
        elan_act: activation of the RepNCSPELAN4 convolutions (D-FINE: ``silu``, fixed in transformers).
        expansion: RepNCSPELAN4 branch width ``c4 = round(expansion * hidden_dim // 2)`` (HF ``hidden_expansion``).
        depth_mult: RepVGG blocks per CSP layer ``round(3 * depth_mult)``.
        options: the rest of :class:`peg_detr.models.rtdetr.encoder.HybridEncoder`'s keywords, the
            same names and defaults (num_layers, use_encoder_idx, pos_enc, temperature,
            normalize_before, layer_norm_eps, batch_norm_eps, peg_at, peg, learned_grid,
            pos_interpolation): the constructor, the input projections and AIFI are that module's
            (:class:`~peg_detr.models.rtdetr.encoder.HybridEncoderBase`).

    ``forward(feats: list of (B, in_channels[l], H_l, W_l)) -> list of (B, hidden_dim, H_l, W_l)``,
    finest first.  :attr:`hparams` holds every constructor argument (json-safe).
    """

    def __init__(
        self,
        in_channels: Sequence[int] = (512, 1024, 2048),
        hidden_dim: int = 256,
        *,
        elan_act: str | None = "silu",
        **options: Any,
    ) -> None:
        # read by build_fusion, which the shared constructor calls (a plain value, so it may be set
        # before nn.Module's own __init__)
        self.elan_act = elan_act
        super().__init__(in_channels, hidden_dim, **options)
        self.hparams["elan_act"] = elan_act

    def build_fusion(self) -> None:
        """D-FINE's FPN / PAN: RepNCSPELAN4 blocks, 1×1 lateral convs and SCDown (no activation on either)."""
        hp = self.hparams
        hidden_dim, batch_norm_eps, n = hp["hidden_dim"], hp["batch_norm_eps"], len(hp["in_channels"]) - 1
        c4 = round(hp["expansion"] * hidden_dim // 2)
        elan = dict(num_blocks=round(3 * hp["depth_mult"]), act=self.elan_act, conv_act=hp["conv_act"],
                    eps=batch_norm_eps)  # fmt: skip
        # module creation order as transformers' (lateral, fpn per level; then downsample, pan)
        self.lateral_convs = nn.ModuleList()
        self.fpn_blocks = nn.ModuleList()
        for _ in range(n):
            self.lateral_convs.append(ConvNormLayer(hidden_dim, hidden_dim, 1, eps=batch_norm_eps))
            self.fpn_blocks.append(RepNCSPELAN4(2 * hidden_dim, hidden_dim, 2 * hidden_dim, c4, **elan))
        self.downsample_convs = nn.ModuleList()
        self.pan_blocks = nn.ModuleList()
        for _ in range(n):
            self.downsample_convs.append(SCDown(hidden_dim, 3, 2, eps=batch_norm_eps))
            self.pan_blocks.append(RepNCSPELAN4(2 * hidden_dim, hidden_dim, 2 * hidden_dim, c4, **elan))
