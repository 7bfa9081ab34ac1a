"""DEIMv2 (Huang et al., 2025, "Real-Time Object Detection Meets DINOv3") in peg_detr.

Files: ``backbone`` (the DINOv3 ViT on the suite's ``rope-dinov3`` rotary encoding, the spatial
tuning adapter and the fusion projections), ``encoder`` (the hybrid encoder with sum fusion and
RepNCSPELAN5 blocks; the lite encoder of atto / femto / pico), ``decoder`` (query selection and
D-FINE's fine-grained distribution refinement with DEIMv2's RMSNorm / SwiGLU / gated layers),
``model`` (the detector; outputs as issue 27's D-FINE contract), ``build`` (:func:`build_deimv2`,
:data:`DEIMV2_SIZES`).  transformers' ``Deimv2ForObjectDetection`` folders load through
:mod:`peg_detr.interop.hf_deimv2`.
"""

from .backbone import DINOV3_VITS, DINOv3STABackbone, SpatialTuningAdapter, build_dinov3_sta
from .build import DEIMV2_LOSSES, DEIMV2_SIZES, build_deimv2, deimv2_training_parts
from .config import DEIMv2Config
from .decoder import DEIMv2Decoder, DEIMv2DecoderLayer, DEIMv2DecoderSpec, RMSGate, SwiGLUFFN
from .encoder import DEIMv2HybridEncoder, LiteEncoder, RepNCSPELAN5
from .model import DEIMv2

__all__ = [
    "DEIMV2_LOSSES",
    "DEIMV2_SIZES",
    "DINOV3_VITS",
    "DEIMv2",
    "DEIMv2Config",
    "DEIMv2Decoder",
    "DEIMv2DecoderLayer",
    "DEIMv2DecoderSpec",
    "DEIMv2HybridEncoder",
    "DINOv3STABackbone",
    "LiteEncoder",
    "RMSGate",
    "RepNCSPELAN5",
    "SpatialTuningAdapter",
    "SwiGLUFFN",
    "build_deimv2",
    "build_dinov3_sta",
    "deimv2_training_parts",
]
