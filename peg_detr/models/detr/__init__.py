"""DETR (Carion et al., 2020) with a pluggable encoder position encoding (PEG by default).

Files: ``config`` (:class:`DETRConfig`, :data:`DETR_ENCODINGS`), ``build`` (:func:`build_detr`),
``backbone`` (ResNets with FrozenBatchNorm2d, the tiny CPU backbone), ``transformer``
(encoder/decoder; where position information enters and why the decoder keeps sine keys by
default), ``model`` (the detector), ``criterion`` (the set loss; matching is
:mod:`peg_detr.models.matcher`'s, shared), ``postprocess`` (COCO boxes).  Official DETR files and
Hugging Face folders are :mod:`peg_detr.interop`'s.
"""

from .backbone import BACKBONES, Joiner, ResNetBackbone, TinyBackbone, build_backbone
from .build import build_detr
from .config import DETR_ENCODINGS, DETRConfig
from .criterion import SetCriterion, build_weight_dict
from .model import DETR, MLP
from .postprocess import PostProcess
from .transformer import DECODER_KEY_POS, Transformer

__all__ = [
    "BACKBONES",
    "DECODER_KEY_POS",
    "DETR",
    "DETR_ENCODINGS",
    "MLP",
    "DETRConfig",
    "Joiner",
    "PostProcess",
    "ResNetBackbone",
    "SetCriterion",
    "TinyBackbone",
    "Transformer",
    "build_backbone",
    "build_detr",
    "build_weight_dict",
]
