"""``RTDETRConfig``: RT-DETR's settings, one typed source (defaults: RT-DETR-R50vd, lyuwenyu/RT-DETR's 6x configs).

:func:`~peg_detr.models.rtdetr.build.build_rtdetr` builds it; its :meth:`~peg_detr.models.config.DetectorConfig.to_dict`
is the checkpoint's ``model_config``.  D-FINE's config extends it (:mod:`peg_detr.models.dfine.config`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from peg_core.registry import EncodingSupport, parse_pos_enc

from ..config import DetectorConfig, option
from .criterion import RTDETR_WEIGHTS
from .encoder import AIFI_ENCODINGS

__all__ = ["NUM_QUERIES", "RTDETRConfig", "check_counts"]

#: the queries RT-DETR and its successors (D-FINE, DEIM, DEIMv2's N..L) select: one definition
NUM_QUERIES = 300


def check_counts(num_classes: int, num_queries: int, num_denoising: int) -> None:
    """A ``ValueError`` unless the class and query counts are positive and the denoising count is not negative."""
    if num_classes < 1 or num_queries < 1 or num_denoising < 0:
        raise ValueError(
            f"num_classes={num_classes} and num_queries={num_queries} must be >= 1, num_denoising >= 0"
        )


@dataclass(kw_only=True)
class RTDETRConfig(DetectorConfig):
    """RT-DETR with the chosen AIFI position encoding.

    Attributes:
        backbone: ``r18vd`` / ``r34vd`` / ``r50vd`` / ``r101vd`` or ``tiny`` (:data:`~.build.RTDETR_BACKBONES`).
        pos_enc: AIFI's position encoding (what :data:`~.encoder.AIFI_ENCODINGS` accepts): ``sincos`` (RT-DETR's
            formula, computed for the actual size), ``peg`` (a zero-initialised PEG: equals ``none``
            until trained), ``none``, ``learned`` or a rotary one.
        num_classes: sigmoid classes (COCO with RT-DETR's remapped labels: 80; with category ids: 91).
        hidden_dim, num_heads, dim_feedforward, dropout: widths of the encoder and decoder.
        enc_layers: AIFI layers on the stride-32 map (RT-DETR: 1).
        dec_layers: decoder layers (RT-DETR R18vd: 3, R50vd: 6).
        num_queries, num_points: selected queries and deformable samples per head and level.
        encoder_expansion, depth_mult: CCFM's CSP width and depth multipliers (R18vd: 0.5, 1.0).
        num_denoising, label_noise_ratio, box_noise_scale: contrastive denoising (0 queries: off).
        aux_loss: losses on every decoder layer and on the encoder proposals.
        backbone_weights: a local ImageNet state dict of the ResNet-vd (nothing is downloaded; not stored).
        freeze_backbone_bn: FrozenBatchNorm2d in the backbone; ``None``: as RT-DETR (R50vd/R101vd).
        peg_at: where AIFI's PEGs go (:func:`peg_core.peg.resolve_peg_at`): ``-1`` on the AIFI
            input (default, so the attention sees positions), ``i`` after AIFI layer ``i``.
        peg_kernel_size, peg_separable, peg_padding, peg_dynamic, peg_num_kernels: the PEG's
            options, the same as in every model of the suite.
        learned_grid, pos_interpolation: the ``learned`` table's ``(H0, W0)`` and resize mode.
        vfl_loss_coef, bbox_loss_coef, giou_loss_coef: loss weights (RT-DETR: 1, 5, 2).
    """

    TITLE = "RT-DETR"
    #: what ``pos_enc`` may be (the family's encoder's support set)
    ENCODINGS: ClassVar[EncodingSupport] = AIFI_ENCODINGS

    backbone: str = "r50vd"
    pos_enc: str = "sincos"
    num_classes: int = 80
    hidden_dim: int = option(
        256, hf=("d_model", "encoder_hidden_dim"), where=("decoder.hidden_dim", "encoder.hidden_dim")
    )
    num_heads: int = option(
        8,
        hf=("encoder_attention_heads", "decoder_attention_heads"),
        where=("encoder.num_heads", "decoder.num_heads"),
    )
    enc_layers: int = 1
    dec_layers: int = 6
    dim_feedforward: int = option(
        1024,
        hf=("encoder_ffn_dim", "decoder_ffn_dim"),
        where=("encoder.dim_feedforward", "decoder.dim_feedforward"),
    )
    dropout: float = 0.0
    num_queries: int = NUM_QUERIES
    num_points: int | Sequence[int] = option(4, hf="decoder_n_points", where="decoder.num_points")
    encoder_expansion: float = 1.0
    depth_mult: float = 1.0
    num_denoising: int = 100
    label_noise_ratio: float = 0.5
    box_noise_scale: float = 1.0
    aux_loss: bool = True
    backbone_weights: str | None = None
    freeze_backbone_bn: bool | None = None
    peg_at: Sequence[int] | int | str = (-1,)
    peg_kernel_size: int = 3
    peg_separable: bool = False
    peg_padding: str = "zeros"
    peg_dynamic: bool = False
    peg_num_kernels: int = 4
    learned_grid: Sequence[int] = (20, 20)
    pos_interpolation: str = "bicubic"
    # the weights' defaults are the criterion's (one statement of RT-DETR's 1 / 5 / 2)
    vfl_loss_coef: float = RTDETR_WEIGHTS["loss_vfl"]
    bbox_loss_coef: float = RTDETR_WEIGHTS["loss_bbox"]
    giou_loss_coef: float = RTDETR_WEIGHTS["loss_giou"]

    def validate(self) -> None:
        """The encoding (refused before any backbone is built), the counts, the head split."""
        parse_pos_enc(self.pos_enc, type(self).ENCODINGS)
        check_counts(self.num_classes, self.num_queries, self.num_denoising)
        if self.hidden_dim % self.num_heads:
            raise ValueError(f"hidden_dim={self.hidden_dim} must be divisible by num_heads={self.num_heads}")
