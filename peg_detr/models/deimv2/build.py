"""``build_deimv2``: DEIMv2's model (and post-processor, and D-FINE's criterion) from its :class:`~.config.DEIMv2Config`.

``backbone`` names a DINOv3 ViT (:data:`~peg_detr.models.deimv2.backbone.DINOV3_VITS`: DEIMv2's
S / M / L backbones, with the STA and the hybrid encoder) or an HGNetv2 (``hgnetv2_*``, from
:mod:`peg_detr.models.dfine.backbone`; the lite encoder for one map, the hybrid one for two).
:data:`~.config.DEIMV2_SIZES` holds the published sizes' settings; ``build_deimv2(DEIMv2Config.preset("s"))``
builds DEIMv2-S.  ``model.build_config`` records every setting, so a checkpoint rebuilds the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..common import coef_weights
from ..dfine.backbone import build_hgnetv2
from ..dfine.build import dfine_criterion_parts
from ..dfine.criterion import DFINE_WEIGHTS, DFineCriterion
from ..rtdetr.build import detector_options
from ..rtdetr.postprocess import RTDETRPostProcess
from .backbone import DINOV3_VITS, build_dinov3_sta
from .config import DEIMV2_LOSSES, DEIMV2_SIZES, DEIMv2Config
from .decoder import DEIMv2Decoder, DEIMv2DecoderSpec
from .encoder import DEIMv2HybridEncoder, LiteEncoder
from .model import DEIMv2

__all__ = ["DEIMV2_LOSSES", "DEIMV2_SIZES", "DEIMv2Config", "build_deimv2", "deimv2_training_parts"]


def build_deimv2(
    config: DEIMv2Config | str | None = None, pos_enc: str | None = None, /, **overrides: Any
) -> tuple[DEIMv2, DFineCriterion, RTDETRPostProcess]:
    """DEIMv2 of ``config`` (:class:`DEIMv2Config`); returns ``(model, criterion, postprocessor)``.

    ``build_deimv2(DEIMv2Config.preset("s"))``; ``overrides`` replace the config's fields, and the
    keyword form ``build_deimv2("vit_tiny", "peg", hidden_dim=32)`` (backbone and encoding first)
    builds the config of the keywords.  A bad setting is a ``ValueError``.
    """
    cfg = DEIMv2Config.resolve(config, pos_enc, overrides)
    in_channels = None
    if cfg.backbone in DINOV3_VITS:
        net = build_dinov3_sta(
            cfg.backbone, hidden_dim=cfg.hidden_dim, out_indices=cfg.vit_out_indices, sta_inplanes=cfg.sta_inplanes,
            layer_scale=cfg.vit_layer_scale, apply_layernorm=cfg.vit_apply_layernorm, final_norm=cfg.vit_final_norm,
            drop_path_rate=cfg.drop_path_rate, batch_norm_eps=cfg.batch_norm_eps, **(cfg.vit_options or {}),
        )  # fmt: skip
        levels = 3
    else:  # hgnetv2_* (validated); "hgnetv2_custom": the layout in hgnet_options
        net = build_hgnetv2(
            None if cfg.backbone == "hgnetv2_custom" else cfg.backbone, return_idx=list(cfg.hgnet_return_idx),
            freeze_bn=cfg.freeze_backbone_bn, **(cfg.hgnet_options or {}),
        )  # fmt: skip
        levels = len(net.out_channels) + (1 if cfg.encoder == "lite" else 0)
        in_channels = net.out_channels
    if cfg.encoder == "hybrid":
        enc = DEIMv2HybridEncoder(
            levels, cfg.hidden_dim, in_channels=in_channels, num_heads=cfg.num_heads,
            dim_feedforward=cfg.enc_dim_feedforward, dropout=cfg.dropout, expansion=cfg.encoder_expansion,
            depth_mult=cfg.depth_mult, num_layers=cfg.enc_layers, pos_enc=cfg.pos_enc, fuse_op=cfg.fuse_op,
            trailing_conv=cfg.trailing_conv, peg_at=cfg.peg_at, peg_kernel_size=cfg.peg_kernel_size,
            use_encoder_idx=cfg.use_encoder_idx, temperature=cfg.temperature, layer_norm_eps=cfg.layer_norm_eps,
            batch_norm_eps=cfg.batch_norm_eps,
        )  # fmt: skip
    else:
        enc = LiteEncoder(
            net.out_channels, cfg.hidden_dim, expansion=cfg.encoder_expansion, depth_mult=cfg.depth_mult,
            trailing_conv=cfg.trailing_conv, batch_norm_eps=cfg.batch_norm_eps,
        )  # fmt: skip
    # the decoder's fields as their declarations (Option.where) say; besides them the queries
    decoder_spec = DEIMv2DecoderSpec(
        in_channels=[cfg.hidden_dim] * levels, num_queries=cfg.num_queries, **cfg.part_options("decoder")
    )
    decoder = DEIMv2Decoder(cfg.num_classes, decoder_spec)
    model = DEIMv2(net, enc, decoder, **detector_options(cfg))
    model.build_config = cfg.to_dict()
    weights = coef_weights(cfg, "mal", "bbox", "giou", "fgl", "ddf")
    criterion, post = deimv2_training_parts(
        model, weights, losses=tuple(cfg.losses), alpha=cfg.focal_alpha, gamma=cfg.focal_gamma,
        mal_alpha=cfg.mal_alpha, use_uni_set=cfg.use_uni_set,
    )  # fmt: skip
    return model, criterion, post


def deimv2_training_parts(
    model: DEIMv2,
    weights: Mapping[str, float] = DFINE_WEIGHTS,
    *,
    losses: tuple[str, ...] = DEIMV2_LOSSES,
    alpha: float = 0.75,
    gamma: float = 2.0,
    mal_alpha: float | None = None,
    use_uni_set: bool = True,
) -> tuple[DFineCriterion, RTDETRPostProcess]:
    """D-FINE's criterion with DEIMv2's losses and weights (matcher costs 2 / 5 / 2, focal), and the post-processor.

    ``weights``: ``loss key -> weight`` (keys it lacks: DEIMv2's, which are D-FINE's
    :data:`~peg_detr.models.dfine.criterion.DFINE_WEIGHTS`: MAL 1, L1 5, GIoU 2, FGL 0.15, DDF 1.5).
    """
    return dfine_criterion_parts(
        model, weights, losses, alpha=alpha, gamma=gamma, mal_alpha=mal_alpha, use_uni_set=use_uni_set
    )
