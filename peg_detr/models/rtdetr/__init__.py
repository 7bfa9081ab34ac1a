"""RT-DETR (Zhao et al., "DETRs Beat YOLOs on Real-time Object Detection", 2024) in peg_detr.

Files (one owner each, see the module docstrings): ``backbone`` (ResNet-vd with frozen batch
norm, strides 8/16/32), ``encoder`` (the hybrid encoder: input projections, AIFI with the
position encoding chosen by name, CCFM), ``decoder`` (IoU-aware query selection, deformable
decoder, iterative box refinement), ``denoising`` (contrastive denoising groups), ``criterion``
(varifocal + L1 + GIoU), ``model`` (the detector), ``postprocess`` (sigmoid top-K), ``fuse``
(deployment: conv + BN folding, RepVGG re-parameterisation).  transformers'
``RTDetrForObjectDetection`` keys and config.json are :mod:`peg_detr.interop.hf_rtdetr`'s.
"""

from .backbone import RESNET_VD, ResNetVd, build_resnet_vd
from .config import RTDETRConfig
from .criterion import RTDETRCriterion, build_rtdetr_weight_dict, varifocal_loss
from .decoder import RTDETRDecoder, RTDETRDecoderSpec, generate_anchors, inverse_sigmoid
from .denoising import DenoisingGroup, contrastive_denoising_group
from .encoder import AIFI, AIFI_ENCODINGS, HybridEncoder, RTDetrSinCos2d, rtdetr_sincos_2d
from .fuse import FusedConv, FusionStats, fuse_for_deploy, fusion_stats
from .model import RTDETR
from .postprocess import RTDETRPostProcess

__all__ = [
    "AIFI",
    "AIFI_ENCODINGS",
    "RESNET_VD",
    "RTDETR",
    "DenoisingGroup",
    "FusedConv",
    "FusionStats",
    "HybridEncoder",
    "RTDETRConfig",
    "RTDETRCriterion",
    "RTDETRDecoder",
    "RTDETRDecoderSpec",
    "RTDETRPostProcess",
    "RTDetrSinCos2d",
    "ResNetVd",
    "build_resnet_vd",
    "build_rtdetr_weight_dict",
    "contrastive_denoising_group",
    "fuse_for_deploy",
    "fusion_stats",
    "generate_anchors",
    "inverse_sigmoid",
    "rtdetr_sincos_2d",
    "varifocal_loss",
]
