"""RT-DETR: ResNet-vd backbone, hybrid encoder (AIFI + CCFM), deformable decoder, denoising training."""

from .criterion import RTDETRCriterion, build_rtdetr_weight_dict, varifocal_loss
from .denoising import DenoisingGroup, contrastive_denoising_group

__all__ = [
    "DenoisingGroup",
    "RTDETRCriterion",
    "build_rtdetr_weight_dict",
    "contrastive_denoising_group",
    "varifocal_loss",
]
