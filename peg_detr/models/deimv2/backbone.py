"""DEIMv2's DINOv3 backbone: a rotary ViT, the spatial tuning adapter (STA) and the fusion projections.

DEIMv2 (Huang et al., 2025, "Real-Time Object Detection Meets DINOv3") feeds its hybrid encoder
three maps at strides 8 / 16 / 32 built from one stride-16 ViT::

    image (B, 3, H, W)
      ViT (peg_core CPVT, pos_enc "rope-dinov3")  -> tokens after blocks out_indices[0..2]
        (each optionally LayerNorm-ed), reshaped to (B, C, H/16, W/16), bilinearly resized to
        (2 H/16, 2 W/16), (H/16, W/16), (H/32, W/32)          "semantic" maps
      STA: a small conv stem (stride 2, max pool, then three stride-2 convs)
        -> (B, 2i, H/8, W/8), (B, 4i, H/16, W/16), (B, 4i, H/32, W/32)   "detail" maps
      fusion_proj[l]: 1x1 conv + BN of concat(semantic_l, detail_l) -> (B, hidden_dim, H_l, W_l)

The ViT is the suite's DINOv3 ViT (:class:`peg_core.models.cpvt.CPVT` with the ``rope-dinov3``
rotary encoding: coordinates normalised to ``[-1, 1]`` per axis, periods ``100 ** (i / n)``,
half pair layout), so its rotation is rebuilt for the grid of every call and any input size runs
(no position table, no cached size).  Module names of the STA and the projections follow
transformers' ``Deimv2DINOv3ConvEncoder`` (``spatial_tuning_adapter.*``, ``fusion_proj.*``); the
ViT's keys are CPVT's (:mod:`peg_detr.interop.hf_deimv2` maps transformers' ``DINOv3ViTBackbone``
onto them).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from peg_core.models.cpvt import CPVT

from ...structures import IMAGENET_MEAN, IMAGENET_STD
from ..rtdetr.encoder import ConvNormLayer

__all__ = [
    "DINOV3_VITS",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "DINOv3STABackbone",
    "SpatialTuningAdapter",
    "build_dinov3_sta",
]


#: DEIMv2's ViTs: CPVT's shape keywords (``embed_dim``, ``depth``, ``num_heads``, ``mlp_ratio``,
#: ``num_reg_tokens``, ``norm_eps``) and the backbone's defaults (``layer_scale``: the blocks' layer-scale
#: init, None: none; ``apply_layernorm``: LayerNorm on every selected block; ``final_norm``: on the last
#: block's output).  ``vit_tiny`` / ``vit_tinyplus``: DEIMv2's ViTs distilled from DINOv3 (S, M:
#: class token only, no layer scale, no final norm: DEIMv2's ``vit_tiny.py``); ``dinov3_vits16``: Meta's
#: DINOv3 ViT-S/16 (L; 4 registers, layer scale, normalised outputs).  ``dinov3_vits16plus`` (X) has a
#: SwiGLU MLP, which CPVT's blocks do not have: it is not listed.
DINOV3_VITS: dict[str, dict] = {
    "vit_tiny": dict(embed_dim=192, depth=12, num_heads=3, mlp_ratio=4.0, num_reg_tokens=0, norm_eps=1e-6,
                     layer_scale=None, apply_layernorm=False, final_norm=False),
    "vit_tinyplus": dict(embed_dim=256, depth=12, num_heads=4, mlp_ratio=4.0, num_reg_tokens=0, norm_eps=1e-6,
                         layer_scale=None, apply_layernorm=False, final_norm=False),
    "dinov3_vits16": dict(embed_dim=384, depth=12, num_heads=6, mlp_ratio=4.0, num_reg_tokens=4, norm_eps=1e-5,
                          layer_scale=1e-5, apply_layernorm=True, final_norm=True),
}  # fmt: skip
_BACKBONE_DEFAULTS = ("layer_scale", "apply_layernorm", "final_norm")


class SpatialTuningAdapter(nn.Module):
    """DEIMv2's STA: a light conv stem giving detail maps at strides 8, 16 and 32.

    ``forward(x (B, 3, H, W)) -> [(B, 2i, H/8, W/8), (B, 4i, H/16, W/16), (B, 4i, H/32, W/32)]``
    (``i = inplanes``; sides rounded up by each stride-2 conv).  Keys ``stem_conv``, ``conv2``,
    ``conv3``, ``conv4`` (conv + BN each; GELU after the stem and between the later convs).
    """

    def __init__(self, inplanes: int = 16, batch_norm_eps: float = 1e-5) -> None:
        super().__init__()
        i, eps = inplanes, batch_norm_eps
        self.stem_conv = ConvNormLayer(3, i, 3, 2, act="gelu", eps=eps)
        self.stem_pool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.conv2 = ConvNormLayer(i, 2 * i, 3, 2, eps=eps)
        self.conv3 = ConvNormLayer(2 * i, 4 * i, 3, 2, eps=eps)
        self.conv4 = ConvNormLayer(4 * i, 4 * i, 3, 2, eps=eps)
        self.act = nn.GELU()
        self.out_channels = [2 * i, 4 * i, 4 * i]

    def forward(self, x: Tensor) -> list[Tensor]:
        c2 = self.conv2(self.stem_pool(self.stem_conv(x)))
        c3 = self.conv3(self.act(c2))
        c4 = self.conv4(self.act(c3))
        return [c2, c3, c4]


class DINOv3STABackbone(nn.Module):
    """DINOv3 ViT + STA + fusion projections: ``(B, 3, H, W)`` -> three ``(B, hidden_dim, H_l, W_l)`` maps.

    Args:
        vit: a :class:`CPVT` (class token, optional registers, ``pos_enc="rope-dinov3"`` for DEIMv2);
            its head and pooling are not used, nor the blocks after the last selected one (they are
            not run: no gradient reaches them, so DDP needs ``find_unused_parameters`` for such a
            ViT; DEIMv2's sizes select the last block).
        out_indices: the blocks whose outputs feed the three scales (0-based; DEIMv2: ``(5, 8, 11)``).
        hidden_dim: channels of the outputs (the encoder's ``hidden_dim``).
        sta_inplanes: the STA's base width ``i`` (DEIMv2's ``conv_inplane``: S / M 16, L 32, X 64).
        apply_layernorm: LayerNorm (the ViT's final ``norm``) on every selected output.
        final_norm: that LayerNorm on the ViT's last block's output when it is selected, whatever
            ``apply_layernorm`` says (transformers' ``DINOv3ViTBackbone`` always normalises its last
            stage; DEIMv2's distilled ViTs have no norm at all).
        batch_norm_eps: eps of the STA's and projections' batch norms.
        normalize_input: standardise the image with ImageNet's mean / std first, as DEIMv2's DINOv3
            sizes are trained (their data pipeline normalises).  The detector then takes pixels in
            ``[0, 1]`` like every RT-DETR-family model here (the training pipeline, ``predict`` and the
            ONNX export feed that); transformers' model takes the normalised image instead (its image
            processor normalises), so ``ours(x)`` equals ``theirs(pixel_values=(x - mean) / std)``.

    Each selected ViT map (``ceil(H / 16) x ceil(W / 16)`` cells: the image is zero-padded to the
    patch) is resized bilinearly (``align_corners=False``) to the STA map of its stride and
    concatenated with it; for sides that are multiples of 32 (DEIMv2's inputs) these are DEIMv2's
    ``(2h, 2w)``, ``(h, w)``, ``(h / 2, w / 2)`` with ``h = H / 16``, and any other size runs too.
    :attr:`out_channels`, :attr:`out_strides` as the RT-DETR backbones.
    """

    def __init__(
        self,
        vit: CPVT,
        out_indices: Sequence[int] = (5, 8, 11),
        hidden_dim: int = 192,
        *,
        sta_inplanes: int = 16,
        apply_layernorm: bool = True,
        final_norm: bool = True,
        batch_norm_eps: float = 1e-5,
        normalize_input: bool = True,
    ) -> None:
        super().__init__()
        self.normalize_input = normalize_input
        # not in the state dict: the input convention, not a weight (a checkpoint loads either way)
        self.register_buffer("input_mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("input_std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)
        depth = len(vit.blocks)
        out_indices = [int(i) % depth for i in out_indices]
        if len(out_indices) != 3:
            raise ValueError(f"the DINOv3 backbone gives 3 scales; got out_indices={out_indices}")
        self.vit = vit
        self.out_indices = out_indices
        self.apply_layernorm, self.final_norm = apply_layernorm, final_norm
        self.spatial_tuning_adapter = SpatialTuningAdapter(sta_inplanes, batch_norm_eps)
        embed = vit.embed_dim
        self.fusion_proj = nn.ModuleList(
            ConvNormLayer(embed + c, hidden_dim, 1, eps=batch_norm_eps)
            for c in self.spatial_tuning_adapter.out_channels
        )
        self.out_channels = [hidden_dim] * 3
        self.out_strides = [8, 16, 32]

    @property
    def patch_size(self) -> int:
        """The ViT's patch side (16)."""
        return self.vit.patch_size

    def semantic_features(self, x: Tensor) -> list[Tensor]:
        """The selected ViT blocks' patch tokens as maps ``(B, C, h, w)`` (``h = ceil(H / patch)``)."""
        vit = self.vit
        p = vit.patch_size
        # always pad (by 0 when the side is a multiple): no branch on the size, so an export stays dynamic
        x = F.pad(x, (0, (-x.shape[-1]) % p, 0, (-x.shape[-2]) % p))
        tokens, size = vit.patch_embed(x)
        prefix = [t.expand(tokens.shape[0], -1, -1) for t in (vit.cls_token, vit.reg_token) if t is not None]
        if prefix:
            tokens = torch.cat([*prefix, tokens], dim=1)
        if vit.pos_enc is not None:  # an additive table (not DEIMv2's, kept for other encodings)
            tokens = vit.pos_enc(tokens, size)
        prefix_len = vit.num_prefix_tokens
        rope = None if vit.rope is None else vit.rope(size, num_prefix_tokens=prefix_len)
        last = len(vit.blocks) - 1
        wanted = set(self.out_indices)
        outs: dict[int, Tensor] = {}
        for i, blk in enumerate(vit.blocks[: max(self.out_indices) + 1]):  # later blocks feed nothing
            table = None if rope is None else (rope[0][i], rope[1][i]) if vit.rope.learned else rope
            tokens = blk(tokens) if table is None else blk(tokens, table)
            if str(i) in vit.pos_blocks:
                tokens = vit.pos_blocks[str(i)](tokens, size)
            if i in wanted:
                out = vit.norm(tokens) if self.apply_layernorm or (self.final_norm and i == last) else tokens
                outs[i] = out[:, prefix_len:].transpose(1, 2).unflatten(-1, size)  # (B, C, h, w)
        return [outs[i] for i in self.out_indices]

    def forward(self, x: Tensor) -> list[Tensor]:
        if x.dim() != 4:
            raise ValueError(f"expected images (B, 3, H, W); got shape {tuple(x.shape)}")
        if self.normalize_input:  # [0, 1] pixels -> DINOv3's standardised input (ViT and STA both)
            x = (x - self.input_mean.to(x.dtype)) / self.input_std.to(x.dtype)
        feats = self.semantic_features(x)
        details = self.spatial_tuning_adapter(x)
        outs = []
        for proj, feat, detail in zip(self.fusion_proj, feats, details):
            # resized to the STA map of the same stride: for sides that are multiples of 32 that is
            # DEIMv2's (2h, 2w) / (h, w) / (h/2, w/2); other sides (where DEIMv2's sizes disagree
            # with its own STA maps and the concatenation fails) run too
            sem = F.interpolate(feat, size=detail.shape[-2:], mode="bilinear", align_corners=False)
            outs.append(proj(torch.cat([sem, detail], dim=1)))
        return outs


def build_dinov3_sta(
    name: str = "vit_tiny",
    *,
    hidden_dim: int = 192,
    out_indices: Sequence[int] = (5, 8, 11),
    sta_inplanes: int = 16,
    pos_enc: str = "rope-dinov3",
    layer_scale: float | str | None = "preset",
    apply_layernorm: bool | None = None,
    final_norm: bool | None = None,
    drop_path_rate: float = 0.0,
    batch_norm_eps: float = 1e-5,
    **vit_options,
) -> DINOv3STABackbone:
    """A DEIMv2 DINOv3 backbone by ViT name (:data:`DINOV3_VITS`), randomly initialised.

    ``vit_options`` override the preset's CPVT keywords (shape, ``norm_eps``, ``qkv_bias``,
    ``rope_temperature``, ``rope_options``, ``patch_size``); ``layer_scale`` (``"preset"``: the
    preset's; None: no layer scale), ``apply_layernorm`` and ``final_norm`` (None: the preset's) the
    backbone's.  Weights come from :mod:`peg_detr.interop.hf_deimv2` or a checkpoint.
    """
    if name not in DINOV3_VITS:
        raise ValueError(f"unknown DINOv3 backbone {name!r}; choose from {sorted(DINOV3_VITS)}")
    preset = dict(DINOV3_VITS[name])
    defaults = {k: preset.pop(k) for k in _BACKBONE_DEFAULTS}
    shape = {**preset, **vit_options}
    vit = CPVT(
        shape.pop("embed_dim"),
        shape.pop("depth"),
        shape.pop("num_heads"),
        num_classes=0,
        pos_enc=pos_enc,
        class_token=True,
        global_pool="token",
        init_values=defaults["layer_scale"] if layer_scale == "preset" else layer_scale,
        drop_path_rate=drop_path_rate,
        **shape,
    )
    return DINOv3STABackbone(
        vit, out_indices, hidden_dim, sta_inplanes=sta_inplanes, batch_norm_eps=batch_norm_eps,
        apply_layernorm=defaults["apply_layernorm"] if apply_layernorm is None else apply_layernorm,
        final_norm=defaults["final_norm"] if final_norm is None else final_norm,
    )  # fmt: skip
