"""``build_rtdetr``: RT-DETR's model, loss and post-processor from its :class:`~.config.RTDETRConfig`.

The same contract as :func:`peg_detr.models.build_detr`: three objects returned separately (the
model's state dict holds only detector weights; DDP wraps the model alone) and
``model.build_config`` the config's :meth:`~peg_detr.models.config.DetectorConfig.to_dict` (every
setting but the weights file), so a checkpoint rebuilds exactly the trained model
(``peg_detr.archs.ARCHS["rtdetr"]``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from peg_core.interop.io import load_state_strict, read_state_file

from ..common import coef_weights
from ..config import DetectorConfig
from .backbone import RESNET_VD, ResNetVd, build_resnet_vd
from .config import RTDETRConfig
from .criterion import RTDETR_WEIGHTS, RTDETRCriterion, build_rtdetr_weight_dict
from .decoder import RTDETRDecoder, RTDETRDecoderSpec
from .encoder import HybridEncoder
from .model import RTDETR
from .postprocess import RTDETRPostProcess

__all__ = [
    "DETECTOR_FIELDS",
    "RTDETR_BACKBONES",
    "RTDETRConfig",
    "build_rtdetr",
    "detector_options",
    "rtdetr_training_parts",
]

#: RT-DETR freezes the BatchNorms of its bottleneck backbones only (``freeze_norm`` in its configs)
_FROZEN_BN_BY_DEFAULT = ("r50vd", "r101vd")
#: the config fields :class:`RTDETR` (and its subclasses) take as keywords (:func:`detector_options`)
DETECTOR_FIELDS = (
    "num_classes",
    "num_queries",
    "num_denoising",
    "label_noise_ratio",
    "box_noise_scale",
    "aux_loss",
)
#: the backbones ``build_rtdetr`` takes (:data:`~peg_detr.models.rtdetr.backbone.RESNET_VD`)
RTDETR_BACKBONES = tuple(RESNET_VD)


def _backbone(name: str, freeze_bn: bool | None, weights: str | os.PathLike | None) -> ResNetVd:
    """The ResNet-vd of ``name``, with ImageNet weights from a local file when given."""
    if name not in RESNET_VD:
        raise ValueError(f"unknown RT-DETR backbone {name!r}; choose from {RTDETR_BACKBONES}")
    frozen = name in _FROZEN_BN_BY_DEFAULT if freeze_bn is None else freeze_bn
    net = build_resnet_vd(name, freeze_bn=frozen)
    if weights is not None:
        if name == "tiny":
            raise ValueError("the 'tiny' backbone has no pretrained weights; drop backbone_weights")
        load_state_strict(net, read_state_file(weights, what="backbone weights"), weights)
    return net


def build_rtdetr(
    config: RTDETRConfig | str | None = None, pos_enc: str | None = None, /, **overrides: Any
) -> tuple[RTDETR, RTDETRCriterion, RTDETRPostProcess]:
    """RT-DETR of ``config`` (:class:`RTDETRConfig`); returns ``(model, criterion, postprocessor)``.

    ``build_rtdetr(RTDETRConfig(backbone="r18vd", dec_layers=3))``; ``overrides`` replace the config's
    fields, and the keyword form ``build_rtdetr("tiny", "peg", hidden_dim=32)`` (backbone and
    encoding first) builds the config of the keywords.  A bad setting is a ``ValueError``.
    """
    cfg = RTDETRConfig.resolve(config, pos_enc, overrides)
    net = _backbone(cfg.backbone, cfg.freeze_backbone_bn, cfg.backbone_weights)
    encoder = HybridEncoder(
        net.out_channels, cfg.hidden_dim, num_heads=cfg.num_heads, dim_feedforward=cfg.dim_feedforward,
        dropout=cfg.dropout, expansion=cfg.encoder_expansion, depth_mult=cfg.depth_mult, num_layers=cfg.enc_layers,
        pos_enc=cfg.pos_enc, peg_at=cfg.peg_at, peg=cfg.peg_options(),
                learned_grid=tuple(cfg.learned_grid), pos_interpolation=cfg.pos_interpolation,
    )  # fmt: skip
    # the decoder's fields as their declarations (Option.where) say; besides them the queries and the
    # dropout (one value, declared as the encoder's: transformers has one field)
    decoder_spec = RTDETRDecoderSpec(
        in_channels=[cfg.hidden_dim] * 3,
        num_queries=cfg.num_queries,
        dropout=cfg.dropout,
        **cfg.part_options("decoder"),
    )
    decoder = RTDETRDecoder(cfg.num_classes, decoder_spec)
    model = RTDETR(net, encoder, decoder, **detector_options(cfg))
    model.build_config = cfg.to_dict()
    return model, *rtdetr_training_parts(model, coef_weights(cfg, "vfl", "bbox", "giou"))


def detector_options(cfg: DetectorConfig) -> dict[str, Any]:
    """:class:`RTDETR`'s keywords (classes, queries, denoising, auxiliary losses) from ``cfg``.

    RT-DETR's, D-FINE's and DEIMv2's configs share these fields, and their detectors (subclasses
    of :class:`RTDETR`) take them as they are.
    """
    return {name: getattr(cfg, name) for name in DETECTOR_FIELDS}


def rtdetr_training_parts(
    model: RTDETR, weights: Mapping[str, float] = RTDETR_WEIGHTS
) -> tuple[RTDETRCriterion, RTDETRPostProcess]:
    """The criterion and post-processor that fit a built :class:`RTDETR` (classes, layers, queries).

    ``weights``: ``loss key -> weight`` (:func:`~.criterion.build_rtdetr_weight_dict`; keys it lacks:
    RT-DETR's, :data:`~.criterion.RTDETR_WEIGHTS`).  Shared by :func:`build_rtdetr` and models built
    from a Hugging Face ``config.json`` (:func:`peg_detr.interop.hf_rtdetr.rtdetr_from_hf_config`).
    """
    dec_layers = len(model.decoder.layers)
    weight_dict = build_rtdetr_weight_dict(
        weights, dec_layers=dec_layers, aux_loss=model.aux_loss, denoising=model.num_denoising > 0
    )
    criterion = RTDETRCriterion(model.num_classes, weight_dict=weight_dict, dec_layers=dec_layers)
    return criterion, RTDETRPostProcess(num_top_queries=model.num_queries)
