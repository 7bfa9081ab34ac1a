"""peg_core: conditional positional encodings (PEG) for vision transformers.

Public API::

    from peg_core import PEG2d, PEG3d, build_position_encoding, resize_pos_embed

Depends on torch alone.
"""

from .base import PositionEncoding
from .encodings import (
    LearnedPositionEncoding2d,
    NoPositionEncoding,
    SinCosPositionEncoding2d,
    SinePositionEncoding2d,
    build_position_encoding,
    sincos_2d,
)
from .peg import PEG2d, PEG3d, PEGNd, check_size, check_tokens, grid_to_tokens, tokens_to_grid
from .resize import infer_grid, resize_pos_embed, resize_pos_embed_1d, resize_pos_embed_3d

__version__ = "0.1.0"

__all__ = [
    "LearnedPositionEncoding2d",
    "NoPositionEncoding",
    "PEG2d",
    "PEG3d",
    "PEGNd",
    "PositionEncoding",
    "SinCosPositionEncoding2d",
    "SinePositionEncoding2d",
    "build_position_encoding",
    "check_size",
    "check_tokens",
    "grid_to_tokens",
    "infer_grid",
    "resize_pos_embed",
    "resize_pos_embed_1d",
    "resize_pos_embed_3d",
    "sincos_2d",
    "tokens_to_grid",
]

# Checkpoint surgery (timm/DeiT, torchvision ViT and CPVT checkpoints).
from .surgery import learned_to_cpvt, resize_checkpoint

__all__ += ["learned_to_cpvt", "resize_checkpoint"]

# Live-model conversion (timm / torchvision ViT -> CPVT); timm itself stays optional (peg_core.timm).
from .convert import convert_to_cpvt  # noqa: E402 (after the base API, as surgery above)

__all__ += ["convert_to_cpvt"]
