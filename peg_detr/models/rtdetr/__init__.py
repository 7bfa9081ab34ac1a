"""RT-DETR (Zhao et al., "DETRs Beat YOLOs on Real-time Object Detection", 2024) in peg_detr.

Files (one owner each, see the module docstrings): ``backbone`` (ResNet-vd with frozen batch
norm, strides 8/16/32), ``encoder`` (the hybrid encoder: input projections, AIFI with the
position encoding chosen by name, CCFM), ``hf_keys`` (transformers' ``RTDetrForObjectDetection``
state-dict keys <-> ours).
"""

from .backbone import RESNET_VD, ResNetVd, build_resnet_vd
from .encoder import AIFI, ENCODER_POS_ENCODINGS, HybridEncoder, RTDetrSinCos2d, rtdetr_sincos_2d
from .hf_keys import (
    ENCODER_HF_PREFIXES,
    backbone_kwargs_from_hf,
    encoder_hf_config,
    encoder_hf_keys,
    encoder_hf_to_ours,
    encoder_kwargs_from_hf,
    encoder_ours_to_hf,
)

__all__ = [
    "AIFI",
    "ENCODER_HF_PREFIXES",
    "ENCODER_POS_ENCODINGS",
    "RESNET_VD",
    "HybridEncoder",
    "RTDetrSinCos2d",
    "ResNetVd",
    "backbone_kwargs_from_hf",
    "build_resnet_vd",
    "encoder_hf_config",
    "encoder_hf_keys",
    "encoder_hf_to_ours",
    "encoder_kwargs_from_hf",
    "encoder_ours_to_hf",
    "rtdetr_sincos_2d",
]
