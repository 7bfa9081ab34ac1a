"""``build_detr``: the public builder of model, loss and post-processor."""

from __future__ import annotations

import math
import os

from peg_core import build_position_encoding

from .backbone import build_backbone
from .criterion import SetCriterion, build_weight_dict
from .detr import DETR
from .matcher import HungarianMatcher
from .postprocess import PostProcess
from .transformer import Transformer

__all__ = ["POS_ENCODINGS", "build_detr"]

POS_ENCODINGS = ("peg", "sine", "learned", "sincos", "none")


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
    nheads: int = 8,
    enc_layers: int = 6,
    dec_layers: int = 6,
    dim_feedforward: int = 2048,
    dropout: float = 0.1,
    pre_norm: bool = False,
    aux_loss: bool = True,
    peg_at: tuple[int, ...] = (0,),
    peg_kernel_size: int = 3,
    decoder_key_pos: str = "sine",
    learned_grid: tuple[int, int] | None = None,
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
            (added to q/k at every encoder layer) or ``none``.
        num_classes: number of class ids (COCO: 91, the largest id + 1);
            the classifier has one more output for no-object.
        num_queries: object queries.
        dilation: DC5 (dilated ``layer4``) for the bottleneck ResNets.
        backbone_weights: local ImageNet state-dict file (ResNets); a warning
            is issued when a ResNet starts from random weights.
        train_backbone: train ``layer2``-``layer4`` (ResNets) / all (tiny).
        hidden_dim, nheads, enc_layers, dec_layers, dim_feedforward, dropout,
            pre_norm: transformer sizes (DETR: 256, 8, 6, 6, 2048, 0.1, post-norm).
        aux_loss: return ``aux_outputs`` and weight their losses.
        peg_at: encoder layers after which a PEG is applied (CPVT: ``(0,)``).
        peg_kernel_size: PEG depthwise kernel (odd).
        decoder_key_pos: cross-attention key positions, ``sine`` (default, DETR's
            decoder unchanged), ``none`` or ``peg-output``; see
            :mod:`peg_detr.models.transformer` for why ``sine`` is the default.
        learned_grid: ``(H0, W0)`` of the learned table; default: the feature grid
            of an 800×1333 image at the backbone's stride.
        set_cost_class, set_cost_bbox, set_cost_giou: matching cost weights.
        bbox_loss_coef, giou_loss_coef, eos_coef: loss weights and no-object weight.
    """
    config = {k: v for k, v in locals().items() if k != "backbone_weights"}
    if pos_enc not in POS_ENCODINGS:
        raise ValueError(f"unknown pos_enc {pos_enc!r}; choose from {POS_ENCODINGS}")
    if num_classes < 1 or num_queries < 1:
        raise ValueError(f"num_classes={num_classes} and num_queries={num_queries} must be >= 1")
    joiner = build_backbone(backbone, train_backbone, dilation, backbone_weights)

    pos = None
    pegs = None
    if pos_enc == "peg":
        peg_at = (peg_at,) if isinstance(peg_at, int) else tuple(int(i) for i in peg_at)
        if not peg_at:
            raise ValueError("pos_enc='peg' needs at least one encoder layer in peg_at")
        pegs = {i: build_position_encoding("peg", hidden_dim, kernel_size=peg_kernel_size) for i in peg_at}
    elif pos_enc == "learned":
        if learned_grid is None:
            learned_grid = (math.ceil(800 / joiner.stride), math.ceil(1333 / joiner.stride))
        pos = build_position_encoding("learned", hidden_dim, grid_size=tuple(learned_grid), apply_to="qk")
    elif pos_enc in ("sine", "sincos"):
        pos = build_position_encoding(pos_enc, hidden_dim, apply_to="qk")

    transformer = Transformer(
        d_model=hidden_dim,
        nhead=nheads,
        num_encoder_layers=enc_layers,
        num_decoder_layers=dec_layers,
        dim_feedforward=dim_feedforward,
        dropout=dropout,
        pre_norm=pre_norm,
        pos=pos,
        pegs=pegs,
        decoder_key_pos=decoder_key_pos,
    )
    model = DETR(joiner, transformer, num_classes, num_queries, aux_loss)
    # Every setting but the weights file, json-safe, so a checkpoint can be rebuilt (predict / resume).
    config["peg_at"] = [config["peg_at"]] if isinstance(config["peg_at"], int) else list(config["peg_at"])
    config["learned_grid"] = None if learned_grid is None else list(learned_grid)
    model.build_config = config

    matcher = HungarianMatcher(set_cost_class, set_cost_bbox, set_cost_giou)
    weight_dict = build_weight_dict(1.0, bbox_loss_coef, giou_loss_coef, dec_layers - 1 if aux_loss else 0)
    criterion = SetCriterion(num_classes, matcher, weight_dict, eos_coef)
    return model, criterion, PostProcess()
