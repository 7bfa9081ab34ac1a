"""``DFineConfig``: D-FINE's settings, RT-DETR's extended (defaults: D-FINE-L, as transformers' ``DFineConfig``).

D-FINE keeps RT-DETR's encoder and recipe and adds fine-grained distribution refinement, its
losses and the HGNetv2 backbones, so its config is :class:`~peg_detr.models.rtdetr.config.RTDETRConfig`'s
plus those fields.  :data:`DFINE_SIZES` holds the published sizes (Peterande/D-FINE
``configs/dfine/dfine_hgnetv2_{n,s,m,l,x}_coco.yml``) as overrides of the defaults.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from peg_core.registry import EncodingSupport, parse_pos_enc

from ..config import option
from ..rtdetr.config import RTDETRConfig, check_counts
from ..rtdetr.decoder import ACTIVATIONS
from .criterion import DFINE_WEIGHTS
from .encoder import DFINE_ENCODINGS

__all__ = ["CLS_LOSSES", "DFINE_SIZES", "DFineConfig"]

#: ``cls_loss`` choices: D-FINE's varifocal loss, DEIM's matchability-aware loss, plain focal
CLS_LOSSES = ("vfl", "mal", "focal")

#: ``size -> DFineConfig overrides`` of the published COCO models (backbone, widths, depths, points).
DFINE_SIZES: dict[str, dict[str, Any]] = {
    "n": dict(backbone="hgnetv2_b0", backbone_return_idx=[2, 3], hidden_dim=128, dim_feedforward=512,
              encoder_dim_feedforward=512, encoder_expansion=0.34, depth_mult=0.5, dec_layers=3,
              num_points=[6, 6]),
    "s": dict(backbone="hgnetv2_b0", encoder_expansion=0.5, depth_mult=0.34, dec_layers=3, num_points=[3, 6, 3]),
    "m": dict(backbone="hgnetv2_b2", encoder_expansion=1.0, depth_mult=0.67, dec_layers=4, num_points=[3, 6, 3]),
    "l": dict(backbone="hgnetv2_b4", encoder_expansion=1.0, depth_mult=1.0, dec_layers=6, num_points=[3, 6, 3]),
    "x": dict(backbone="hgnetv2_b5", encoder_hidden_dim=384, encoder_dim_feedforward=2048, encoder_expansion=1.0,
              depth_mult=1.0, dec_layers=6, num_points=[3, 6, 3], reg_scale=8.0),
}  # fmt: skip

#: ``--model-size tiny``: the CPU demo's D-FINE (the tiny ResNet-vd, width 32, D-FINE's other settings)
_TINY: dict[str, Any] = dict(
    backbone="tiny", hidden_dim=32, num_heads=2, dim_feedforward=64, dec_layers=2, encoder_expansion=0.5,
    depth_mult=0.34, num_points=[3, 6, 3],
)  # fmt: skip

_ACT = dict(choices=ACTIVATIONS)


@dataclass(kw_only=True)
class DFineConfig(RTDETRConfig):
    """D-FINE with the chosen AIFI position encoding (the fields RT-DETR's config lacks, and D-FINE's defaults).

    Attributes:
        backbone: ``hgnetv2_b0`` .. ``hgnetv2_b5`` or ``tiny`` (:data:`~.build.DFINE_BACKBONES`).
        pos_enc: AIFI's encoding (:data:`~.encoder.DFINE_ENCODINGS`): ``sincos`` (D-FINE's formula,
            computed for the actual size), ``peg`` (zero-initialised), ``none``, ``learned``, a rotary or bias kind.
        hidden_dim, encoder_hidden_dim: the decoder's width (and the encoder's unless
            ``encoder_hidden_dim``; X: 384).
        dim_feedforward, encoder_dim_feedforward: FFN widths of the decoder and of AIFI (default: the same).
        num_points: deformable points per head for each level (D-FINE S-X: ``[3, 6, 3]``; N: ``[6, 6]``).
        eval_idx: the decoder layer that predicts in eval (-1: the last).
        max_num_bins, reg_scale, up: fine-grained distribution refinement (32, 4 (X: 8), 0.5).
        lqe_hidden_dim: the localisation-quality MLP's width.
        decoder_activation, mlp_activation: the decoder FFN's and the box / position heads'
            activations (D-FINE: ReLU both; DEIM: SiLU both).
        freeze_backbone_bn, backbone_freeze_at: frozen norms and frozen stem / stages
            (:class:`~.backbone.HGNetv2Backbone`); ``None``: D-FINE's (frozen for B4 / B5 with the stem).
        backbone_weights: a local state dict of the HGNetv2 in timm's names (nothing is downloaded).
        backbone_return_idx: the HGNetv2 stages returned (default ``(1, 2, 3)``: strides 8/16/32; N ``(2, 3)``).
        vfl_loss_coef, bbox_loss_coef, giou_loss_coef, fgl_loss_coef, ddf_loss_coef: loss weights
            (D-FINE: 1, 5, 2, 0.15, 1.5); ``vfl_loss_coef`` weighs whichever ``cls_loss`` is chosen.
        cls_loss, cls_loss_gamma: the classification loss, ``vfl`` (D-FINE), ``mal`` (DEIM's
            matchability-aware loss) or ``focal``, and its focusing exponent (``None``: 2.0, MAL 1.5).

    The other fields are :class:`RTDETRConfig`'s.
    """

    TITLE = "D-FINE"
    HELP_TITLE = "D-FINE and DEIM"  # DEIM trains D-FINE's model: its loss and activations are these flags
    ENCODINGS: ClassVar[EncodingSupport] = DFINE_ENCODINGS
    SIZES: ClassVar[Mapping[str, Mapping[str, Any]]] = {**DFINE_SIZES, "tiny": _TINY}

    backbone: str = "hgnetv2_b4"
    # the decoder's width and FFN; the encoder's are encoder_hidden_dim / encoder_dim_feedforward (None: the same)
    hidden_dim: int = option(256, hf="d_model", where="decoder.hidden_dim")
    dim_feedforward: int = option(1024, hf="decoder_ffn_dim", where="decoder.dim_feedforward")
    num_points: int | Sequence[int] = option((3, 6, 3), hf="decoder_n_points", where="decoder.num_points")
    freeze_backbone_bn: bool | None = option(
        None, flag="--freeze-backbone-bn", boolean=True,
        help="frozen backbone norms (default: the size's; D-FINE L/X frozen, DEIM unfreezes)",
    )  # fmt: skip
    encoder_hidden_dim: int | None = option(None, hf="encoder_hidden_dim", where="encoder.hidden_dim")
    encoder_dim_feedforward: int | None = option(None, hf="encoder_ffn_dim", where="encoder.dim_feedforward")
    depth_mult: float = option(1.0, hf="depth_mult", where="encoder.depth_mult")
    eval_idx: int = option(-1, hf="eval_idx", where="decoder.eval_idx")
    max_num_bins: int = option(32, hf="max_num_bins", where="decoder.max_num_bins")
    reg_scale: float = option(4.0, hf="reg_scale", where="decoder.reg_scale")
    up: float = option(0.5, hf="up", where="decoder.up")
    lqe_hidden_dim: int = option(64, hf="lqe_hidden_dim", where="decoder.lqe_hidden_dim")
    decoder_activation: str = option(
        "relu", flag="--decoder-act", hf="decoder_activation_function", where="decoder.activation", **_ACT,
        help="the decoder FFN's activation (D-FINE relu, DEIM silu)",
    )  # fmt: skip
    mlp_activation: str = option(
        "relu",
        flag="--head-act",
        where="decoder.mlp_activation",
        **_ACT,
        help="the box / position heads' activation (D-FINE relu, DEIM silu)",
    )
    backbone_freeze_at: int | None = option(
        None, flag="--backbone-freeze-at", type="int",
        help="frozen backbone parts: -1 none, 0 the stem, k the stem and k stages (default: the size's; "
        "D-FINE L/X 0, DEIM -1)",
    )  # fmt: skip
    backbone_return_idx: Sequence[int] | None = None
    fgl_loss_coef: float = DFINE_WEIGHTS["loss_fgl"]
    ddf_loss_coef: float = DFINE_WEIGHTS["loss_ddf"]
    cls_loss: str = option(
        "vfl", flag="--cls-loss", choices=CLS_LOSSES, loss=True,
        help="classification loss: vfl (D-FINE), mal (DEIM's matchability-aware loss, gamma 1.5), focal",
    )  # fmt: skip
    cls_loss_gamma: float | None = None

    def validate(self) -> None:
        """The encoding (refused before any backbone is built), the counts, both widths' head split, the loss."""
        parse_pos_enc(self.pos_enc, type(self).ENCODINGS)
        check_counts(self.num_classes, self.num_queries, self.num_denoising)
        enc_dim = self.hidden_dim if self.encoder_hidden_dim is None else self.encoder_hidden_dim
        for width in (self.hidden_dim, enc_dim):
            if width % self.num_heads:
                raise ValueError(
                    f"hidden widths ({self.hidden_dim}, {enc_dim}) must be divisible by num_heads={self.num_heads}"
                )
        if self.cls_loss not in CLS_LOSSES:
            raise ValueError(f"cls_loss must be one of {CLS_LOSSES}; got {self.cls_loss!r}")
