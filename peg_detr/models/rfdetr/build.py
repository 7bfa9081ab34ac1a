"""RF-DETR's training parts: the criterion and post-processor that fit a built :class:`~.model.RFDETR`.

The shape of :func:`peg_detr.models.rtdetr.build.rtdetr_training_parts`: ``training_parts(model,
weights...) -> (criterion, postprocessor)``, so the arch entry and a model read from a Hugging
Face ``config.json`` (:func:`peg_detr.interop.hf_rfdetr.rfdetr_from_hf_config`) get the same loss.
"""

from __future__ import annotations

from ..matcher import HungarianMatcher
from ..rtdetr.postprocess import RTDETRPostProcess
from .criterion import RFDETRCriterion, build_rfdetr_weight_dict
from .model import RFDETR

__all__ = ["rfdetr_training_parts"]


def rfdetr_training_parts(
    model: RFDETR, cls: float = 1.0, bbox: float = 5.0, giou: float = 2.0
) -> tuple[RFDETRCriterion, RTDETRPostProcess]:
    """RF-DETR's criterion (Group DETR matching, IA-BCE + L1 + GIoU) and post-processor for ``model``.

    ``cls``, ``bbox``, ``giou``: the loss weights (RF-DETR / transformers' ``RfDetrConfig``: 1, 5, 2),
    copied to every earlier decoder layer and the encoder proposals when the model returns them
    (``model.aux_loss``).  The matcher's costs are RF-DETR's (class 2 focal with alpha 0.25 and
    gamma 2, L1 5, GIoU 2).  The post-processor keeps the ``num_queries`` best (query, class) pairs
    (rf-detr's ``num_select`` is its ``num_queries``, 300).
    """
    dec_layers = len(model.decoder.layers)
    weights = build_rfdetr_weight_dict(cls, bbox, giou, dec_layers=dec_layers, aux_loss=model.aux_loss)
    matcher = HungarianMatcher(2.0, 5.0, 2.0, focal=True, focal_alpha=0.25, focal_gamma=2.0)
    criterion = RFDETRCriterion(
        model.num_classes, matcher=matcher, weight_dict=weights, dec_layers=dec_layers
    )
    return criterion, RTDETRPostProcess(num_top_queries=model.num_queries)
