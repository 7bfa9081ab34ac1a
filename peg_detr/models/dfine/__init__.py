"""D-FINE (Peng et al., ICLR 2025, "D-FINE: Redefine Regression Task in DETRs as Fine-grained Distribution Refinement").

Files: ``backbone`` (HGNetv2 from timm's modules), ``encoder`` (the hybrid encoder: RT-DETR's AIFI
with any registry encoding, RepNCSPELAN4 / SCDown FPN-PAN), ``decoder`` (RT-DETR's query
selection, gated deformable layers, fine-grained distribution refinement, LQE), ``fdr`` (the
weighting function, integral and distance-to-box arithmetic), ``criterion`` (VFL / focal / MAL,
L1 + GIoU, FGL, DDF), ``model`` (the detector, RT-DETR's input contract), ``build``
(:func:`build_dfine`, :data:`DFINE_SIZES`).  transformers' ``DFineForObjectDetection`` folders are
:mod:`peg_detr.interop.hf_dfine`'s.
"""

from .build import DFINE_BACKBONES, DFINE_SIZES, build_dfine, dfine_training_parts
from .config import DFineConfig
from .decoder import DFineDecoder, DFineDecoderLayer, DFineDecoderSpec, MSDeformableAttentionV2
from .encoder import DFINE_ENCODINGS, DFineHybridEncoder, RepNCSPELAN4, SCDown
from .model import DFINE

__all__ = [
    "DFINE",
    "DFINE_BACKBONES",
    "DFINE_ENCODINGS",
    "DFINE_SIZES",
    "DFineConfig",
    "DFineDecoder",
    "DFineDecoderLayer",
    "DFineDecoderSpec",
    "DFineHybridEncoder",
    "MSDeformableAttentionV2",
    "RepNCSPELAN4",
    "SCDown",
    "build_dfine",
    "dfine_training_parts",
]
