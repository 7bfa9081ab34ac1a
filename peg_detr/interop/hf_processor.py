"""The ``preprocessor_config.json`` of an exported detector folder: the input transformers feeds the model.

transformers' ``pipeline("object-detection", model=folder)`` and ``AutoImageProcessor.from_pretrained``
read it; without it they fail (``Can't load image processor``), and with transformers' default size
(640 / 800) they feed another size than the run evaluated at.  Each export writes the processor
transformers pairs with the model, at the size the checkpoint's run evaluates at (its ``--val-size``)
and with the normalisation the model expects, so the pipeline computes what ``predict`` computes:

==========================  ======================  ===============================================
model                       processor               input
==========================  ======================  ===============================================
RT-DETR, D-FINE,            ``RTDetrImageProcessor`` ``size x size`` (bilinear, antialiased), pixels
DEIMv2 (HGNetv2)                                    in ``[0, 1]``: rescaled by 1/255, not normalised
DEIMv2 (DINOv3 ViT)         ``RTDetrImageProcessor`` the same, then ImageNet mean / std: peg_detr's
                                                    backbone standardises inside, transformers' takes
                                                    standardised pixels
RF-DETR                     ``RfDetrImageProcessor`` ``size x size`` (a multiple of patch x windows),
                                                    ImageNet mean / std (standardised inside here too)
DETR                        ``DetrImageProcessor``  short side ``size``, long side at most
                                                    ``round(size * 1333 / 800)``, ImageNet mean / std
==========================  ======================  ===============================================

The pipeline's post-processing is the processor's ``post_process_object_detection`` (RT-DETR family:
sigmoid scores, top-k over queries x classes; DETR: softmax without the no-object class), which is
what peg_detr's post-processors compute; it rounds boxes to whole pixels.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from peg_core.interop.hf_folder import read_json_object

from ..structures import IMAGENET_MEAN, IMAGENET_STD

__all__ = [
    "DETR_EVAL_SIZE",
    "DETR_MAX_SIDE_RATIO",
    "HF_STRIDE",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "PREPROCESSOR_CONFIG",
    "RTDETR_EVAL_SIZE",
    "detr_processor_config",
    "hf_side",
    "processor_side",
    "rfdetr_processor_config",
    "rtdetr_processor_config",
]

#: the file transformers reads an image processor from
PREPROCESSOR_CONFIG = "preprocessor_config.json"
#: DETR's long-side cap for a short side (800 -> 1333), as peg_detr's evaluation scales it
DETR_MAX_SIDE_RATIO = 1333 / 800
#: the sides an export writes when the run recorded none (DETR's short side, the RT-DETR family's square)
DETR_EVAL_SIZE = 800
RTDETR_EVAL_SIZE = 640
#: the stride transformers' RT-DETR, D-FINE and DEIMv2 need the input side to be a multiple of
HF_STRIDE = 32
#: PIL's BILINEAR, which transformers' torchvision backend maps to bilinear with antialiasing
_BILINEAR = 2


def _common(normalize: bool) -> dict[str, Any]:
    return {
        "do_resize": True,
        "resample": _BILINEAR,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": normalize,
        "image_mean": list(IMAGENET_MEAN),
        "image_std": list(IMAGENET_STD),
        "format": "coco_detection",
        "do_convert_annotations": True,
    }


def _side(size: int) -> int:
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"the processor's size must be a positive int; got {size!r}")
    return size


def rtdetr_processor_config(size: int | None = None, normalize: bool = False) -> dict[str, Any]:
    """``RTDetrImageProcessor``'s config: a square resize to ``size`` (the run's ``--val-size``), pixels
    in ``[0, 1]``; ``normalize``: then ImageNet mean / std (DEIMv2's DINOv3 backbones).  ``None``: 640.

    A side that is not a multiple of 32 is rounded up to one (:func:`hf_side`): transformers' RT-DETR
    family runs only at such sides (its FPN concatenates a map of ``ceil(side / 16)`` cells with one
    upsampled from ``ceil(side / 32)``; at 80 px, 5 and 6), where peg_detr's runs at any.
    """
    side = hf_side(_side(RTDETR_EVAL_SIZE if size is None else size))
    return {
        "image_processor_type": "RTDetrImageProcessor",
        "size": {"height": side, "width": side},
        "do_pad": False,
        **_common(normalize),
    }


def rfdetr_processor_config(size: int | None = None, multiple: int = 1) -> dict[str, Any]:
    """``RfDetrImageProcessor``'s config: a square resize to ``size`` (the run's ``--val-size``; ``None``:
    640) rounded up to a multiple of ``multiple`` (the model's ``patch_size * num_windows``: transformers'
    windows must tile the patch grid), ImageNet mean / std (peg_detr's RF-DETR standardises inside)."""
    side = _side(RTDETR_EVAL_SIZE if size is None else size)
    side = -(-side // multiple) * multiple
    return {
        "image_processor_type": "RfDetrImageProcessor",
        "size": {"height": side, "width": side},
        "do_pad": False,
        **_common(True),
    }


def hf_side(side: int) -> int:
    """The side an RT-DETR-family folder's processor resizes to: ``side`` rounded up to a multiple of 32."""
    return -(-side // HF_STRIDE) * HF_STRIDE


def detr_processor_config(size: int | None = None, max_size: int | None = None) -> dict[str, Any]:
    """``DetrImageProcessor``'s config: the short side to ``size`` (the run's ``--val-size``), the long
    side at most ``max_size`` (default DETR's ratio, :data:`DETR_MAX_SIDE_RATIO`), ImageNet mean / std,
    images of a batch padded to the largest (with its pixel mask).  ``None``: 800."""
    side = _side(DETR_EVAL_SIZE if size is None else size)
    longest = round(side * DETR_MAX_SIDE_RATIO) if max_size is None else _side(max_size)
    return {
        "image_processor_type": "DetrImageProcessor",
        "size": {"shortest_edge": side, "longest_edge": longest},
        "do_pad": True,
        **_common(True),
    }


def processor_side(folder: str | os.PathLike) -> int | None:
    """The side a folder's ``preprocessor_config.json`` resizes to (square ``height``, else ``shortest_edge``).

    ``predict`` and ``Predictor`` on a folder evaluate at it, as transformers' pipeline does; ``None``
    when the folder has no such file or it names no size (the architecture's default is used then).
    A malformed file is a :class:`~peg_core.interop.WeightsError` naming it.
    """
    path = Path(folder) / PREPROCESSOR_CONFIG
    if not path.is_file():
        return None
    size = read_json_object(path, "image processor config").get("size")
    if not isinstance(size, dict):
        return None
    side = size.get("height", size.get("shortest_edge"))
    return side if isinstance(side, int) and not isinstance(side, bool) and side > 0 else None
