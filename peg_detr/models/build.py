"""``build_detr``: the public builder of model, loss and post-processor."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import replace

from peg_core.peg import resolve_peg_at
from peg_core.registry import EncodingContext, EncodingSupport, parse_pos_enc

from .backbone import build_backbone
from .criterion import SetCriterion, build_weight_dict
from .detr import DETR
from .matcher import HungarianMatcher
from .postprocess import PostProcess
from .transformer import Transformer

__all__ = ["DETR_ENCODINGS", "build_detr"]

#: What the DETR encoder builds from a ``pos_enc`` (:mod:`peg_core.registry`): a table on every
#: layer's queries and keys, PEGs (or another conditional encoding) after the layers of ``peg_at``,
#: a rotary encoding or an attention bias of every layer's logits; one of them, or a conditional
#: encoding with a rotary one or with an attention bias.
DETR_ENCODINGS = EncodingSupport(
    "the DETR encoder", 2, slots=("table", "conditional", "rotary", "bias"),
    combos=(("conditional", "rotary"), ("conditional", "bias")), examples=("peg+rope-mixed", "peg+alibi-2d"),
)  # fmt: skip


def _peg_at_value(peg_at: Sequence[int] | int | str) -> list[int] | str:
    """``peg_at`` as stored in the json-safe config: ``"all"`` or a list of layer indices."""
    if isinstance(peg_at, str):
        return peg_at
    return [int(peg_at)] if isinstance(peg_at, int) else [int(i) for i in peg_at]


def build_detr(
    backbone: str = "resnet50",
    pos_enc: str = "peg",
    num_classes: int = 91,
    num_queries: int = 100,
    dilation: bool = False,
    *,
    backbone_weights: str | os.PathLike | None = None,
    train_backbone: bool = True,
    hidden_dim: int = 256,
    num_heads: int = 8,
    enc_layers: int = 6,
    dec_layers: int = 6,
    dim_feedforward: int = 2048,
    dropout: float = 0.1,
    pre_norm: bool = False,
    aux_loss: bool = True,
    peg_at: Sequence[int] | int | str = (0,),
    peg_kernel_size: int = 3,
    peg_separable: bool = False,
    peg_padding: str = "zeros",
    peg_dynamic: bool = False,
    peg_num_kernels: int = 4,
    decoder_key_pos: str = "sine",
    learned_grid: tuple[int, int] | None = None,
    pos_interpolation: str = "bicubic",
    set_cost_class: float = 1.0,
    set_cost_bbox: float = 5.0,
    set_cost_giou: float = 2.0,
    bbox_loss_coef: float = 5.0,
    giou_loss_coef: float = 2.0,
    eos_coef: float = 0.1,
) -> tuple[DETR, SetCriterion, PostProcess]:
    """Build DETR with the chosen encoder position encoding; returns ``(model, criterion, postprocessor)``.

    The three are returned separately (not attached to the model) so the model's
    state dict holds only detector weights, exactly the official DETR keys for
    ``backbone="resnet50", pos_enc="sine", num_classes=91``, and so
    DistributedDataParallel wraps the model alone.

    Args:
        backbone: ``resnet50`` / ``resnet101`` / ``resnet18`` (stride 32,
            16 with ``dilation``) or ``tiny`` (stride 16, for demos and tests).
        pos_enc: encoder position encoding: ``peg`` (PEG after the encoder
            layers in ``peg_at``), ``sine`` (DETR), ``learned``, ``sincos``
            (added to q/k at every encoder layer), ``none``, a rotary encoding
            ``rope-axial`` / ``rope-mixed`` / ``rope-dinov3`` (q/k rotated per head in every
            encoder self-attention, :func:`peg_core.rope.build_rope`'s defaults; mixed: one
            set of frequencies per encoder layer and head, key ``transformer.encoder.rope.freqs``)
            or ``peg+rope-axial`` / ``peg+rope-mixed`` (both), an attention bias ``alibi-2d`` /
            ``fire`` / ``lookhere`` (:mod:`peg_core.bias`, added to every encoder self-attention's logits; FIRE's
            MLP under ``transformer.encoder.attn_bias``) or ``peg+alibi-2d`` / ``peg+fire``.
        num_classes: number of class ids (COCO: 91, the largest id + 1);
            the classifier has one more output for no-object.
        num_queries: object queries.
        dilation: DC5 (dilated ``layer4``) for the bottleneck ResNets.
        backbone_weights: local ImageNet state-dict file (ResNets); a warning
            is issued when a ResNet starts from random weights.
        train_backbone: train ``layer2``-``layer4`` (ResNets) / all (tiny).
        hidden_dim, num_heads, enc_layers, dec_layers, dim_feedforward, dropout,
            pre_norm: transformer sizes (DETR: 256, 8, 6, 6, 2048, 0.1, post-norm).
        aux_loss: return ``aux_outputs`` and weight their losses.
        peg_at: where the PEGs go, as in every model of the suite
            (:func:`peg_core.peg.resolve_peg_at`): ``i`` after encoder layer ``i``
            (CPVT: ``(0,)``), ``-1`` on the encoder input before layer 0, ``"all"``
            after every layer.
        peg_kernel_size, peg_separable, peg_padding, peg_dynamic, peg_num_kernels:
            :class:`peg_core.PEG2d`'s depthwise kernel (odd), 1xk + kx1 factorisation,
            border (``zeros`` / ``circular`` / ``replicate``) and dynamic kernel bank.
        decoder_key_pos: cross-attention key positions, ``sine`` (default, DETR's
            decoder unchanged), ``none`` or ``peg-output``; see
            :mod:`peg_detr.models.transformer` for why ``sine`` is the default (with a
            rotary encoder too).
        learned_grid: ``(H0, W0)`` of the learned table; default: the feature grid
            of an 800×1333 image at the backbone's stride.
        pos_interpolation: how the learned table is resized to each image's feature
            grid (``nearest`` / ``bilinear`` / ``bicubic`` / ``area``).
        set_cost_class, set_cost_bbox, set_cost_giou: matching cost weights.
        bbox_loss_coef, giou_loss_coef, eos_coef: loss weights and no-object weight.
    """
    config = {k: v for k, v in locals().items() if k != "backbone_weights"}
    spec = parse_pos_enc(pos_enc, DETR_ENCODINGS)
    if num_classes < 1 or num_queries < 1:
        raise ValueError(f"num_classes={num_classes} and num_queries={num_queries} must be >= 1")
    joiner = build_backbone(backbone, train_backbone, dilation, backbone_weights)

    # the encoder's training grid, that of an 800x1333 image unless given (what a learned table is built for)
    grid = (
        (math.ceil(800 / joiner.stride), math.ceil(1333 / joiner.stride))
        if learned_grid is None
        else learned_grid
    )
    ctx = EncodingContext(hidden_dim, tuple(grid), apply_to="qk", interpolation=pos_interpolation)
    pos = None
    pegs = None
    peg_at = _peg_at_value(peg_at)
    if spec.conditional is not None:
        peg_options = dict(kernel_size=peg_kernel_size, separable=peg_separable, padding_mode=peg_padding,
                           dynamic=peg_dynamic, num_kernels=peg_num_kernels)  # fmt: skip
        pegs = {
            i: spec.conditional.build(replace(ctx, options=peg_options))
            for i in resolve_peg_at(peg_at, enc_layers)
        }
    elif spec.table is not None:
        learned_grid = grid  # recorded in the config: the table's grid
        pos = spec.table.build(ctx)
    if (spec.rotary or spec.bias) and hidden_dim % num_heads:
        raise ValueError(f"hidden_dim={hidden_dim} must be divisible by num_heads={num_heads}")
    # rotary and bias encodings work per head: their context is the head's
    head = replace(ctx, dim=hidden_dim // num_heads, num_heads=num_heads, depth=enc_layers)
    rope = spec.rotary.build(head) if spec.rotary is not None else None
    attn_bias = spec.bias.build(head) if spec.bias is not None else None

    transformer = Transformer(
        d_model=hidden_dim,
        nhead=num_heads,
        num_encoder_layers=enc_layers,
        num_decoder_layers=dec_layers,
        dim_feedforward=dim_feedforward,
        dropout=dropout,
        pre_norm=pre_norm,
        pos=pos,
        pegs=pegs,
        decoder_key_pos=decoder_key_pos,
        rope=rope,
        attn_bias=attn_bias,
    )
    model = DETR(joiner, transformer, num_classes, num_queries, aux_loss)
    # Every setting but the weights file, json-safe, so a checkpoint can be rebuilt (predict / resume).
    config["peg_at"] = peg_at
    config["learned_grid"] = None if learned_grid is None else list(learned_grid)
    model.build_config = config

    matcher = HungarianMatcher(set_cost_class, set_cost_bbox, set_cost_giou)
    weight_dict = build_weight_dict(1.0, bbox_loss_coef, giou_loss_coef, dec_layers - 1 if aux_loss else 0)
    criterion = SetCriterion(num_classes, matcher, weight_dict, eos_coef)
    return model, criterion, PostProcess()
