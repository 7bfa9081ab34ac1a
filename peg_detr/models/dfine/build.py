"""``build_dfine``: D-FINE's model, loss and post-processor from json-safe keywords.

The contract of :func:`peg_detr.models.rtdetr.build.build_rtdetr`: three objects returned
separately and ``model.build_config`` recording every keyword but the weights file, so a
checkpoint rebuilds exactly the trained model.  :data:`DFINE_SIZES` holds the published sizes
(Peterande/D-FINE ``configs/dfine/dfine_hgnetv2_{n,s,m,l,x}_coco.yml``; transformers' ``DFineConfig``
defaults are L's): ``build_dfine(**DFINE_SIZES["s"])``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from torch import nn

from peg_core.interop.io import load_state_strict, read_state_file
from peg_core.registry import parse_pos_enc

from ..matcher import HungarianMatcher
from ..rtdetr.backbone import build_resnet_vd
from ..rtdetr.postprocess import RTDETRPostProcess
from .backbone import HGNETV2_BACKBONES, build_hgnetv2
from .criterion import DFineCriterion, build_dfine_weight_dict
from .decoder import DFineDecoder
from .encoder import DFINE_ENCODINGS, DFineHybridEncoder
from .model import DFINE

__all__ = ["CLS_LOSSES", "DFINE_BACKBONES", "DFINE_SIZES", "build_dfine", "dfine_training_parts"]

#: ``cls_loss`` choices: D-FINE's varifocal loss, DEIM's matchability-aware loss, plain focal
CLS_LOSSES = ("vfl", "mal", "focal")

#: the backbones ``build_dfine`` takes: RT-DETR's CPU-sized ResNet-vd and the HGNetv2 presets
DFINE_BACKBONES = ("tiny", *HGNETV2_BACKBONES)
#: D-FINE freezes the norms (and the stem) of its large backbones only (L: B4, X: B5)
_FROZEN_BY_DEFAULT = ("hgnetv2_b4", "hgnetv2_b5")

#: ``size -> build_dfine keywords`` of the published COCO models (backbone, widths, depths, points).
DFINE_SIZES: dict[str, dict[str, Any]] = {
    "n": dict(backbone="hgnetv2_b0", backbone_return_idx=[2, 3], hidden_dim=128, dim_feedforward=512,
              encoder_dim_feedforward=512, encoder_expansion=0.34, depth_mult=0.5, dec_layers=3,
              num_points=[6, 6]),
    "s": dict(backbone="hgnetv2_b0", encoder_expansion=0.5, depth_mult=0.34, dec_layers=3, num_points=[3, 6, 3]),
    "m": dict(backbone="hgnetv2_b2", encoder_expansion=1.0, depth_mult=0.67, dec_layers=4, num_points=[3, 6, 3]),
    "l": dict(backbone="hgnetv2_b4", encoder_expansion=1.0, depth_mult=1.0, dec_layers=6, num_points=[3, 6, 3]),
    "x": dict(backbone="hgnetv2_b5", encoder_hidden_dim=384, encoder_dim_feedforward=2048, encoder_expansion=1.0,
              depth_mult=1.0, dec_layers=6, num_points=[3, 6, 3], reg_scale=8.0),
}  # fmt: skip


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
    backbone: str = "hgnetv2_b4",
    pos_enc: str = "sincos",
    *,
    num_classes: int = 80,
    hidden_dim: int = 256,
    encoder_hidden_dim: int | None = None,
    num_heads: int = 8,
    enc_layers: int = 1,
    dec_layers: int = 6,
    dim_feedforward: int = 1024,
    encoder_dim_feedforward: int | None = None,
    dropout: float = 0.0,
    num_queries: int = 300,
    num_points: int | Sequence[int] = (3, 6, 3),
    encoder_expansion: float = 1.0,
    depth_mult: float = 1.0,
    eval_idx: int = -1,
    max_num_bins: int = 32,
    reg_scale: float = 4.0,
    up: float = 0.5,
    lqe_hidden_dim: int = 64,
    decoder_activation: str = "relu",
    mlp_activation: str = "relu",
    num_denoising: int = 100,
    label_noise_ratio: float = 0.5,
    box_noise_scale: float = 1.0,
    aux_loss: bool = True,
    backbone_weights: str | os.PathLike | None = None,
    freeze_backbone_bn: bool | None = None,
    backbone_freeze_at: int | None = None,
    backbone_return_idx: Sequence[int] | None = None,
    peg_at: Sequence[int] | int | str = (-1,),
    peg_kernel_size: int = 3,
    peg_separable: bool = False,
    peg_padding: str = "zeros",
    peg_dynamic: bool = False,
    peg_num_kernels: int = 4,
    learned_grid: Sequence[int] = (20, 20),
    pos_interpolation: str = "bicubic",
    vfl_loss_coef: float = 1.0,
    bbox_loss_coef: float = 5.0,
    giou_loss_coef: float = 2.0,
    fgl_loss_coef: float = 0.15,
    ddf_loss_coef: float = 1.5,
    cls_loss: str = "vfl",
    cls_loss_gamma: float | None = None,
) -> tuple[DFINE, DFineCriterion, RTDETRPostProcess]:
    """D-FINE with the chosen AIFI position encoding; returns ``(model, criterion, postprocessor)``.

    Args:
        backbone: ``hgnetv2_b0`` .. ``hgnetv2_b5`` or ``tiny`` (:data:`DFINE_BACKBONES`).
        pos_enc: AIFI's encoding (:data:`~.encoder.DFINE_ENCODINGS`): ``sincos`` (D-FINE's formula,
            computed for the actual size), ``peg`` (zero-initialised: equals ``none`` until
            trained), ``none``, ``learned``, a rotary or bias kind.
        num_classes: sigmoid classes.
        hidden_dim: the decoder's width (and the encoder's unless ``encoder_hidden_dim``; X: 384).
        num_heads, enc_layers, dec_layers, dropout: heads (encoder and decoder), AIFI layers,
            decoder layers (N/S: 3, M: 4, L/X: 6), dropout.
        dim_feedforward, encoder_dim_feedforward: FFN widths of the decoder and of AIFI (default: the same).
        num_queries: selected queries.
        num_points: deformable points per head for each level (D-FINE S-X: ``[3, 6, 3]``; N: ``[6, 6]``).
        encoder_expansion, depth_mult: the RepNCSPELAN4 width and depth multipliers.
        eval_idx: the decoder layer that predicts in eval (-1: the last).
        max_num_bins, reg_scale, up: fine-grained distribution refinement (32, 4 (X: 8), 0.5).
        lqe_hidden_dim: the localisation-quality MLP's width.
        decoder_activation, mlp_activation: the decoder FFN's and the box / position heads'
            activations (D-FINE: ReLU both; DEIM: SiLU both).
        num_denoising, label_noise_ratio, box_noise_scale: contrastive denoising (0 queries: off).
        aux_loss: losses on every decoder layer, the pre-bbox head and the encoder proposals.
        backbone_weights: a local state dict of the HGNetv2 in timm's names (nothing is downloaded).
        freeze_backbone_bn, backbone_freeze_at: frozen norms and frozen stem / stages
            (:class:`~.backbone.HGNetv2Backbone`); ``None``: D-FINE's (frozen for B4 / B5 with the stem).
        backbone_return_idx: the HGNetv2 stages returned (default ``(1, 2, 3)``: strides 8/16/32; N ``(2, 3)``).
        peg_at, peg_kernel_size, peg_separable, peg_padding, peg_dynamic, peg_num_kernels,
            learned_grid, pos_interpolation: the position options of RT-DETR's AIFI.
        vfl_loss_coef, bbox_loss_coef, giou_loss_coef, fgl_loss_coef, ddf_loss_coef: loss weights
            (D-FINE: 1, 5, 2, 0.15, 1.5); ``vfl_loss_coef`` weighs whichever ``cls_loss`` is chosen.
        cls_loss, cls_loss_gamma: the classification loss, ``vfl`` (D-FINE), ``mal`` (DEIM's
            matchability-aware loss) or ``focal``, and its focusing exponent (``None``: 2.0, MAL 1.5).
    """
    config = {k: v for k, v in locals().items() if k != "backbone_weights"}
    parse_pos_enc(pos_enc, DFINE_ENCODINGS)  # refused before the backbone is built
    if num_classes < 1 or num_queries < 1 or num_denoising < 0:
        raise ValueError(
            f"num_classes={num_classes} and num_queries={num_queries} must be >= 1, num_denoising >= 0"
        )
    enc_dim = hidden_dim if encoder_hidden_dim is None else encoder_hidden_dim
    for width in (hidden_dim, enc_dim):
        if width % num_heads:
            raise ValueError(
                f"hidden widths ({hidden_dim}, {enc_dim}) must be divisible by num_heads={num_heads}"
            )
    net = _backbone(backbone, freeze_backbone_bn, backbone_freeze_at, backbone_return_idx, backbone_weights)
    levels = len(net.out_channels)
    peg_at = [int(peg_at)] if isinstance(peg_at, int) else peg_at if isinstance(peg_at, str) else list(peg_at)
    encoder = DFineHybridEncoder(
        net.out_channels, enc_dim, num_heads=num_heads,
        dim_feedforward=dim_feedforward if encoder_dim_feedforward is None else encoder_dim_feedforward,
        dropout=dropout, expansion=encoder_expansion, depth_mult=depth_mult, num_layers=enc_layers,
        use_encoder_idx=(levels - 1,), pos_enc=pos_enc, peg_at=peg_at, peg_kernel_size=peg_kernel_size,
        peg_separable=peg_separable, peg_padding=peg_padding, peg_dynamic=peg_dynamic,
        peg_num_kernels=peg_num_kernels, learned_grid=tuple(learned_grid), pos_interpolation=pos_interpolation,
    )  # fmt: skip
    decoder = DFineDecoder(
        [enc_dim] * levels, hidden_dim, num_classes, num_queries=num_queries, num_layers=dec_layers,
        num_heads=num_heads, dim_feedforward=dim_feedforward, dropout=dropout,
        num_points=num_points if isinstance(num_points, int) else list(num_points), eval_idx=eval_idx,
        max_num_bins=max_num_bins, reg_scale=reg_scale, up=up, lqe_hidden_dim=lqe_hidden_dim,
        activation=decoder_activation, mlp_activation=mlp_activation,
    )  # fmt: skip
    model = DFINE(
        net, encoder, decoder, num_classes=num_classes, num_queries=num_queries,
        num_denoising=num_denoising, label_noise_ratio=label_noise_ratio,
        box_noise_scale=box_noise_scale, aux_loss=aux_loss,
    )  # fmt: skip
    model.build_config = _json_safe({**config, "peg_at": peg_at})
    weights = dict(
        cls=vfl_loss_coef, bbox=bbox_loss_coef, giou=giou_loss_coef, fgl=fgl_loss_coef, ddf=ddf_loss_coef
    )
    return model, *dfine_training_parts(model, **weights, cls_loss=cls_loss, cls_loss_gamma=cls_loss_gamma)


def dfine_training_parts(
    model: DFINE,
    cls: float = 1.0,
    bbox: float = 5.0,
    giou: float = 2.0,
    fgl: float = 0.15,
    ddf: float = 1.5,
    *,
    cls_loss: str = "vfl",
    cls_loss_gamma: float | None = None,
) -> tuple[DFineCriterion, RTDETRPostProcess]:
    """The criterion (D-FINE's matcher costs 2 / 5 / 2, focal) and post-processor that fit a built :class:`DFINE`.

    Shared by :func:`build_dfine` and models built from a Hugging Face ``config.json``
    (:func:`peg_detr.interop.hf_dfine.dfine_from_hf_config`).  ``cls_loss``: ``vfl`` (D-FINE's
    ``losses``), ``mal`` (DEIM's matchability-aware loss, gamma 1.5 unless ``cls_loss_gamma``) or
    ``focal``; ``cls`` is its weight.
    """
    if cls_loss not in CLS_LOSSES:
        raise ValueError(f"cls_loss must be one of {CLS_LOSSES}; got {cls_loss!r}")
    losses = (cls_loss, "boxes", "local")
    gamma = cls_loss_gamma if cls_loss_gamma is not None else 1.5 if cls_loss == "mal" else 2.0
    dec_layers = len(model.decoder.layers)
    weight_dict = build_dfine_weight_dict(
        cls, bbox, giou, fgl, ddf, focal=cls, mal=cls, losses=losses, dec_layers=dec_layers,
        aux_loss=model.aux_loss, denoising=model.num_denoising > 0,
    )  # fmt: skip
    matcher = HungarianMatcher(2.0, 5.0, 2.0, focal=True, focal_alpha=0.25, focal_gamma=2.0)
    criterion = DFineCriterion(
        model.num_classes, matcher=matcher, weight_dict=weight_dict, losses=losses,
        reg_max=model.decoder.max_num_bins, dec_layers=dec_layers, gamma=gamma,
    )  # fmt: skip
    return criterion, RTDETRPostProcess(num_top_queries=model.num_queries)


def _json_safe(config: dict[str, Any]) -> dict[str, Any]:
    """Tuples as lists, so the stored config equals its JSON round trip."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in config.items()}
