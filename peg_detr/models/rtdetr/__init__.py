"""RT-DETR: ResNet-vd backbone, hybrid encoder (AIFI + CCFM), deformable decoder, denoising training."""

from .criterion import RTDETRCriterion, build_rtdetr_weight_dict, varifocal_loss
from .decoder import RTDETRDecoder, generate_anchors, inverse_sigmoid
from .denoising import DenoisingGroup, contrastive_denoising_group
from .model import RTDETR
from .postprocess import RTDETRPostProcess

__all__ = [
    "RTDETR",
    "DenoisingGroup",
    "RTDETRCriterion",
    "RTDETRDecoder",
    "RTDETRPostProcess",
    "build_rtdetr_weight_dict",
    "contrastive_denoising_group",
    "generate_anchors",
    "inverse_sigmoid",
    "varifocal_loss",
]
