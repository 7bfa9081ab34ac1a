"""DETR with a pluggable encoder position encoding (PEG by default).

Public API::

    from peg_core.engine import param_groups
    from peg_detr.interop import load_official_checkpoint
    from peg_detr.models import build_detr

    model, criterion, postprocessor = build_detr("resnet50", pos_enc="peg")
    load_official_checkpoint(model, "detr-r50-e632da11.pth")  # PEG starts at zero
    groups = param_groups(model, 1e-4, decay_1d=True, lr_by_prefix={"backbone.": 1e-5})
    optimizer = torch.optim.AdamW(groups, lr=1e-4)

One folder per detector family, each with its typed config (``config``), builder (``build``) and
modules: ``detr/`` (DETR), ``rtdetr/``, ``dfine/``, ``deimv2/``; shared: ``config`` (the configs'
mechanism: fields' flags and Hugging Face names), ``matcher`` (Hungarian matching), ``common``
(the input batch, target checks, label masking).  Outside weights (official DETR files, Hugging Face folders) are :mod:`peg_detr.interop`'s;
nothing here imports it.
"""

from . import detr
from .common import to_image_batch
from .config import DetectorConfig
from .detr import *  # noqa: F403  DETR's public names are the package's (detr.__all__, listed once)
from .matcher import HungarianMatcher, match_cost

__all__ = [*detr.__all__, "DetectorConfig", "HungarianMatcher", "match_cost", "to_image_batch"]
