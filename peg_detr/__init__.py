"""peg_detr: DETR with PEG position encodings (CPVT), COCO data and evaluation.

Public API for embedding the detector::

    from peg_detr import build_detr, from_hf, load_official_checkpoint

    model, criterion, postprocessor = build_detr("resnet50", pos_enc="peg", num_classes=91)
    outputs = model([image_a, image_b])          # (3, H, W) tensors of any sizes
    losses = criterion(outputs, targets)         # dict; criterion.weight_dict weights them
    detections = postprocessor(outputs, orig_sizes)

    model, report = from_hf("path/to/hf_folder", pos_enc="peg")  # DETR or RT-DETR config.json

Depends on peg_core, torch, torchvision and scipy.
"""

from .interop import LoadReport, from_hf, load_official_checkpoint
from .models import DETR, HungarianMatcher, PostProcess, SetCriterion, build_detr
from .structures import ImageBatch, pad_images

__version__ = "0.1.0"

__all__ = [
    "DETR",
    "HungarianMatcher",
    "ImageBatch",
    "LoadReport",
    "PostProcess",
    "SetCriterion",
    "build_detr",
    "from_hf",
    "load_official_checkpoint",
    "pad_images",
]
