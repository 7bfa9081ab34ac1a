"""DETR's set-prediction losses: Hungarian matching, then class, L1 and GIoU losses.

Targets are dicts with ``labels`` int64 ``(M,)`` in ``[0, num_classes)`` and
``boxes`` ``(M, 4)`` cxcywh normalised by the image's size after augmentation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torchvision.ops import box_convert, generalized_box_iou

from ..common import DetectionCriterion, MatchedTargets, check_targets, concat_targets, device_indices
from ..matcher import HungarianMatcher

__all__ = ["SetCriterion", "build_weight_dict"]


def build_weight_dict(
    ce: float = 1.0, bbox: float = 5.0, giou: float = 2.0, aux_layers: int = 0
) -> dict[str, float]:
    """Loss weights, repeated with suffix ``_i`` for each of the ``aux_layers`` earlier decoder layers."""
    base = {"loss_ce": ce, "loss_bbox": bbox, "loss_giou": giou}
    out = dict(base)
    for i in range(aux_layers):
        out.update({f"{k}_{i}": v for k, v in base.items()})
    return out


class SetCriterion(DetectionCriterion):
    """Losses of DETR for ``outputs`` of :class:`~peg_detr.models.detr.DETR` and a list of targets.

    ``forward(outputs, targets)`` returns a dict of scalars:

    * ``loss_ce``: cross-entropy over all queries, unmatched ones labelled
      no-object (index ``num_classes``) with weight ``eos_coef``;
    * ``loss_bbox``: L1 of the matched boxes, summed and divided by the number
      of target boxes (averaged over processes, at least 1);
    * ``loss_giou``: ``1 - GIoU`` of the matched boxes, normalised the same way;
    * the same three with suffix ``_i`` for each ``outputs["aux_outputs"][i]``;
    * logged, not weighted: ``class_error`` (% of matched queries with the wrong
      class) and ``cardinality_error`` (|#non-no-object predictions - #targets|).

    The total is ``sum(losses[k] * weight_dict[k] for k in weight_dict if k in losses)``
    (:meth:`total`).
    """

    def __init__(
        self,
        num_classes: int,
        matcher: HungarianMatcher,
        weight_dict: dict[str, float],
        eos_coef: float = 0.1,
    ) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.matcher = matcher
        self.weight_dict = dict(weight_dict)
        self.eos_coef = eos_coef
        weight = torch.ones(num_classes + 1)
        weight[-1] = eos_coef
        self.register_buffer("empty_weight", weight, persistent=False)

    def check(self, outputs: dict[str, Tensor], targets: list[dict[str, Tensor]]) -> None:
        b = outputs["pred_logits"].shape[0]
        if outputs["pred_logits"].shape[-1] != self.num_classes + 1:
            raise ValueError(
                f"pred_logits has {outputs['pred_logits'].shape[-1]} classes, the criterion expects "
                f"num_classes + 1 = {self.num_classes + 1}"
            )
        check_targets(targets, b)

    def compute(
        self, outputs: dict[str, Tensor], targets: list[dict[str, Tensor]], num_boxes: Tensor
    ) -> dict[str, Tensor]:
        """DETR's losses: the last layer's and each ``aux_outputs`` layer's, normalised by ``num_boxes``."""
        device = outputs["pred_logits"].device
        layers = [outputs, *outputs.get("aux_outputs", [])]
        # All layers matched with the step's single device-to-host copy, the indices sent back in one copy.
        per_layer = self.matcher.match_layers(layers, targets, self.num_classes)
        flat = device_indices(per_layer, targets, device)
        labels, boxes = concat_targets(targets, device)
        losses = self._losses(outputs, MatchedTargets(labels, boxes, flat[0], num_boxes))
        losses.update(self._logged(outputs, targets, labels, flat[0]))
        for i, aux in enumerate(outputs.get("aux_outputs", [])):
            aux_losses = self._losses(aux, MatchedTargets(labels, boxes, flat[i + 1], num_boxes))
            losses.update({f"{k}_{i}": v for k, v in aux_losses.items()})
        return losses

    def _losses(self, outputs: dict[str, Tensor], matched: MatchedTargets) -> dict[str, Tensor]:
        """Class, L1 and GIoU losses of one layer against its matched targets."""
        logits = outputs["pred_logits"].float()
        batch_idx, query_idx, _ = matched.index
        classes = torch.full(logits.shape[:2], self.num_classes, dtype=torch.int64, device=logits.device)
        classes[batch_idx, query_idx] = matched.matched_labels
        loss_ce = F.cross_entropy(logits.transpose(1, 2), classes, weight=self.empty_weight.to(logits.device))

        src = outputs["pred_boxes"][batch_idx, query_idx].float()
        tgt = matched.matched_boxes
        loss_bbox = F.l1_loss(src, tgt, reduction="sum") / matched.num_boxes
        giou = generalized_box_iou(box_convert(src, "cxcywh", "xyxy"), box_convert(tgt, "cxcywh", "xyxy"))
        loss_giou = (1 - torch.diag(giou)).sum() / matched.num_boxes
        return {"loss_ce": loss_ce, "loss_bbox": loss_bbox, "loss_giou": loss_giou}

    @torch.no_grad()
    def _logged(
        self,
        outputs: dict[str, Tensor],
        targets: list[dict[str, Tensor]],
        labels: Tensor,
        index: tuple[Tensor, Tensor, Tensor],
    ) -> dict[str, Tensor]:
        logits = outputs["pred_logits"]
        batch_idx, query_idx, target_idx = index
        if target_idx.numel():
            correct = (logits[batch_idx, query_idx].argmax(-1) == labels[target_idx]).float().mean()
            class_error = 100.0 * (1 - correct)
        else:
            class_error = logits.new_zeros(())
        n_pred = (logits.argmax(-1) != self.num_classes).sum(1).float()
        n_tgt = torch.tensor([float(len(t["labels"])) for t in targets]).to(logits.device, non_blocking=True)
        return {"class_error": class_error.float(), "cardinality_error": F.l1_loss(n_pred, n_tgt)}
