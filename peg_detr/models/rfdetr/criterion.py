"""RF-DETR's losses: Group DETR matching, the IoU-aware BCE class loss, L1 + GIoU.

What LW-DETR / RF-DETR train with (and transformers' ``LwDetrForObjectDetectionLoss``, which
``RfDetrForObjectDetection(labels=...)`` calls):

* **Group DETR matching.**  In training the decoder runs ``G`` groups of ``Q`` queries (rows
  ``g*Q:(g+1)*Q`` of every output, see :class:`~peg_detr.models.rfdetr.RFDETR`).  Each group is
  Hungarian-matched to the targets on its own (one-to-one within a group), so every target has
  ``G`` positives; the box normaliser counts ``boxes x G`` so each group weighs what one
  ordinary DETR would.  The encoder proposals (each group's own top-``Q`` cells) are matched
  per group the same way.  In eval the model runs one group (its output has no ``num_groups``).
* **IA-BCE** (:func:`iou_aware_bce_loss`): a sigmoid BCE whose positive target is the quality
  ``p^alpha * IoU^(1 - alpha)`` (``alpha = 0.25``), and whose negatives carry the focal weight
  ``p^gamma`` (``gamma = 2``).
* **Boxes**: L1 on cxcywh and ``1 - GIoU`` of the matched pairs.
* The same on every earlier decoder layer (``_aux_i``) and on the encoder proposals (``_enc_0``).
  Weights: class 1, L1 5, GIoU 2; the matcher's costs: class 2 (focal, alpha 0.25, gamma 2), L1 5,
  GIoU 2.

Targets are peg_detr's DETR targets: dicts with ``labels`` int64 ``(M,)`` in ``[0, num_classes)``
and ``boxes`` ``(M, 4)`` normalised cxcywh.  Reused from the RT-DETR family:
:class:`~peg_detr.models.rtdetr.RTDETRCriterion` (its checks, matcher and ``total``),
:func:`~peg_detr.models.rtdetr.criterion.paired_iou`, D-FINE's
:func:`~peg_detr.models.dfine.criterion.paired_giou` and the weight dict's suffixes
(:func:`~peg_detr.models.rtdetr.criterion.weight_suffixes`); the matcher is the project's
:class:`~peg_detr.models.matcher.HungarianMatcher`, run on each group's slice.

Where this differs from transformers' loss (none changes a training loss it computes):

* the groups come from the output's ``num_groups`` (1 in eval), not from the config: transformers'
  loss module splits an eval output into ``group_detr`` groups too;
* a NaN / inf cost is a :class:`~peg_core.errors.NonFiniteError` (the engine stops the run), not a
  cost replaced by the largest float;
* the matcher's focal cost takes its logs as softplus of the logit, not ``log(p + 1e-8)`` (the
  same assignment unless two are within ~1e-7);
* no ``cardinality_error`` (a log, not a loss); a model built without ``aux_loss`` returns no
  encoder proposals, so it has no ``_enc_0`` loss either (transformers always adds it).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torchvision.ops import box_convert

from ..common import MatchedTargets, box_normaliser, concat_targets, device_indices, loss_weights
from ..dfine.criterion import paired_giou
from ..matcher import HungarianMatcher
from ..rtdetr.criterion import RTDETRCriterion, paired_iou, weight_suffixes

__all__ = [
    "RFDETR_WEIGHTS",
    "RFDETRCriterion",
    "build_rfdetr_weight_dict",
    "group_detr_matches",
    "group_num_boxes",
    "iou_aware_bce_loss",
]

#: the class loss's key in the loss dict (transformers and rf-detr call it ``loss_ce``)
CLASS_KEY = "loss_iabce"
#: RF-DETR's loss weights (and transformers' ``RfDetrConfig``'s), ``loss key -> weight``: class 1, L1 5, GIoU 2
RFDETR_WEIGHTS: Mapping[str, float] = MappingProxyType({CLASS_KEY: 1.0, "loss_bbox": 5.0, "loss_giou": 2.0})


def build_rfdetr_weight_dict(
    weights: Mapping[str, float] = RFDETR_WEIGHTS, *, dec_layers: int = 3, aux_loss: bool = True
) -> dict[str, float]:
    """The weight dict: ``weights`` (keys missing there: :data:`RFDETR_WEIGHTS`') with RT-DETR's suffixes.

    ``loss_iabce``, ``loss_bbox``, ``loss_giou``; with ``aux_loss`` the same for ``_aux_i`` (the
    ``dec_layers - 1`` earlier layers) and ``_enc_0`` (the encoder proposals).  No denoising.
    """
    base = loss_weights(RFDETR_WEIGHTS, weights, "RF-DETR")
    return {k + s: w for s in weight_suffixes(dec_layers, aux_loss, denoising=False) for k, w in base.items()}


def iou_aware_bce_loss(
    logits: Tensor, positive: Tensor, iou: Tensor, alpha: float = 0.25, gamma: float = 2.0
) -> Tensor:
    """LW-DETR's IoU-aware BCE (IA-BCE), summed over all entries of ``logits`` ``(..., C)``.

    ``positive`` (bool, same shape) marks each matched query's target class, ``iou`` (same shape)
    the IoU of its box with the target there (a constant; other entries are ignored).  With
    ``p = sigmoid(logit)``:

    * positives: BCE towards the quality ``t = max(p^alpha * IoU^(1 - alpha), 0.01)``, ``t``
      detached: a confident, well-localised match is pushed to a high score, a poor one to a low
      score;
    * negatives: ``p^gamma * -log(1 - p)``, the focal loss's negative term: the weight ``p^gamma``
      is NOT detached (as rf-detr and transformers compute it), so it adds to the gradient.

    The logs are softplus of the logit (finite for any logit).
    """
    prob = logits.sigmoid()
    quality = (prob.detach().pow(alpha) * iou.detach().clamp(min=0).pow(1 - alpha)).clamp(min=0.01)
    pos = quality * F.softplus(-logits) + (1 - quality) * F.softplus(logits)
    neg = prob.pow(gamma) * F.softplus(logits)
    return torch.where(positive, pos, neg).sum()


def group_num_boxes(
    targets: list[dict[str, Tensor]], groups: int, device: torch.device, num_boxes: Tensor | None = None
) -> Tensor:
    """The Group DETR box normaliser: the batch's boxes times ``groups``, over processes.

    Without ``num_boxes``: ``max(sum over processes of boxes x G / world_size, 1)``, as rf-detr and
    transformers clamp it (after multiplying by ``G``: a batch without boxes divides by 1).  With
    ``num_boxes`` (the engine's share of a ``--grad-accum-steps`` step, already over processes and
    clamped at 1, :func:`peg_detr.task.step_num_boxes`): ``num_boxes x G``, which equals the large
    batch's normaliser whenever the step holds at least one box per process.  A device tensor: no
    host synchronisation.
    """
    if num_boxes is not None:
        return num_boxes * groups
    return box_normaliser(groups * sum(len(t["labels"]) for t in targets), device)


def group_detr_matches(
    matcher: HungarianMatcher,
    layers: list[dict[str, Tensor]],
    targets: list[dict[str, Tensor]],
    groups: int,
    num_classes: int | None = None,
) -> list[list[tuple[Tensor, Tensor]]]:
    """Hungarian matches of each layer's ``groups`` query groups, each group matched on its own.

    ``layers``: outputs with ``pred_logits`` ``(B, G*Q, C)`` and ``pred_boxes`` ``(B, G*Q, 4)``,
    group ``g`` at rows ``g*Q:(g+1)*Q``.  Returns per layer, per image, host int64
    ``(query_idx, target_idx)`` of length ``G * min(Q, M_b)``: group ``g``'s matches with its
    query indices offset by ``g*Q`` (groups in order).  All layers and groups go through the
    matcher's one device-to-host copy (:meth:`HungarianMatcher.match_layers`).
    """
    n = layers[0]["pred_logits"].shape[1]
    if groups < 1 or n % groups:
        raise ValueError(f"{n} queries do not split into {groups} Group DETR groups")
    q = n // groups
    sliced = [
        {k: o[k][:, g * q : (g + 1) * q] for k in ("pred_logits", "pred_boxes")}
        for o in layers
        for g in range(groups)
    ]
    host = matcher.match_layers(sliced, targets, num_classes)  # layer-major: L * G lists
    out = []
    for layer in range(len(layers)):
        per_group = host[layer * groups : (layer + 1) * groups]
        out.append(
            [
                (
                    torch.cat([m[b][0] + g * q for g, m in enumerate(per_group)]),
                    torch.cat([m[b][1] for m in per_group]),
                )
                for b in range(len(targets))
            ]
        )
    return out


class RFDETRCriterion(RTDETRCriterion):
    """Losses of RF-DETR for the outputs of :class:`~peg_detr.models.rfdetr.RFDETR` and a list of targets.

    ``forward(outputs, targets, num_boxes=None)`` returns a dict of unweighted scalars (weights:
    :meth:`total`, ``weight_dict``), for the last layer and with suffixes ``_aux_i``
    (``outputs["aux_outputs"][i]``) and ``_enc_i`` (``outputs["enc_aux_outputs"][i]``):

    * ``loss_iabce``: :func:`iou_aware_bce_loss` over all queries of all groups and all classes,
      the IoU of each matched query's (detached) box with its target;
    * ``loss_bbox`` (L1 on cxcywh) and ``loss_giou`` (``1 - GIoU``) of the matched pairs;

    each normalised by :func:`group_num_boxes` (boxes x ``outputs["num_groups"]``, 1 group when
    absent), every output matched by :func:`group_detr_matches`.  ``outputs``: ``pred_logits``
    ``(B, G*Q, C)`` sigmoid logits, ``pred_boxes`` ``(B, G*Q, 4)`` normalised cxcywh, float32.

    Args:
        num_classes: ``C``.
        alpha: IA-BCE's quality exponent (RF-DETR: 0.25).
        dec_layers: decoder layers (for the default weight dict).
        options: :class:`RTDETRCriterion`'s ``matcher`` (RF-DETR's is its default: costs class 2
            focal, L1 5, GIoU 2), ``weight_dict`` (default: :func:`build_rfdetr_weight_dict` of
            ``dec_layers``) and ``gamma`` (IA-BCE's focal exponent, 2).
    """

    def __init__(self, num_classes: int, *, alpha: float = 0.25, dec_layers: int = 3, **options: Any) -> None:
        # The parent's checks, matcher, weights and ``total``; the losses are :meth:`_layer_losses`.
        if options.get("weight_dict") is None:
            options["weight_dict"] = build_rfdetr_weight_dict(dec_layers=dec_layers)
        super().__init__(num_classes, alpha=alpha, **options)

    def forward(
        self, outputs: dict[str, Any], targets: list[dict[str, Tensor]], num_boxes: Tensor | None = None
    ) -> dict[str, Tensor]:
        """The losses of ``outputs`` against ``targets``.

        ``num_boxes``: the engine's normaliser of a ``--grad-accum-steps`` micro-batch (boxes of the
        optimizer step over processes x the micro-batch's share); it is multiplied by the groups.
        """
        self.check(outputs, targets)
        groups = int(outputs.get("num_groups", 1))
        device = outputs["pred_logits"].device
        norm = group_num_boxes(targets, groups, device, num_boxes)
        labels, boxes = concat_targets(targets, device)

        named: list[tuple[str, dict[str, Tensor]]] = [("", outputs)]
        named += [(f"_aux_{i}", o) for i, o in enumerate(outputs.get("aux_outputs", []))]
        named += [(f"_enc_{i}", o) for i, o in enumerate(outputs.get("enc_aux_outputs", []))]
        host = group_detr_matches(self.matcher, [o for _, o in named], targets, groups, self.num_classes)
        indices = device_indices(host, targets, device)  # one host-to-device copy for all outputs
        losses: dict[str, Tensor] = {}
        for (suffix, out), index in zip(named, indices):
            layer = self._layer_losses(out, MatchedTargets(labels, boxes, index, norm))
            losses.update({k + suffix: v for k, v in layer.items()})
        return losses

    def _layer_losses(self, outputs: dict[str, Tensor], matched: MatchedTargets) -> dict[str, Tensor]:
        """IA-BCE, L1 and GIoU of one output against its matched targets (``num_boxes``: the group
        normaliser)."""
        batch_idx, query_idx, _ = matched.index
        num_boxes = matched.num_boxes
        logits = outputs["pred_logits"].float()
        src = outputs["pred_boxes"][batch_idx, query_idx].float()
        tgt = matched.matched_boxes
        src_xyxy, tgt_xyxy = box_convert(src, "cxcywh", "xyxy"), box_convert(tgt, "cxcywh", "xyxy")
        cls = matched.matched_labels
        positive = torch.zeros_like(logits, dtype=torch.bool)
        positive[batch_idx, query_idx, cls] = True
        iou = torch.zeros_like(logits)
        # The IoU is a target, not a prediction: the boxes get no gradient through the class loss.
        iou[batch_idx, query_idx, cls] = paired_iou(src_xyxy.detach(), tgt_xyxy)
        return {
            CLASS_KEY: iou_aware_bce_loss(logits, positive, iou, self.alpha, self.gamma) / num_boxes,
            "loss_bbox": F.l1_loss(src, tgt, reduction="sum") / num_boxes,  # on cxcywh, as DETR
            # GIoU without torchvision's epsilon (as DETR / rf-detr / transformers): equal gradients
            # for small boxes too
            "loss_giou": (1 - paired_giou(src_xyxy, tgt_xyxy)).sum() / num_boxes,
        }
