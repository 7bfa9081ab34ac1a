"""``build_dfine``: D-FINE's model, loss and post-processor from its :class:`~.config.DFineConfig`.

The contract of :func:`peg_detr.models.rtdetr.build.build_rtdetr`: three objects returned
separately and ``model.build_config`` the config's stored settings (all but the weights file), so a
checkpoint rebuilds exactly the trained model.  :data:`~.config.DFINE_SIZES` holds the published
sizes (transformers' ``DFineConfig`` defaults are L's): ``build_dfine(DFineConfig.preset("s"))``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from peg_core.interop.io import load_state_strict, read_state_file

from ..common import coef_weights
from ..matcher import HungarianMatcher
from ..rtdetr.backbone import build_resnet_vd
from ..rtdetr.build import detector_options
from ..rtdetr.postprocess import RTDETRPostProcess
from .backbone import HGNETV2_BACKBONES, build_hgnetv2
from .config import CLS_LOSSES, DFINE_SIZES, DFineConfig
from .criterion import DFINE_WEIGHTS, DFineCriterion, build_dfine_weight_dict
from .decoder import DFineDecoder, DFineDecoderSpec
from .encoder import DFineHybridEncoder
from .model import DFINE

__all__ = [
    "CLS_LOSSES",
    "DFINE_BACKBONES",
    "DFINE_SIZES",
    "DFineConfig",
    "build_dfine",
    "dfine_criterion_parts",
    "dfine_training_parts",
]

#: the backbones ``build_dfine`` takes: RT-DETR's CPU-sized ResNet-vd and the HGNetv2 presets
DFINE_BACKBONES = ("tiny", *HGNETV2_BACKBONES)
#: D-FINE freezes the norms (and the stem) of its large backbones only (L: B4, X: B5)
_FROZEN_BY_DEFAULT = ("hgnetv2_b4", "hgnetv2_b5")


def _backbone(
    name: str,
    freeze_bn: bool | None,
    freeze_at: int | None,
    return_idx: Sequence[int] | None,
    weights: str | os.PathLike | None,
) -> nn.Module:
    """The backbone of ``name`` (its maps at strides 8/16/32, or those of ``return_idx``), weights from a local file."""
    if name not in DFINE_BACKBONES:
        raise ValueError(f"unknown D-FINE backbone {name!r}; choose from {DFINE_BACKBONES}")
    if name == "tiny":
        if return_idx is not None or freeze_at is not None:
            raise ValueError("the 'tiny' backbone has no return_idx / freeze_at options")
        if weights is not None:
            raise ValueError("the 'tiny' backbone has no pretrained weights; drop backbone_weights")
        return build_resnet_vd("tiny", freeze_bn=bool(freeze_bn))
    large = name in _FROZEN_BY_DEFAULT
    net = build_hgnetv2(
        name,
        freeze_bn=large if freeze_bn is None else freeze_bn,
        freeze_at=(0 if large else -1) if freeze_at is None else freeze_at,
        return_idx=(1, 2, 3) if return_idx is None else tuple(return_idx),
    )
    if weights is not None:
        state = read_state_file(weights, what="backbone weights")
        # a timm ``hgnetv2_b*`` checkpoint carries its classifier: not part of the backbone
        state = {k: v for k, v in state.items() if not k.startswith("head.")}
        load_state_strict(net, state, weights)
    return net


def build_dfine(
    config: DFineConfig | str | None = None, pos_enc: str | None = None, /, **overrides: Any
) -> tuple[DFINE, DFineCriterion, RTDETRPostProcess]:
    """D-FINE of ``config`` (:class:`DFineConfig`); returns ``(model, criterion, postprocessor)``.

    ``build_dfine(DFineConfig.preset("s"))``; ``overrides`` replace the config's fields, and the
    keyword form ``build_dfine("tiny", "peg", hidden_dim=32)`` (backbone and encoding first) builds
    the config of the keywords.  A bad setting is a ``ValueError``.
    """
    cfg = DFineConfig.resolve(config, pos_enc, overrides)
    enc_dim = cfg.hidden_dim if cfg.encoder_hidden_dim is None else cfg.encoder_hidden_dim
    net = _backbone(cfg.backbone, cfg.freeze_backbone_bn, cfg.backbone_freeze_at, cfg.backbone_return_idx,
                    cfg.backbone_weights)  # fmt: skip
    levels = len(net.out_channels)
    encoder = DFineHybridEncoder(
        net.out_channels, enc_dim, num_heads=cfg.num_heads,
        dim_feedforward=cfg.dim_feedforward if cfg.encoder_dim_feedforward is None else cfg.encoder_dim_feedforward,
        dropout=cfg.dropout, expansion=cfg.encoder_expansion, depth_mult=cfg.depth_mult, num_layers=cfg.enc_layers,
        use_encoder_idx=(levels - 1,), pos_enc=cfg.pos_enc, peg_at=cfg.peg_at, peg=cfg.peg_options(),
        learned_grid=tuple(cfg.learned_grid), pos_interpolation=cfg.pos_interpolation,
    )  # fmt: skip
    # the decoder's fields as their declarations (Option.where) say; besides them the queries and the
    # dropout (one value, declared as the encoder's: transformers has one field)
    decoder_spec = DFineDecoderSpec(
        in_channels=[enc_dim] * levels,
        num_queries=cfg.num_queries,
        dropout=cfg.dropout,
        **cfg.part_options("decoder"),
    )
    decoder = DFineDecoder(cfg.num_classes, decoder_spec)
    model = DFINE(net, encoder, decoder, **detector_options(cfg))
    model.build_config = cfg.to_dict()
    # the config's vfl_loss_coef weighs whichever class loss cls_loss picks
    weights = {f"loss_{cfg.cls_loss}": cfg.vfl_loss_coef, **coef_weights(cfg, "bbox", "giou", "fgl", "ddf")}
    return model, *dfine_training_parts(
        model, weights, cls_loss=cfg.cls_loss, cls_loss_gamma=cfg.cls_loss_gamma
    )


def dfine_training_parts(
    model: DFINE,
    weights: Mapping[str, float] = DFINE_WEIGHTS,
    *,
    cls_loss: str = "vfl",
    cls_loss_gamma: float | None = None,
) -> tuple[DFineCriterion, RTDETRPostProcess]:
    """The criterion (D-FINE's matcher costs 2 / 5 / 2, focal) and post-processor that fit a built :class:`DFINE`.

    Shared by :func:`build_dfine` and models built from a Hugging Face ``config.json``
    (:func:`peg_detr.interop.hf_dfine.dfine_from_hf_config`).  ``cls_loss``: ``vfl`` (D-FINE's
    ``losses``), ``mal`` (DEIM's matchability-aware loss, gamma 1.5 unless ``cls_loss_gamma``) or
    ``focal``; ``weights``: ``loss key -> weight`` (keys it lacks: :data:`~.criterion.DFINE_WEIGHTS`').
    """
    if cls_loss not in CLS_LOSSES:
        raise ValueError(f"cls_loss must be one of {CLS_LOSSES}; got {cls_loss!r}")
    gamma = cls_loss_gamma if cls_loss_gamma is not None else 1.5 if cls_loss == "mal" else 2.0
    return dfine_criterion_parts(model, weights, (cls_loss, "boxes", "local"), gamma=gamma)


def dfine_criterion_parts(
    model: DFINE, weights: Mapping[str, float], losses: tuple[str, ...], **criterion_options: Any
) -> tuple[DFineCriterion, RTDETRPostProcess]:
    """D-FINE's criterion for a built :class:`DFINE` (or DEIMv2) and the post-processor.

    ``weights``: :func:`build_dfine_weight_dict`'s loss weights, repeated for the model's layers,
    proposals and denoising queries; the matcher is D-FINE's (costs 2 / 5 / 2, focal);
    ``criterion_options``: :class:`DFineCriterion`'s other keywords (``alpha``, ``gamma``...).
    Shared by D-FINE's and DEIMv2's training parts, which differ only in losses and weights.
    """
    dec_layers = len(model.decoder.layers)
    weight_dict = build_dfine_weight_dict(
        weights, losses=losses, dec_layers=dec_layers, aux_loss=model.aux_loss, denoising=model.num_denoising > 0,
    )  # fmt: skip
    matcher = HungarianMatcher(2.0, 5.0, 2.0, focal=True, focal_alpha=0.25, focal_gamma=2.0)
    criterion = DFineCriterion(
        model.num_classes, matcher=matcher, weight_dict=weight_dict, losses=losses,
        reg_max=model.decoder.max_num_bins, dec_layers=dec_layers, **criterion_options,
    )  # fmt: skip
    return criterion, RTDETRPostProcess(num_top_queries=model.num_queries)
