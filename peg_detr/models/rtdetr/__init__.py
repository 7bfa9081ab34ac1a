"""RT-DETR: ResNet-vd backbone, hybrid encoder (AIFI + CCFM), deformable decoder, denoising training."""

from .decoder import RTDETRDecoder, generate_anchors, inverse_sigmoid
from .denoising import DenoisingGroup, contrastive_denoising_group
from .model import RTDETR
from .postprocess import RTDETRPostProcess

__all__ = [
    "RTDETR",
    "DenoisingGroup",
    "RTDETRDecoder",
    "RTDETRPostProcess",
    "contrastive_denoising_group",
    "generate_anchors",
    "inverse_sigmoid",
]
