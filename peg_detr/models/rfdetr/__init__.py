"""RF-DETR (Robinson et al., 2025, arXiv:2511.09554) in peg_detr: the model, equal to transformers' ``rf_detr``.

Files: ``backbone`` (the DINOv2 ViT with windowed attention, run on the suite's CPVT so its
position encoding comes from the registry: RF-DETR's interpolated table, ``none``, a
zero-initialised PEG after block 0, the rotary and bias kinds; LW-DETR's one-scale projector), ``decoder`` (two-stage query
selection per Group DETR group, the deformable decoder with RT-DETR's layers, the heads),
``model`` (the detector and its output dict).  transformers' ``RfDetrForObjectDetection`` keys
and ``RfDetrConfig`` are read by :mod:`peg_detr.interop.hf_rfdetr`.

``config`` (:class:`RFDETRConfig`: defaults, the published sizes, flags and Hugging Face names
declared once), ``criterion`` (Group DETR matching per group, IA-BCE + L1 + GIoU on every layer and the encoder
proposals, equal to transformers' ``LwDetrForObjectDetectionLoss``) and ``build``
(:func:`build_rfdetr`: model, criterion and post-processor of a config; :func:`rfdetr_training_parts`).

Published sizes (facts for the recipes; COCO val2017 AP as the authors report it, T4 TensorRT FP16).
Sources: the roboflow/rf-detr README (its detection table at commit 021f7136 for N / S / M; the
earlier README's table for base) and rf-detr's documentation (rfdetr.roboflow.com, "Run an RF-DETR
Object Detection Model": L's 56.5 / 75.1 and 33.9 M) and rf-detr's ``config.py`` (resolution, patch, windows, decoder layers, table)::

    size   resolution  patch  windows  table   dec. layers  params   COCO AP50:95  AP50
    N      384         16     2        24x24   2            30.5 M   48.4          67.6
    S      512         16     2        32x32   3            32.1 M   53.0          72.1
    M      576         16     2        36x36   4            33.7 M   54.7          73.6
    L      704         16     2        44x44   4            33.9 M   56.5          75.1
    base   560         14     4        37x37   3            29.0 M   53.3          -

All: a DINOv2-S ViT (384 wide, 12 blocks, 6 heads), ``hidden_dim`` 256, 8 / 16 self- / cross-attention
heads, 2 sampling points, 300 queries, 13 Group DETR groups in training, the P4 projector; feature
stages ``[3, 6, 9, 12]`` (outputs of blocks 2, 5, 8, 11; base: ``[2, 5, 8, 11]``, blocks 1, 4, 7,
10).  (The deprecated first "large", DINOv2-B with a P3 + P5 projector and 128 M parameters, is
not built here: transformers' ``RfDetrConfig`` has the P4 projector only.)
"""

from .backbone import (
    RFDETR_VIT_ENCODINGS,
    C2fLayer,
    ScaleProjector,
    WindowedViTBackbone,
    build_windowed_vit,
    from_windows,
    normalize_pos_enc,
    to_windows,
)
from .build import build_rfdetr, rfdetr_training_parts
from .config import RFDETR_BACKBONES, RFDETR_SIZES, RFDETRConfig
from .criterion import (
    RFDETRCriterion,
    build_rfdetr_weight_dict,
    group_detr_matches,
    group_num_boxes,
    iou_aware_bce_loss,
)
from .decoder import (
    RFDETRDecoder,
    RFDETRDecoderLayer,
    RFDETRLayerSpec,
    box_sine_embedding,
    cell_proposals,
    refine_boxes,
)
from .model import RFDETR, image_cells

__all__ = [
    "RFDETR",
    "RFDETR_BACKBONES",
    "RFDETR_SIZES",
    "RFDETR_VIT_ENCODINGS",
    "C2fLayer",
    "RFDETRConfig",
    "RFDETRCriterion",
    "RFDETRDecoder",
    "RFDETRDecoderLayer",
    "RFDETRLayerSpec",
    "ScaleProjector",
    "WindowedViTBackbone",
    "box_sine_embedding",
    "build_rfdetr",
    "build_rfdetr_weight_dict",
    "build_windowed_vit",
    "cell_proposals",
    "from_windows",
    "group_detr_matches",
    "group_num_boxes",
    "image_cells",
    "iou_aware_bce_loss",
    "normalize_pos_enc",
    "refine_boxes",
    "rfdetr_training_parts",
    "to_windows",
]
