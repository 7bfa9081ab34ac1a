"""RT-DETR: ResNet-vd backbone, hybrid encoder (AIFI + CCFM), deformable decoder, denoising training."""

from .decoder import RTDETRDecoder, generate_anchors, inverse_sigmoid
from .model import RTDETR
from .postprocess import RTDETRPostProcess

__all__ = ["RTDETR", "RTDETRDecoder", "RTDETRPostProcess", "generate_anchors", "inverse_sigmoid"]
