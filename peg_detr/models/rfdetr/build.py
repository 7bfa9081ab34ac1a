"""``build_rfdetr``: RF-DETR's model, loss and post-processor from its :class:`~.config.RFDETRConfig`.

The contract of the other families' builders (:func:`peg_detr.models.dfine.build.build_dfine`):
three objects returned separately and ``model.build_config`` the config's stored settings, so a
checkpoint rebuilds exactly the trained model.  :func:`rfdetr_training_parts` gives the criterion
and post-processor of a model built otherwise (a Hugging Face ``config.json``:
:func:`peg_detr.interop.hf_rfdetr.rfdetr_from_hf_config`), so both get the same loss.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..common import coef_weights
from ..matcher import HungarianMatcher
from ..rtdetr.postprocess import RTDETRPostProcess
from .backbone import ScaleProjector, build_windowed_vit
from .config import RFDETR_BACKBONES, RFDETR_SIZES, RFDETRConfig
from .criterion import CLASS_KEY, RFDETR_WEIGHTS, RFDETRCriterion, build_rfdetr_weight_dict
from .decoder import RFDETRDecoder, RFDETRLayerSpec
from .model import RFDETR

__all__ = ["RFDETR_BACKBONES", "RFDETR_SIZES", "RFDETRConfig", "build_rfdetr", "rfdetr_training_parts"]


def build_rfdetr(
    config: RFDETRConfig | str | None = None, pos_enc: str | None = None, /, **overrides: Any
) -> tuple[RFDETR, RFDETRCriterion, RTDETRPostProcess]:
    """RF-DETR of ``config`` (:class:`RFDETRConfig`); returns ``(model, criterion, postprocessor)``.

    ``build_rfdetr(RFDETRConfig.preset("s"))``; ``overrides`` replace the config's fields, and the
    keyword form ``build_rfdetr("dinov2_windowed_small", "peg", hidden_dim=32)`` (backbone and
    encoding first) builds the config of the keywords.  A bad setting is a ``ValueError``.
    """
    cfg = RFDETRConfig.resolve(config, pos_enc, overrides)
    vit = build_windowed_vit(**cfg.vit_options())
    projector = ScaleProjector(
        vit.out_channels, cfg.hidden_dim, num_blocks=cfg.projector_blocks, expansion=cfg.projector_expansion,
        act=cfg.projector_act, eps=cfg.layer_norm_eps,
    )  # fmt: skip
    layer = RFDETRLayerSpec(
        cfg.num_heads, cfg.cross_heads, cfg.dim_feedforward, cfg.dropout, cfg.attention_dropout,
        cfg.decoder_activation, cfg.num_points,
    )  # fmt: skip
    decoder = RFDETRDecoder(cfg.hidden_dim, cfg.num_classes, num_queries=cfg.num_queries, group_detr=cfg.group_detr,
                            num_layers=cfg.dec_layers, layer=layer)  # fmt: skip
    model = RFDETR(vit, projector, decoder, aux_loss=cfg.aux_loss)
    model.build_config = cfg.to_dict()
    weights = {CLASS_KEY: cfg.cls_loss_coef, **coef_weights(cfg, "bbox", "giou")}
    return model, *rfdetr_training_parts(model, weights)


def rfdetr_training_parts(
    model: RFDETR, weights: Mapping[str, float] = RFDETR_WEIGHTS
) -> tuple[RFDETRCriterion, RTDETRPostProcess]:
    """RF-DETR's criterion (Group DETR matching, IA-BCE + L1 + GIoU) and post-processor for ``model``.

    ``weights``: ``loss key -> weight`` (keys it lacks: RF-DETR's / transformers' ``RfDetrConfig``'s,
    :data:`~.criterion.RFDETR_WEIGHTS`: ``loss_iabce`` 1, ``loss_bbox`` 5, ``loss_giou`` 2), copied to
    every earlier decoder layer and the encoder proposals when the model returns them
    (``model.aux_loss``).  The matcher's costs are RF-DETR's (class 2 focal with alpha 0.25 and
    gamma 2, L1 5, GIoU 2).  The post-processor keeps the ``num_queries`` best (query, class) pairs
    (rf-detr's ``num_select`` is its ``num_queries``, 300).
    """
    dec_layers = len(model.decoder.layers)
    weight_dict = build_rfdetr_weight_dict(weights, dec_layers=dec_layers, aux_loss=model.aux_loss)
    matcher = HungarianMatcher(2.0, 5.0, 2.0, focal=True, focal_alpha=0.25, focal_gamma=2.0)
    criterion = RFDETRCriterion(
        model.num_classes, matcher=matcher, weight_dict=weight_dict, dec_layers=dec_layers
    )
    return criterion, RTDETRPostProcess(num_top_queries=model.num_queries)
