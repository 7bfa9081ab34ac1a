"""DETR with a pluggable encoder position encoding (PEG by default).

Public API::

    from peg_core.engine import param_groups
    from peg_detr.interop import load_official_checkpoint
    from peg_detr.models import build_detr

    model, criterion, postprocessor = build_detr("resnet50", pos_enc="peg")
    load_official_checkpoint(model, "detr-r50-e632da11.pth")  # PEG starts at zero
    groups = param_groups(model, 1e-4, decay_1d=True, lr_by_prefix={"backbone.": 1e-5})
    optimizer = torch.optim.AdamW(groups, lr=1e-4)

Files: ``backbone`` (ResNets with FrozenBatchNorm2d, the tiny CPU backbone),
``transformer`` (encoder/decoder; where position information enters and why
the decoder keeps sine keys by default), ``detr`` (the detector), ``matcher``
and ``criterion`` (Hungarian matching, losses), ``postprocess`` (COCO boxes), ``build``.
Outside weights (official DETR files, Hugging Face folders) are :mod:`peg_detr.interop`'s;
nothing here imports it.
"""

from .backbone import BACKBONES, Joiner, ResNetBackbone, TinyBackbone, build_backbone
from .build import DETR_ENCODINGS, build_detr
from .criterion import SetCriterion, build_weight_dict
from .detr import DETR, MLP, to_image_batch
from .matcher import HungarianMatcher, match_cost
from .postprocess import PostProcess
from .transformer import DECODER_KEY_POS, Transformer

__all__ = [
    "BACKBONES",
    "DECODER_KEY_POS",
    "DETR",
    "DETR_ENCODINGS",
    "MLP",
    "HungarianMatcher",
    "Joiner",
    "PostProcess",
    "ResNetBackbone",
    "SetCriterion",
    "TinyBackbone",
    "Transformer",
    "build_backbone",
    "build_detr",
    "build_weight_dict",
    "match_cost",
    "to_image_batch",
]
