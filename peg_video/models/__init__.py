"""Video models: the PEG video transformer, X3D baselines, the by-name builder and 2D initialisation."""

from peg_core.encodings import LearnedPositionEncoding3d, SinCosPositionEncoding3d, sincos_1d

from .init_2d import LoadReport, inflate_patch_embed, load_2d_checkpoint
from .pool import AttentivePool
from .registry import VIT_CONFIGS, build_video_model, list_video_models
from .vit import DividedBlock, TubeletEmbed, VideoTransformer
from .x3d import X3D_CONFIGS, build_x3d

__all__ = [
    "VIT_CONFIGS",
    "X3D_CONFIGS",
    "AttentivePool",
    "DividedBlock",
    "LearnedPositionEncoding3d",
    "LoadReport",
    "SinCosPositionEncoding3d",
    "TubeletEmbed",
    "VideoTransformer",
    "build_video_model",
    "build_x3d",
    "inflate_patch_embed",
    "list_video_models",
    "load_2d_checkpoint",
    "sincos_1d",
]
