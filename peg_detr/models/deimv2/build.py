"""``build_deimv2``: DEIMv2's model (and post-processor, and D-FINE's criterion) from json-safe keywords.

``backbone`` names a DINOv3 ViT (:data:`~peg_detr.models.deimv2.backbone.DINOV3_VITS`: DEIMv2's
S / M / L backbones, with the STA and the hybrid encoder) or an HGNetv2 (``hgnetv2_*``, from
:mod:`peg_detr.models.dfine.backbone`; the lite encoder for one map, the hybrid one for two).
:data:`DEIMV2_SIZES` holds the published sizes' settings; ``build_deimv2(**DEIMV2_SIZES["s"])``
builds DEIMv2-S.  ``model.build_config`` records every keyword, so a checkpoint rebuilds the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from peg_core.registry import parse_pos_enc

from ..dfine.backbone import build_hgnetv2
from ..dfine.criterion import DFineCriterion, build_dfine_weight_dict
from ..matcher import HungarianMatcher
from ..rtdetr.encoder import AIFI_ENCODINGS
from ..rtdetr.postprocess import RTDETRPostProcess
from .backbone import DINOV3_VITS, build_dinov3_sta
from .decoder import DEIMv2Decoder
from .encoder import DEIMv2HybridEncoder, LiteEncoder
from .model import DEIMv2

__all__ = ["DEIMV2_LOSSES", "DEIMV2_SIZES", "build_deimv2", "deimv2_training_parts"]

#: DEIMv2's losses: MAL, L1 + GIoU, FGL + DDF (atto / femto / pico train without ``local``)
DEIMV2_LOSSES = ("mal", "boxes", "local")

#: DEIMv2's published sizes (Intellindust-AI-Lab/DEIMv2 ``configs/deimv2/deimv2_*_coco.yml``; COCO AP
#: 23.8 / 31.0 / 38.5 / 43.0 / 50.9 / 53.0 / 56.0 / 57.8 for atto .. X, not reproduced here).  X
#: (``dinov3_vits16plus``, a SwiGLU ViT: hidden 256, STA 64, expansion 1.25, depth 1.37, 6 decoder
#: layers, FFN 2048) is not buildable (CPVT's blocks have a GELU MLP).  The ViT blocks feeding the
#: three scales are ``vit_out_indices=(5, 8, 11)`` (DEIMv2's README; a third-party copy of the S / M
#: configs lists ``[3, 7, 11]``).  Parameter counts built here (80 classes): atto 0.51 M, femto 0.99 M,
#: pico 1.55 M, N 3.62 M, S 9.82 M, M 18.42 M, L 32.6 M (published 0.5 / 1.0 / 1.5 / 3.6 / 9.7 / 18.1 / 32.2).
DEIMV2_SIZES: dict[str, dict[str, Any]] = {
    "atto": dict(losses=["mal", "boxes"], pos_enc="none", backbone="hgnetv2_atto", hgnet_return_idx=[2],
                 encoder="lite", hidden_dim=64, encoder_expansion=0.34, depth_mult=0.5, dec_layers=3,
                 dim_feedforward=160, num_queries=100, num_points=[4, 2], share_bbox_head=True, use_gateway=False,
                 trailing_conv=True),
    "femto": dict(losses=["mal", "boxes"], pos_enc="none", backbone="hgnetv2_femto", hgnet_return_idx=[2],
                  encoder="lite", hidden_dim=96, encoder_expansion=0.34, depth_mult=0.5, dec_layers=3,
                  dim_feedforward=256, num_queries=150, num_points=[4, 2], share_bbox_head=True, use_gateway=False,
                  trailing_conv=True),
    "pico": dict(losses=["mal", "boxes"], pos_enc="none", backbone="hgnetv2_pico", hgnet_return_idx=[2],
                 encoder="lite", hidden_dim=112, encoder_expansion=0.34, depth_mult=0.5, dec_layers=3,
                 dim_feedforward=320, num_queries=200, num_points=[4, 2], share_bbox_head=True, use_gateway=False,
                 trailing_conv=True),
    "n": dict(backbone="hgnetv2_b0", hgnet_return_idx=[2, 3], encoder="hybrid", hidden_dim=128,
              enc_dim_feedforward=512, encoder_expansion=0.34, depth_mult=0.5, dec_layers=3, dim_feedforward=512,
              num_queries=300, num_points=[6, 6], trailing_conv=True),
    "s": dict(backbone="vit_tiny", hidden_dim=192, enc_dim_feedforward=512, encoder_expansion=0.34, depth_mult=0.67,
              dec_layers=4, dim_feedforward=512, num_queries=300, num_points=[3, 6, 3]),
    "m": dict(backbone="vit_tinyplus", hidden_dim=256, enc_dim_feedforward=512, encoder_expansion=0.67,
              depth_mult=1.0, dec_layers=4, dim_feedforward=512, num_queries=300, num_points=[3, 6, 3]),
    "l": dict(backbone="dinov3_vits16", hidden_dim=224, enc_dim_feedforward=896, encoder_expansion=1.0,
              depth_mult=1.0, dec_layers=4, dim_feedforward=1792, num_queries=300, num_points=[3, 6, 3],
              sta_inplanes=32),
}  # fmt: skip


def build_deimv2(
    backbone: str = "vit_tiny",
    pos_enc: str = "sincos",
    *,
    num_classes: int = 80,
    hidden_dim: int = 192,
    encoder: str = "hybrid",
    num_heads: int = 8,
    enc_layers: int = 1,
    enc_dim_feedforward: int = 1024,
    encoder_expansion: float = 1.0,
    depth_mult: float = 1.0,
    trailing_conv: bool = False,
    fuse_op: str = "sum",
    use_encoder_idx: Sequence[int] = (-1,),
    temperature: float = 10000.0,
    dec_layers: int = 6,
    dec_heads: int = 8,
    dim_feedforward: int = 1024,
    dropout: float = 0.0,
    num_queries: int = 300,
    num_points: int | Sequence[int] = 4,
    offset_scale: float = 0.5,
    max_num_bins: int = 32,
    reg_scale: float = 4.0,
    up: float = 0.5,
    use_gateway: bool = True,
    share_bbox_head: bool = False,
    query_pos_act: str = "relu",
    lqe_hidden_dim: int = 64,
    lqe_layers: int = 2,
    lqe_k: int = 4,
    learn_initial_query: bool = False,
    layer_norm_eps: float = 1e-5,
    batch_norm_eps: float = 1e-5,
    num_denoising: int = 100,
    label_noise_ratio: float = 0.5,
    box_noise_scale: float = 1.0,
    aux_loss: bool = True,
    vit_out_indices: Sequence[int] = (5, 8, 11),
    vit_options: dict | None = None,
    sta_inplanes: int = 16,
    vit_layer_scale: float | str | None = "preset",
    vit_apply_layernorm: bool | None = None,
    vit_final_norm: bool | None = None,
    drop_path_rate: float = 0.0,
    hgnet_return_idx: Sequence[int] = (2, 3),
    hgnet_options: dict | None = None,
    freeze_backbone_bn: bool = False,
    peg_at: Sequence[int] | int | str = (-1,),
    peg_kernel_size: int = 3,
    mal_loss_coef: float = 1.0,
    bbox_loss_coef: float = 5.0,
    giou_loss_coef: float = 2.0,
    fgl_loss_coef: float = 0.15,
    ddf_loss_coef: float = 1.5,
    losses: Sequence[str] = DEIMV2_LOSSES,
    focal_alpha: float = 0.75,
    focal_gamma: float = 2.0,
    mal_alpha: float | None = None,
    use_uni_set: bool = True,
) -> tuple[DEIMv2, DFineCriterion, RTDETRPostProcess]:
    """DEIMv2 with the chosen AIFI position encoding; returns ``(model, criterion, postprocessor)``.

    Args:
        backbone: a DINOv3 ViT of :data:`DINOV3_VITS` (STA + hybrid encoder, strides 8/16/32) or
            ``hgnetv2_*`` (D-FINE's HGNetv2; ``hgnet_return_idx`` stages).
        pos_enc: AIFI's encoding (the hybrid encoder's; the lite encoder has no attention: ``none``): ``sincos``
            for the actual size, ``peg`` (zero-initialised), ``none``, rotary kinds, biases.  The
            DINOv3 ViT always uses its own ``rope-dinov3`` rotation, rebuilt for every input size.
        encoder: ``"hybrid"`` or ``"lite"`` (atto / femto / pico).
        hidden_dim: width of the encoder and decoder (DEIMv2 uses one width for both).
        num_heads, enc_layers, enc_dim_feedforward: AIFI's.
        encoder_expansion, depth_mult, trailing_conv, fuse_op: the encoder's CSP blocks and fusion.
        dec_layers, dec_heads, dim_feedforward (SwiGLU: half of it hidden), dropout, num_queries,
            num_points (int or one per level), max_num_bins, reg_scale, up, use_gateway,
            share_bbox_head, query_pos_act: the decoder's.
        num_denoising, label_noise_ratio, box_noise_scale, aux_loss: training outputs.
        vit_out_indices, vit_options, sta_inplanes, vit_layer_scale, vit_apply_layernorm, vit_final_norm,
            drop_path_rate: the DINOv3 backbone's blocks, ViT keywords (shape, ``rope_temperature``, ...),
            STA width, layer-scale init, LayerNorm on the selected / last block (``"preset"`` / None:
            the ViT preset's; :func:`~peg_detr.models.deimv2.backbone.build_dinov3_sta`), stochastic depth.
        use_encoder_idx, temperature: AIFI's levels and sin-cos temperature.
        offset_scale, lqe_hidden_dim, lqe_layers, lqe_k, learn_initial_query, layer_norm_eps,
            batch_norm_eps: as :class:`~peg_detr.models.deimv2.decoder.DEIMv2Decoder`.
        hgnet_return_idx, hgnet_options, freeze_backbone_bn: the HGNetv2's returned stages, explicit
            layout (``stem_channels``, ``stages``, ``use_lab``: :func:`build_hgnetv2`'s; DEIMv2's Atto /
            Femto / Pico layouts are not presets there and come from a config this way) and frozen BN.
        peg_at, peg_kernel_size: the PEG's place and kernel in AIFI.
        *_loss_coef, losses, focal_alpha, focal_gamma, mal_alpha, use_uni_set: the criterion
            (:func:`deimv2_training_parts`; DEIMv2: MAL 1, L1 5, GIoU 2, FGL 0.15, DDF 1.5, alpha
            0.75, gamma 2, dense one-to-one matching of the box losses).
    """
    config = dict(locals())
    parse_pos_enc(pos_enc, AIFI_ENCODINGS)
    if encoder not in ("hybrid", "lite"):
        raise ValueError(f"encoder must be 'hybrid' or 'lite'; got {encoder!r}")
    if encoder == "lite" and pos_enc != "none":
        raise ValueError(
            f"the lite encoder has no attention and no position encoding: pos_enc='none', not {pos_enc!r}"
        )
    if num_classes < 1 or num_queries < 1 or num_denoising < 0:
        raise ValueError(
            f"num_classes={num_classes} and num_queries={num_queries} must be >= 1, num_denoising >= 0"
        )
    peg_at = [int(peg_at)] if isinstance(peg_at, int) else peg_at if isinstance(peg_at, str) else list(peg_at)
    in_channels = None
    if backbone in DINOV3_VITS:
        if encoder != "hybrid":
            raise ValueError("the DINOv3 backbones feed the hybrid encoder")
        net = build_dinov3_sta(
            backbone, hidden_dim=hidden_dim, out_indices=vit_out_indices, sta_inplanes=sta_inplanes,
            layer_scale=vit_layer_scale, apply_layernorm=vit_apply_layernorm, final_norm=vit_final_norm,
            drop_path_rate=drop_path_rate,
            batch_norm_eps=batch_norm_eps, **(vit_options or {}),
        )  # fmt: skip
        levels = 3
    elif backbone.startswith("hgnetv2_"):  # "hgnetv2_custom": the layout in hgnet_options
        net = build_hgnetv2(
            None if backbone == "hgnetv2_custom" else backbone, return_idx=list(hgnet_return_idx),
            freeze_bn=freeze_backbone_bn, **(hgnet_options or {}),
        )  # fmt: skip
        levels = len(net.out_channels) + (1 if encoder == "lite" else 0)
        in_channels = net.out_channels
    else:
        raise ValueError(
            f"unknown DEIMv2 backbone {backbone!r}; choose from {sorted(DINOV3_VITS)} or hgnetv2_*"
        )
    if encoder == "hybrid":
        enc = DEIMv2HybridEncoder(
            levels, hidden_dim, in_channels=in_channels, num_heads=num_heads, dim_feedforward=enc_dim_feedforward,
            dropout=dropout, expansion=encoder_expansion, depth_mult=depth_mult, num_layers=enc_layers,
            pos_enc=pos_enc, fuse_op=fuse_op, trailing_conv=trailing_conv, peg_at=peg_at,
            peg_kernel_size=peg_kernel_size, use_encoder_idx=use_encoder_idx, temperature=temperature,
            layer_norm_eps=layer_norm_eps, batch_norm_eps=batch_norm_eps,
        )  # fmt: skip
    else:
        enc = LiteEncoder(
            net.out_channels, hidden_dim, expansion=encoder_expansion, depth_mult=depth_mult,
            trailing_conv=trailing_conv, batch_norm_eps=batch_norm_eps,
        )  # fmt: skip
    decoder = DEIMv2Decoder(
        [hidden_dim] * levels, hidden_dim, num_classes, num_queries=num_queries, num_layers=dec_layers,
        num_heads=dec_heads, dim_feedforward=dim_feedforward, dropout=dropout, num_points=num_points,
        offset_scale=offset_scale, max_num_bins=max_num_bins, reg_scale=reg_scale, up=up, lqe_k=lqe_k,
        lqe_hidden_dim=lqe_hidden_dim, lqe_layers=lqe_layers, learn_initial_query=learn_initial_query,
        layer_norm_eps=layer_norm_eps, batch_norm_eps=batch_norm_eps, use_gateway=use_gateway,
        share_bbox_head=share_bbox_head, query_pos_act=query_pos_act,
    )  # fmt: skip
    model = DEIMv2(
        net, enc, decoder, num_classes=num_classes, num_queries=num_queries, num_denoising=num_denoising,
        label_noise_ratio=label_noise_ratio, box_noise_scale=box_noise_scale, aux_loss=aux_loss,
    )  # fmt: skip
    model.build_config = _json_safe({**config, "peg_at": peg_at})
    criterion, post = deimv2_training_parts(
        model, mal=mal_loss_coef, bbox=bbox_loss_coef, giou=giou_loss_coef, fgl=fgl_loss_coef, ddf=ddf_loss_coef,
        losses=tuple(losses), alpha=focal_alpha, gamma=focal_gamma, mal_alpha=mal_alpha, use_uni_set=use_uni_set,
    )  # fmt: skip
    return model, criterion, post


def deimv2_training_parts(
    model: DEIMv2,
    mal: float = 1.0,
    bbox: float = 5.0,
    giou: float = 2.0,
    fgl: float = 0.15,
    ddf: float = 1.5,
    *,
    losses: tuple[str, ...] = DEIMV2_LOSSES,
    alpha: float = 0.75,
    gamma: float = 2.0,
    mal_alpha: float | None = None,
    use_uni_set: bool = True,
) -> tuple[DFineCriterion, RTDETRPostProcess]:
    """D-FINE's criterion with DEIMv2's losses and weights (matcher costs 2 / 5 / 2, focal), and the post-processor."""
    dec_layers = len(model.decoder.layers)
    weight_dict = build_dfine_weight_dict(
        bbox=bbox, giou=giou, fgl=fgl, ddf=ddf, mal=mal, losses=losses, dec_layers=dec_layers,
        aux_loss=model.aux_loss, denoising=model.num_denoising > 0,
    )  # fmt: skip
    matcher = HungarianMatcher(2.0, 5.0, 2.0, focal=True, focal_alpha=0.25, focal_gamma=2.0)
    criterion = DFineCriterion(
        model.num_classes, matcher=matcher, weight_dict=weight_dict, losses=losses, reg_max=model.decoder.max_num_bins,
        alpha=alpha, gamma=gamma, mal_alpha=mal_alpha, use_uni_set=use_uni_set, dec_layers=dec_layers,
    )  # fmt: skip
    return criterion, RTDETRPostProcess(num_top_queries=model.num_queries)


def _json_safe(config: dict[str, Any]) -> dict[str, Any]:
    """Tuples as lists, so the stored config equals its JSON round trip."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in config.items()}
