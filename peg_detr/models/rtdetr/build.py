"""``build_rtdetr``: RT-DETR's model, loss and post-processor from json-safe keywords.

The same contract as :func:`peg_detr.models.build_detr`: three objects returned separately (the
model's state dict holds only detector weights; DDP wraps the model alone) and
``model.build_config`` recording every keyword but the weights file, so a checkpoint rebuilds
exactly the trained model (``peg_detr.model.ARCHS["rtdetr"]``).
"""

from __future__ import annotations

import os
from typing import Any

from peg_core.interop.io import WeightsError, read_state_file

from .backbone import ResNetVd
from .criterion import RTDETRCriterion
from .decoder import RTDETRDecoder
from .encoder import HybridEncoder
from .model import RTDETR
from .postprocess import RTDETRPostProcess

__all__ = ["RTDETR_BACKBONES", "RTDETR_POS_ENCODINGS", "build_rtdetr", "rtdetr_weight_dict"]

#: ``backbone`` name -> :class:`ResNetVd` keywords.  ``tiny``: the 18-layer layout at 1/4 width
#: (16..128 channels), for CPU demos and tests.
RTDETR_BACKBONES: dict[str, dict[str, Any]] = {
    "r18vd": {"depth": 18},
    "r34vd": {"depth": 34},
    "r50vd": {"depth": 50},
    "r101vd": {"depth": 101},
    "tiny": {"depth": 18, "widths": (16, 32, 64, 128), "stem_width": 16},
}
#: RT-DETR freezes the BatchNorms of its bottleneck backbones only (``freeze_norm`` in its configs)
_FROZEN_BN_BY_DEFAULT = ("r50vd", "r101vd")
#: AIFI's position encodings (see :class:`~peg_detr.models.rtdetr.encoder.HybridEncoder`)
RTDETR_POS_ENCODINGS = ("sincos", "peg", "none", "learned", "rope-axial", "rope-mixed", "peg+rope-mixed")
# PEG keywords with their defaults: only the ones set to something else are passed to the encoder.
_PEG_DEFAULTS = {"peg_separable": False, "peg_padding": "zeros", "peg_dynamic": False, "peg_num_kernels": 4}


def rtdetr_weight_dict(
    dec_layers: int,
    *,
    vfl: float = 1.0,
    bbox: float = 5.0,
    giou: float = 2.0,
    aux_loss: bool = True,
    denoising: bool = True,
) -> dict[str, float]:
    """RT-DETR's loss weights: ``loss_vfl`` / ``loss_bbox`` / ``loss_giou`` and their suffixed copies.

    ``_aux_i`` for the ``dec_layers - 1`` earlier decoder layers and ``_enc_0`` for the encoder
    proposals (with ``aux_loss``), ``_dn_i`` for the denoising queries of every decoder layer.
    """
    base = {"loss_vfl": vfl, "loss_bbox": bbox, "loss_giou": giou}
    suffixes = [""]
    if aux_loss:
        suffixes += [f"_aux_{i}" for i in range(dec_layers - 1)] + ["_enc_0"]
    if denoising:
        suffixes += [f"_dn_{i}" for i in range(dec_layers)]
    return {k + s: w for s in suffixes for k, w in base.items()}


def _backbone(name: str, freeze_bn: bool | None, weights: str | os.PathLike | None) -> ResNetVd:
    """The ResNet-vd of ``name``, with ImageNet weights from a local file when given."""
    if name not in RTDETR_BACKBONES:
        raise ValueError(f"unknown RT-DETR backbone {name!r}; choose from {tuple(RTDETR_BACKBONES)}")
    frozen = name in _FROZEN_BN_BY_DEFAULT if freeze_bn is None else freeze_bn
    net = ResNetVd(**RTDETR_BACKBONES[name], freeze_bn=frozen)
    if weights is not None:
        if name == "tiny":
            raise ValueError("the 'tiny' backbone has no pretrained weights; drop backbone_weights")
        state = read_state_file(weights, what="backbone weights")
        try:
            net.load_state_dict(state)
        except RuntimeError as e:  # missing / unexpected keys or shapes: name the file
            raise WeightsError(
                f"not a {name} ResNet-vd state dict ({str(e).splitlines()[0]})", weights
            ) from None
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
    peg_kernel_size: int = 3,
    peg_separable: bool = False,
    peg_padding: str = "zeros",
    peg_dynamic: bool = False,
    peg_num_kernels: int = 4,
    vfl_loss_coef: float = 1.0,
    bbox_loss_coef: float = 5.0,
    giou_loss_coef: float = 2.0,
) -> tuple[RTDETR, RTDETRCriterion, RTDETRPostProcess]:
    """RT-DETR with the chosen AIFI position encoding; returns ``(model, criterion, postprocessor)``.

    Args:
        backbone: ``r18vd`` / ``r34vd`` / ``r50vd`` / ``r101vd`` or ``tiny`` (see :data:`RTDETR_BACKBONES`).
        pos_enc: AIFI's position encoding (:data:`RTDETR_POS_ENCODINGS`): ``sincos`` (RT-DETR's
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
        peg_kernel_size, peg_separable, peg_padding, peg_dynamic, peg_num_kernels: the PEG's
            options, the same as in every model of the suite.
        vfl_loss_coef, bbox_loss_coef, giou_loss_coef: loss weights (RT-DETR: 1, 5, 2).
    """
    config = {k: v for k, v in locals().items() if k != "backbone_weights"}
    if pos_enc not in RTDETR_POS_ENCODINGS:
        raise ValueError(f"unknown pos_enc {pos_enc!r} for rtdetr; choose from {RTDETR_POS_ENCODINGS}")
    if num_classes < 1 or num_queries < 1 or num_denoising < 0:
        raise ValueError(
            f"num_classes={num_classes} and num_queries={num_queries} must be >= 1, num_denoising >= 0"
        )
    if hidden_dim % num_heads:
        raise ValueError(f"hidden_dim={hidden_dim} must be divisible by num_heads={num_heads}")
    net = _backbone(backbone, freeze_backbone_bn, backbone_weights)
    given = {"peg_separable": peg_separable, "peg_padding": peg_padding, "peg_dynamic": peg_dynamic,
             "peg_num_kernels": peg_num_kernels}  # fmt: skip
    peg_options = {k: v for k, v in given.items() if v != _PEG_DEFAULTS[k]}
    encoder = HybridEncoder(
        net.out_channels, hidden_dim, num_heads=num_heads, dim_feedforward=dim_feedforward,
        dropout=dropout, expansion=encoder_expansion, depth_mult=depth_mult, pos_enc=pos_enc,
        num_layers=enc_layers, peg_kernel_size=peg_kernel_size, **peg_options,
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
    model.build_config = _json_safe(config)
    weights = rtdetr_weight_dict(
        dec_layers, vfl=vfl_loss_coef, bbox=bbox_loss_coef, giou=giou_loss_coef,
        aux_loss=aux_loss, denoising=num_denoising > 0,
    )  # fmt: skip
    criterion = RTDETRCriterion(num_classes, weight_dict=weights)
    return model, criterion, RTDETRPostProcess(num_top_queries=num_queries)


def _json_safe(config: dict[str, Any]) -> dict[str, Any]:
    """Tuples as lists, so the stored config equals its JSON round trip."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in config.items()}
