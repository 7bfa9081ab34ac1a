"""``build_rtdetr``: RT-DETR's model, loss and post-processor from json-safe keywords.

The same contract as :func:`peg_detr.models.build_detr`: three objects returned separately (the
model's state dict holds only detector weights; DDP wraps the model alone) and
``model.build_config`` recording every keyword but the weights file, so a checkpoint rebuilds
exactly the trained model (``peg_detr.model.ARCHS["rtdetr"]``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from peg_core.interop.io import load_state_strict, read_state_file
from peg_core.registry import parse_pos_enc

from .backbone import RESNET_VD, ResNetVd, build_resnet_vd
from .criterion import RTDETRCriterion, build_rtdetr_weight_dict
from .decoder import RTDETRDecoder
from .encoder import AIFI_ENCODINGS, HybridEncoder
from .model import RTDETR
from .postprocess import RTDETRPostProcess

__all__ = ["RTDETR_BACKBONES", "build_rtdetr", "rtdetr_training_parts"]

#: AIFI's position encodings (:class:`~peg_detr.models.rtdetr.encoder.HybridEncoder`)

#: RT-DETR freezes the BatchNorms of its bottleneck backbones only (``freeze_norm`` in its configs)
_FROZEN_BN_BY_DEFAULT = ("r50vd", "r101vd")
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
    backbone: str = "r50vd",
    pos_enc: str = "sincos",
    *,
    num_classes: int = 80,
    hidden_dim: int = 256,
    num_heads: int = 8,
    enc_layers: int = 1,
    dec_layers: int = 6,
    dim_feedforward: int = 1024,
    dropout: float = 0.0,
    num_queries: int = 300,
    num_points: int = 4,
    encoder_expansion: float = 1.0,
    depth_mult: float = 1.0,
    num_denoising: int = 100,
    label_noise_ratio: float = 0.5,
    box_noise_scale: float = 1.0,
    aux_loss: bool = True,
    backbone_weights: str | os.PathLike | None = None,
    freeze_backbone_bn: bool | None = None,
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
) -> tuple[RTDETR, RTDETRCriterion, RTDETRPostProcess]:
    """RT-DETR with the chosen AIFI position encoding; returns ``(model, criterion, postprocessor)``.

    Args:
        backbone: ``r18vd`` / ``r34vd`` / ``r50vd`` / ``r101vd`` or ``tiny`` (see :data:`RTDETR_BACKBONES`).
        pos_enc: AIFI's position encoding (what :data:`~.encoder.AIFI_ENCODINGS` accepts): ``sincos`` (RT-DETR's
            formula, computed for the actual size), ``peg`` (a zero-initialised PEG: equals ``none``
            until trained), ``none``, ``learned`` or a rotary one.
        num_classes: sigmoid classes (COCO with RT-DETR's remapped labels: 80; with category ids: 91).
        hidden_dim, num_heads, dim_feedforward, dropout: widths of the encoder and decoder.
        enc_layers: AIFI layers on the stride-32 map (RT-DETR: 1).
        dec_layers: decoder layers (RT-DETR R18vd: 3, R50vd: 6).
        num_queries, num_points: selected queries and deformable samples per head and level.
        encoder_expansion, depth_mult: CCFM's CSP width and depth multipliers (R18vd: 0.5, 1.0).
        num_denoising, label_noise_ratio, box_noise_scale: contrastive denoising (0 queries: off).
        aux_loss: losses on every decoder layer and on the encoder proposals.
        backbone_weights: a local ImageNet state dict of the ResNet-vd (nothing is downloaded).
        freeze_backbone_bn: FrozenBatchNorm2d in the backbone; ``None``: as RT-DETR (R50vd/R101vd).
        peg_at: where AIFI's PEGs go (:func:`peg_core.peg.resolve_peg_at`): ``-1`` on the AIFI
            input (default, so the attention sees positions), ``i`` after AIFI layer ``i``.
        peg_kernel_size, peg_separable, peg_padding, peg_dynamic, peg_num_kernels: the PEG's
            options, the same as in every model of the suite.
        learned_grid, pos_interpolation: the ``learned`` table's ``(H0, W0)`` and resize mode.
        vfl_loss_coef, bbox_loss_coef, giou_loss_coef: loss weights (RT-DETR: 1, 5, 2).
    """
    config = {k: v for k, v in locals().items() if k != "backbone_weights"}
    parse_pos_enc(pos_enc, AIFI_ENCODINGS)  # refused before the backbone is built
    if num_classes < 1 or num_queries < 1 or num_denoising < 0:
        raise ValueError(
            f"num_classes={num_classes} and num_queries={num_queries} must be >= 1, num_denoising >= 0"
        )
    if hidden_dim % num_heads:
        raise ValueError(f"hidden_dim={hidden_dim} must be divisible by num_heads={num_heads}")
    net = _backbone(backbone, freeze_backbone_bn, backbone_weights)
    peg_at = [int(peg_at)] if isinstance(peg_at, int) else peg_at if isinstance(peg_at, str) else list(peg_at)
    encoder = HybridEncoder(
        net.out_channels, hidden_dim, num_heads=num_heads, dim_feedforward=dim_feedforward,
        dropout=dropout, expansion=encoder_expansion, depth_mult=depth_mult, num_layers=enc_layers,
        pos_enc=pos_enc, peg_at=peg_at, peg_kernel_size=peg_kernel_size, peg_separable=peg_separable,
        peg_padding=peg_padding, peg_dynamic=peg_dynamic, peg_num_kernels=peg_num_kernels,
        learned_grid=tuple(learned_grid), pos_interpolation=pos_interpolation,
    )  # fmt: skip
    decoder = RTDETRDecoder(
        [hidden_dim] * 3, hidden_dim, num_classes, num_queries=num_queries, num_layers=dec_layers,
        num_heads=num_heads, dim_feedforward=dim_feedforward, dropout=dropout, num_points=num_points,
    )  # fmt: skip
    model = RTDETR(
        net, encoder, decoder, num_classes=num_classes, num_queries=num_queries,
        num_denoising=num_denoising, label_noise_ratio=label_noise_ratio,
        box_noise_scale=box_noise_scale, aux_loss=aux_loss,
    )  # fmt: skip
    model.build_config = _json_safe({**config, "peg_at": peg_at})
    return model, *rtdetr_training_parts(model, vfl_loss_coef, bbox_loss_coef, giou_loss_coef)


def rtdetr_training_parts(
    model: RTDETR, vfl: float = 1.0, bbox: float = 5.0, giou: float = 2.0
) -> tuple[RTDETRCriterion, RTDETRPostProcess]:
    """The criterion and post-processor that fit a built :class:`RTDETR` (classes, layers, queries).

    Shared by :func:`build_rtdetr` and models built from a Hugging Face ``config.json``
    (:func:`peg_detr.interop.hf_rtdetr.rtdetr_from_hf_config`).
    """
    dec_layers = len(model.decoder.layers)
    weights = build_rtdetr_weight_dict(
        vfl, bbox, giou, dec_layers=dec_layers, aux_loss=model.aux_loss, denoising=model.num_denoising > 0
    )
    criterion = RTDETRCriterion(model.num_classes, weight_dict=weights, dec_layers=dec_layers)
    return criterion, RTDETRPostProcess(num_top_queries=model.num_queries)


def _json_safe(config: dict[str, Any]) -> dict[str, Any]:
    """Tuples as lists, so the stored config equals its JSON round trip."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in config.items()}
