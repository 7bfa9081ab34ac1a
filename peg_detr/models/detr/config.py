"""``DETRConfig``: DETR's settings, one typed source (defaults: DETR-R50 with a PEG after encoder layer 0).

:func:`~peg_detr.models.detr.build.build_detr` builds it; its
:meth:`~peg_detr.models.config.DetectorConfig.to_dict` is the checkpoint's ``model_config`` (with
``backbone="resnet50", pos_enc="sine", num_classes=91`` the model's state dict has exactly the
official DETR keys).  :data:`DETR_ENCODINGS` says what ``pos_enc`` may be.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from peg_core.registry import EncodingSupport, parse_pos_enc

from ..config import DetectorConfig, option
from ..matcher import DETR_COSTS
from .transformer import DECODER_KEY_POS

__all__ = ["DETR_ENCODINGS", "DETRConfig"]

#: What the DETR encoder builds from a ``pos_enc`` (:mod:`peg_core.registry`): a table on every
#: layer's queries and keys, PEGs (or another conditional encoding) after the layers of ``peg_at``,
#: a rotary encoding or an attention bias of every layer's logits; one of them, or a conditional
#: encoding with a rotary one or with an attention bias.
DETR_ENCODINGS = EncodingSupport(
    "the DETR encoder", 2, slots=("table", "conditional", "rotary", "bias"),
    combos=(("conditional", "rotary"), ("conditional", "bias")), examples=("peg+rope-mixed", "peg+alibi-2d"),
)  # fmt: skip


@dataclass(kw_only=True)
class DETRConfig(DetectorConfig):
    """DETR with the chosen encoder position encoding.

    Attributes:
        backbone: ``resnet50`` / ``resnet101`` / ``resnet18`` (stride 32, 16 with ``dilation``) or
            ``tiny`` (stride 16, for demos and tests).
        pos_enc: encoder position encoding: ``peg`` (PEG after the encoder layers in ``peg_at``),
            ``sine`` (DETR), ``learned``, ``sincos`` (added to q/k at every encoder layer), ``none``, a
            rotary encoding ``rope-axial`` / ``rope-mixed`` / ``rope-dinov3`` (q/k rotated per head in
            every encoder self-attention, :func:`peg_core.rope.build_rope`'s defaults; mixed: one set of
            frequencies per encoder layer and head, key ``transformer.encoder.rope.freqs``) or
            ``peg+rope-axial`` / ``peg+rope-mixed`` (both), an attention bias ``alibi-2d`` / ``fire`` /
            ``lookhere`` (:mod:`peg_core.bias`, added to every encoder self-attention's logits; FIRE's
            MLP under ``transformer.encoder.attn_bias``) or ``peg+alibi-2d`` / ``peg+fire``.
        num_classes: number of class ids (COCO: 91, the largest id + 1); the classifier has one
            more output for no-object.
        num_queries: object queries.
        dilation: DC5 (dilated ``layer4``) for the bottleneck ResNets.
        backbone_weights: local ImageNet state-dict file (ResNets; not stored); a warning is issued
            when a ResNet starts from random weights.
        train_backbone: train ``layer2``-``layer4`` (ResNets) / all (tiny).
        hidden_dim, num_heads, enc_layers, dec_layers, dim_feedforward, dropout, pre_norm:
            transformer sizes (DETR: 256, 8, 6, 6, 2048, 0.1, post-norm).
        aux_loss: return ``aux_outputs`` and weight their losses.
        peg_at: where the PEGs go, as in every model of the suite (:func:`peg_core.peg.resolve_peg_at`):
            ``i`` after encoder layer ``i`` (CPVT: ``(0,)``), ``-1`` on the encoder input before layer
            0, ``"all"`` after every layer.
        peg_kernel_size, peg_separable, peg_padding, peg_dynamic, peg_num_kernels:
            :class:`peg_core.PEG2d`'s depthwise kernel (odd), 1xk + kx1 factorisation, border
            (``zeros`` / ``circular`` / ``replicate``) and dynamic kernel bank.
        decoder_key_pos: cross-attention key positions, ``sine`` (default, DETR's decoder
            unchanged), ``none`` or ``peg-output``; see :mod:`peg_detr.models.detr.transformer` for
            why ``sine`` is the default (with a rotary encoder too).
        learned_grid: ``(H0, W0)`` of the learned table; default (None): the feature grid of an
            800x1333 image at the backbone's stride (the built model records the grid).
        pos_interpolation: how the learned table is resized to each image's feature grid
            (``nearest`` / ``bilinear`` / ``bicubic`` / ``area``).
        set_cost_class, set_cost_bbox, set_cost_giou: matching cost weights.
        bbox_loss_coef, giou_loss_coef, eos_coef: loss weights and no-object weight.
    """

    TITLE = "DETR"
    ENCODINGS: ClassVar[EncodingSupport] = DETR_ENCODINGS

    backbone: str = option("resnet50", flag="--backbone", hf="backbone", shared=True)
    pos_enc: str = "peg"
    num_classes: int = 91
    num_queries: int = 100
    dilation: bool = option(False, flag="--dilation", hf="dilation", shared=True)
    backbone_weights: str | None = None
    train_backbone: bool = True
    hidden_dim: int = option(256, hf="d_model")
    num_heads: int = option(8, hf=("encoder_attention_heads", "decoder_attention_heads"))
    enc_layers: int = 6
    dec_layers: int = 6
    dim_feedforward: int = option(2048, hf=("encoder_ffn_dim", "decoder_ffn_dim"))
    dropout: float = 0.1
    pre_norm: bool = False
    # transformers' auxiliary_loss is another computation (module docstring of peg_detr.interop.hf_detr)
    aux_loss: bool = option(True, hf=None)
    peg_at: Sequence[int] | int | str = (0,)
    peg_kernel_size: int = 3
    peg_separable: bool = False
    peg_padding: str = "zeros"
    peg_dynamic: bool = False
    peg_num_kernels: int = 4
    decoder_key_pos: str = option(
        "sine", flag="--decoder-key-pos", choices=DECODER_KEY_POS, help="cross-attention key positions"
    )
    learned_grid: Sequence[int] | None = None
    pos_interpolation: str = "bicubic"
    set_cost_class: float = DETR_COSTS.cls
    set_cost_bbox: float = DETR_COSTS.bbox
    set_cost_giou: float = DETR_COSTS.giou
    bbox_loss_coef: float = 5.0
    giou_loss_coef: float = 2.0
    eos_coef: float = 0.1

    def validate(self) -> None:
        """The encoding, the counts, the head split of a rotary or bias encoding."""
        spec = parse_pos_enc(self.pos_enc, type(self).ENCODINGS)
        if self.num_classes < 1 or self.num_queries < 1:
            raise ValueError(
                f"num_classes={self.num_classes} and num_queries={self.num_queries} must be >= 1"
            )
        if (spec.rotary or spec.bias) and self.hidden_dim % self.num_heads:
            raise ValueError(f"hidden_dim={self.hidden_dim} must be divisible by num_heads={self.num_heads}")
