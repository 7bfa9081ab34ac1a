"""Video models: the PEG video transformer, X3D baselines and the by-name builder.

Starting one from outside weights (a 2D image checkpoint, a Hugging Face folder) is
:mod:`peg_video.interop`'s.
"""

from peg_core.encodings import LearnedPositionEncoding3d, SinCosPositionEncoding3d, sincos_1d

from .pool import AttentivePool
from .registry import VIT_CONFIGS, build_video_model, list_video_models
from .vit import VIDEO_ENCODINGS, DividedBlock, TubeletEmbed, VideoTransformer
from .x3d import X3D_CONFIGS, build_x3d

__all__ = [
    "VIDEO_ENCODINGS",
    "VIT_CONFIGS",
    "X3D_CONFIGS",
    "AttentivePool",
    "DividedBlock",
    "LearnedPositionEncoding3d",
    "SinCosPositionEncoding3d",
    "TubeletEmbed",
    "VideoTransformer",
    "build_video_model",
    "build_x3d",
    "list_video_models",
    "sincos_1d",
]
