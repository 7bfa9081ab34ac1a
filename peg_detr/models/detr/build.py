"""``build_detr``: DETR's model, loss and post-processor from its :class:`~.config.DETRConfig`."""

from __future__ import annotations

import math
from typing import Any

from peg_core.registry import EncodingContext, build_encoding_parts, parse_pos_enc

from ..matcher import HungarianMatcher
from .backbone import build_backbone
from .config import DETR_ENCODINGS, DETRConfig
from .criterion import SetCriterion, build_weight_dict
from .model import DETR
from .postprocess import PostProcess
from .transformer import Transformer

__all__ = ["DETR_ENCODINGS", "DETRConfig", "build_detr"]


def build_detr(
    config: DETRConfig | str | None = None, pos_enc: str | None = None, /, **overrides: Any
) -> tuple[DETR, SetCriterion, PostProcess]:
    """DETR of ``config`` (:class:`DETRConfig`); returns ``(model, criterion, postprocessor)``.

    The three are returned separately (not attached to the model) so the model's
    state dict holds only detector weights, exactly the official DETR keys for
    ``backbone="resnet50", pos_enc="sine", num_classes=91``, and so
    DistributedDataParallel wraps the model alone.  ``overrides`` replace the config's fields; the
    keyword form ``build_detr("resnet50", pos_enc="peg")`` (backbone and encoding first) builds the
    config of the keywords.  A bad setting is a ``ValueError``.
    """
    cfg = DETRConfig.resolve(config, pos_enc, overrides)
    spec = parse_pos_enc(cfg.pos_enc, DETR_ENCODINGS)
    joiner = build_backbone(cfg.backbone, cfg.train_backbone, cfg.dilation, cfg.backbone_weights)

    # the encoder's training grid, that of an 800x1333 image unless given (what a learned table is built for)
    grid = (
        (math.ceil(800 / joiner.stride), math.ceil(1333 / joiner.stride))
        if cfg.learned_grid is None
        else tuple(cfg.learned_grid)
    )
    ctx = EncodingContext(cfg.hidden_dim, tuple(grid), apply_to="qk", interpolation=cfg.pos_interpolation,
                          num_heads=cfg.num_heads, depth=cfg.enc_layers, peg=cfg.peg_options())  # fmt: skip
    # the parts in the order their parameters were always drawn from the RNG in (seeded runs keep
    # their weights); the rotary and bias parts get the head's context (dim // heads)
    parts = build_encoding_parts(
        spec, ctx, peg_at=cfg.peg_at, order=("conditional", "table", "rotary", "bias")
    )
    if parts.table is not None:
        cfg = cfg.replace(learned_grid=list(grid))  # recorded in the config: the table's grid

    transformer = Transformer(
        d_model=cfg.hidden_dim, nhead=cfg.num_heads, num_encoder_layers=cfg.enc_layers,
        num_decoder_layers=cfg.dec_layers, dim_feedforward=cfg.dim_feedforward, dropout=cfg.dropout,
        pre_norm=cfg.pre_norm, decoder_key_pos=cfg.decoder_key_pos,
        pos=parts.table, pegs=parts.pegs, rope=parts.rotary, attn_bias=parts.bias,
    )  # fmt: skip
    model = DETR(joiner, transformer, cfg.num_classes, cfg.num_queries, cfg.aux_loss)
    # every setting but the weights file, json-safe, so a checkpoint can be rebuilt (predict / resume)
    model.build_config = cfg.to_dict()

    matcher = HungarianMatcher(cfg.set_cost_class, cfg.set_cost_bbox, cfg.set_cost_giou)
    aux_layers = cfg.dec_layers - 1 if cfg.aux_loss else 0
    weight_dict = build_weight_dict(1.0, cfg.bbox_loss_coef, cfg.giou_loss_coef, aux_layers)
    criterion = SetCriterion(cfg.num_classes, matcher, weight_dict, cfg.eos_coef)
    return model, criterion, PostProcess()
