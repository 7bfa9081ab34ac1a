"""peg_core: conditional positional encodings (PEG) for vision transformers.

Public API::

    from peg_core import PEG2d, PEG3d, build_position_encoding, resize_pos_embed
    from peg_core import RoPEAxial, RoPEMixed, RoPEDinoV3, apply_rope, build_rope
    from peg_core import AttentionBias, ALiBiBias, FIREBias, LookHereBias   # the attention biases
    peg_core.from_timm(timm_model, peg_at=0)   # today's timm ViTs as a CPVT (loads peg_core.interop)

``import peg_core`` is the position-encoding library alone: the PEGs (static, separable,
dynamic), the fixed and learned encodings in 1/2/3-D, the rotary encodings (axial, mixed, DINOv3, 3-D;
``peg_core.rope``), the attention biases (ALiBi-2D, FIRE, LookHere; ``peg_core.bias``), resizing and the grid helpers.  It
depends on torch alone and loads nothing else of the project; the sub-packages are opt-in:
``peg_core.engine`` (training), ``peg_core.interop`` (weights files, surgery, timm /
torchvision conversion), ``peg_core.export`` (ONNX, int8), ``peg_core.classify`` (the CPVT
task), ``peg_core.models`` (CPVT and its ViT layers), ``peg_core.viz``.
"""

from .base import PositionEncoding
from .bias import ALiBiBias, AttentionBias, FIREBias, LookHereBias, with_key_padding
from .encodings import (
    LearnedPositionEncoding2d,
    LearnedPositionEncoding3d,
    NoPositionEncoding,
    SinCosPositionEncoding2d,
    SinCosPositionEncoding3d,
    SinePositionEncoding2d,
    sincos_1d,
    sincos_2d,
)
from .peg import (
    PEG2d,
    PEG3d,
    PEGNd,
    PegOptions,
    check_mask,
    check_size,
    check_tokens,
    grid_to_tokens,
    tokens_to_grid,
)
from .registry import (
    Encoding,
    EncodingContext,
    EncodingParts,
    EncodingSpec,
    EncodingSupport,
    PosEncError,
    build_encoding_parts,
    build_position_encoding,
    encoding_names,
    parse_pos_enc,
    register_encoding,
)
from .resize import (
    infer_grid,
    is_tracing,
    resize_pos_embed,
    resize_pos_embed_1d,
    resize_pos_embed_3d,
    resize_pos_embed_traceable,
)
from .rope import (
    ROPE_KINDS,
    ROTARY_KINDS,
    RoPEAxial,
    RoPEDinoV3,
    RoPEMixed,
    RotaryEmbedding,
    RotaryKind,
    apply_rope,
    build_rope,
    rope_coords,
    rotary_kind,
)

__version__ = "0.1.0"

__all__ = [
    "ROPE_KINDS",
    "ROTARY_KINDS",
    "ALiBiBias",
    "AttentionBias",
    "Encoding",
    "EncodingContext",
    "EncodingParts",
    "EncodingSpec",
    "EncodingSupport",
    "FIREBias",
    "LearnedPositionEncoding2d",
    "LearnedPositionEncoding3d",
    "LookHereBias",
    "NoPositionEncoding",
    "PEG2d",
    "PEG3d",
    "PEGNd",
    "PegOptions",
    "PosEncError",
    "PositionEncoding",
    "RoPEAxial",
    "RoPEDinoV3",
    "RoPEMixed",
    "RotaryEmbedding",
    "RotaryKind",
    "SinCosPositionEncoding2d",
    "SinCosPositionEncoding3d",
    "SinePositionEncoding2d",
    "apply_rope",
    "build_encoding_parts",
    "build_position_encoding",
    "build_rope",
    "check_mask",
    "check_size",
    "check_tokens",
    "encoding_names",
    "grid_to_tokens",
    "infer_grid",
    "is_tracing",
    "parse_pos_enc",
    "register_encoding",
    "resize_pos_embed",
    "resize_pos_embed_1d",
    "resize_pos_embed_3d",
    "resize_pos_embed_traceable",
    "rope_coords",
    "rotary_kind",
    "sincos_1d",
    "sincos_2d",
    "tokens_to_grid",
    "with_key_padding",
]

#: names served from an opt-in sub-package on first use, so ``import peg_core`` stays torch-only
_LAZY = {"from_timm": "peg_core.interop.from_timm", "from_timm_file": "peg_core.interop.from_timm"}


def __getattr__(name: str) -> object:
    """``peg_core.from_timm`` / ``from_timm_file``: imported from :mod:`peg_core.interop` when first asked for."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'peg_core' has no attribute {name!r}")
