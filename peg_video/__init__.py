"""peg_video: a space-time PEG, a video transformer for action recognition, Kinetics data and evaluation.

Public API::

    from peg_video import PEG3d, inflate_peg2d, build_video_model, load_2d_checkpoint, from_hf

Depends on peg_core, torch, torchvision; decord and pytorchvideo for data and the X3D baselines.
"""

from peg_core import PEG3d

from .interop import LoadReport, from_hf, inflate_peg2d, load_2d_checkpoint
from .models import (
    LearnedPositionEncoding3d,
    SinCosPositionEncoding3d,
    VideoTransformer,
    build_video_model,
    list_video_models,
)

__version__ = "0.1.0"

__all__ = [
    "LearnedPositionEncoding3d",
    "LoadReport",
    "PEG3d",
    "SinCosPositionEncoding3d",
    "VideoTransformer",
    "build_video_model",
    "from_hf",
    "inflate_peg2d",
    "list_video_models",
    "load_2d_checkpoint",
]
