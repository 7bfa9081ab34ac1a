"""RT-DETR: ResNet-vd backbone, hybrid encoder (AIFI + CCFM), deformable decoder, denoising training."""

from .denoising import DenoisingGroup, contrastive_denoising_group

__all__ = ["DenoisingGroup", "contrastive_denoising_group"]
