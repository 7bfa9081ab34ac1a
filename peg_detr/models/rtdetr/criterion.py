"""RT-DETR's losses: varifocal class loss + L1 + GIoU, on the last decoder layer, every earlier
layer, the encoder's top-K proposals and the denoising queries.

Targets are peg_detr's DETR targets: dicts with ``labels`` int64 ``(M,)`` in ``[0, num_classes)``
and ``boxes`` ``(M, 4)`` normalised cxcywh.  Logits are sigmoid scores ``(B, Q, num_classes)``
(no "no object" column).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torchvision.ops import box_convert, generalized_box_iou_loss

from ..common import (
    DetectionCriterion,
    MatchedTargets,
    check_targets,
    concat_targets,
    device_indices,
    loss_weights,
)
from ..matcher import HungarianMatcher, match_by_query_count

__all__ = [
    "RTDETR_WEIGHTS",
    "RTDETRCriterion",
    "build_rtdetr_weight_dict",
    "denoising_indices",
    "paired_iou",
    "varifocal_loss",
    "weight_suffixes",
]

LOSSES = ("vfl", "boxes")
#: RT-DETR's loss weights, ``loss key -> weight`` of the last layer's losses (every copy weighs the same)
RTDETR_WEIGHTS: Mapping[str, float] = MappingProxyType({"loss_vfl": 1.0, "loss_bbox": 5.0, "loss_giou": 2.0})


def build_rtdetr_weight_dict(
    weights: Mapping[str, float] = RTDETR_WEIGHTS,
    *,
    dec_layers: int = 6,
    aux_loss: bool = True,
    denoising: bool = True,
) -> dict[str, float]:
    """The weight dict: ``weights`` (keys missing there: :data:`RTDETR_WEIGHTS`') for every output's copy.

    Suffixes: :func:`weight_suffixes`.
    """
    base = loss_weights(RTDETR_WEIGHTS, weights, "RT-DETR")
    return {k + s: w for s in weight_suffixes(dec_layers, aux_loss, denoising) for k, w in base.items()}


def weight_suffixes(dec_layers: int, aux_loss: bool, denoising: bool) -> list[str]:
    """The loss keys' suffixes of an RT-DETR-like model's outputs: ``""`` (the last layer), with
    ``aux_loss`` ``_aux_i`` for the ``dec_layers - 1`` earlier decoder layers and ``_enc_0`` for the
    encoder proposals; with ``denoising``, ``_dn_i`` for the denoising queries of all ``dec_layers``
    layers (the model returns those whenever it used a denoising group)."""
    suffixes = [""]
    if aux_loss:
        suffixes += [f"_aux_{i}" for i in range(dec_layers - 1)] + ["_enc_0"]
    if denoising:
        suffixes += [f"_dn_{i}" for i in range(dec_layers)]
    return suffixes


def paired_iou(boxes1: Tensor, boxes2: Tensor) -> Tensor:
    """IoU ``(N,)`` of each row pair of xyxy boxes ``(N, 4)`` (the diagonal of ``box_iou``, in O(N))."""
    lt = torch.maximum(boxes1[:, :2], boxes2[:, :2])
    rb = torch.minimum(boxes1[:, 2:], boxes2[:, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    area1 = (boxes1[:, 2:] - boxes1[:, :2]).prod(-1)
    area2 = (boxes2[:, 2:] - boxes2[:, :2]).prod(-1)
    return inter / (area1 + area2 - inter)


def varifocal_loss(
    logits: Tensor, positive: Tensor, score: Tensor, alpha: float = 0.75, gamma: float = 2.0
) -> Tensor:
    """Varifocal loss summed over all entries of ``logits`` ``(..., C)``.

    ``positive`` (bool, same shape) marks each matched query's target class and ``score`` holds
    the IoU-aware target there (0 elsewhere).  A binary cross-entropy towards ``score``, weighted
    by the target itself on positives (high-IoU matches count most) and by
    ``alpha * sigmoid(logit)^gamma`` on negatives (confident false positives count most, easy
    negatives hardly at all).  The weights are constants (no gradient through them).
    """
    prob = logits.detach().sigmoid()
    weight = torch.where(positive, score, alpha * prob.pow(gamma))
    return F.binary_cross_entropy_with_logits(logits, score, weight=weight, reduction="sum")


class RTDETRCriterion(DetectionCriterion):
    """Losses of RT-DETR for the outputs of ``peg_detr.models.rtdetr.RTDETR`` and a list of targets.

    ``forward(outputs, targets)`` returns a dict of scalars, each normalised by the number of
    target boxes (summed over processes and divided by the world size, at least 1, as
    :class:`~peg_detr.models.SetCriterion` does):

    * ``loss_vfl``: :func:`varifocal_loss` over all queries and classes, the target score of a
      matched query being the IoU of its (detached) predicted box with its target;
    * ``loss_bbox`` (L1) and ``loss_giou`` (``1 - GIoU``) of the matched boxes;
    * the same with suffix ``_aux_i`` for ``outputs["aux_outputs"][i]``, ``_enc_i`` for
      ``outputs["enc_aux_outputs"][i]`` (each Hungarian-matched on its own) and ``_dn_i`` for
      ``outputs["dn_aux_outputs"][i]``, matched by construction through
      ``outputs["dn_meta"]["dn_positive_idx"]`` and normalised by ``num_boxes * dn_num_group``.

    ``outputs``: ``pred_logits`` ``(B, Q, num_classes)``, ``pred_boxes`` ``(B, Q, 4)`` normalised
    cxcywh.  The total is :meth:`total` (``sum(losses[k] * weight_dict[k])``).
    """

    def __init__(
        self,
        num_classes: int,
        *,
        matcher: HungarianMatcher | None = None,
        weight_dict: dict[str, float] | None = None,
        alpha: float = 0.75,
        gamma: float = 2.0,
        losses: tuple[str, ...] = LOSSES,
        dec_layers: int = 6,
    ) -> None:
        super().__init__()
        unknown = sorted(set(losses) - set(LOSSES))
        if unknown:
            raise ValueError(f"unknown RT-DETR losses {unknown}: choose from {list(LOSSES)}")
        self.num_classes = num_classes
        self.matcher = matcher if matcher is not None else HungarianMatcher(2.0, 5.0, 2.0, focal=True)
        if not getattr(self.matcher, "focal", True):
            raise ValueError("RT-DETR's logits are sigmoid scores: its matcher needs focal=True")
        self.weight_dict = (
            dict(weight_dict) if weight_dict is not None else build_rtdetr_weight_dict(dec_layers=dec_layers)
        )
        self.alpha = alpha
        self.gamma = gamma
        self.losses = tuple(losses)

    def compute(
        self, outputs: dict[str, Any], targets: list[dict[str, Tensor]], num_boxes: Tensor
    ) -> dict[str, Tensor]:
        """RT-DETR's losses: every layer's, the proposals' and the denoising ones, normalised by ``num_boxes``."""
        device = outputs["pred_logits"].device
        labels, boxes = concat_targets(targets, device)

        named = [("", outputs)]
        named += [(f"_aux_{i}", o) for i, o in enumerate(outputs.get("aux_outputs", []))]
        named += [(f"_enc_{i}", o) for i, o in enumerate(outputs.get("enc_aux_outputs", []))]
        indices = self._match([o for _, o in named], targets, device)
        losses: dict[str, Tensor] = {}
        for (suffix, out), index in zip(named, indices):
            matched = MatchedTargets(labels, boxes, index, num_boxes)
            losses.update(_suffixed(self._layer_losses(out, matched), suffix))

        dn_outputs = outputs.get("dn_aux_outputs", [])
        if dn_outputs:
            # every denoising layer reconstructs the same targets: one matched set for all
            dn_matched = MatchedTargets(
                labels, boxes, *denoising_targets(outputs, "dn_aux_outputs", targets, num_boxes)
            )
            for i, out in enumerate(dn_outputs):
                losses.update(_suffixed(self._layer_losses(out, dn_matched), f"_dn_{i}"))
        return losses

    def check(self, outputs: dict[str, Any], targets: list[dict[str, Tensor]]) -> None:
        check_sigmoid_outputs(outputs, targets, self.num_classes)

    def _match(
        self, layers: list[dict[str, Tensor]], targets: list[dict[str, Tensor]], device: torch.device
    ) -> list[tuple[Tensor, Tensor, Tensor]]:
        """Hungarian indices ``(batch_idx, query_idx, target_idx)`` on ``device`` for each layer.

        Layers with the same number of queries (normally all: the encoder proposals are the
        top-``Q``) share the matcher's single device-to-host copy.
        """
        per_layer = match_by_query_count(self.matcher, layers, targets, self.num_classes)
        return device_indices(per_layer, targets, device)

    def _layer_losses(self, outputs: dict[str, Tensor], matched: MatchedTargets) -> dict[str, Tensor]:
        """The requested losses of one layer against its matched targets."""
        batch_idx, query_idx, _ = matched.index
        num_boxes = matched.num_boxes
        src = outputs["pred_boxes"][batch_idx, query_idx].float()
        tgt = matched.matched_boxes
        src_xyxy, tgt_xyxy = box_convert(src, "cxcywh", "xyxy"), box_convert(tgt, "cxcywh", "xyxy")
        out: dict[str, Tensor] = {}
        if "vfl" in self.losses:
            logits = outputs["pred_logits"].float()
            positive = torch.zeros_like(logits, dtype=torch.bool)
            score = torch.zeros_like(logits)
            cls = matched.matched_labels
            positive[batch_idx, query_idx, cls] = True
            # The IoU is a target, not a prediction: no gradient flows into the boxes through it.
            score[batch_idx, query_idx, cls] = paired_iou(src_xyxy.detach(), tgt_xyxy)
            out["loss_vfl"] = varifocal_loss(logits, positive, score, self.alpha, self.gamma) / num_boxes
        if "boxes" in self.losses:
            out["loss_bbox"] = F.l1_loss(src, tgt, reduction="sum") / num_boxes  # on cxcywh, as DETR
            out["loss_giou"] = generalized_box_iou_loss(src_xyxy, tgt_xyxy, reduction="sum") / num_boxes
        return out


def check_sigmoid_outputs(
    outputs: dict[str, Any], targets: list[dict[str, Tensor]], num_classes: int
) -> None:
    """A ``ValueError`` unless ``pred_logits`` ``(B, Q, num_classes)`` (sigmoid scores, no "no object"
    class) and the targets of ``B`` images fit (:func:`~peg_detr.models.common.check_targets`)."""
    logits = outputs["pred_logits"]
    if logits.shape[-1] != num_classes:
        raise ValueError(
            f"pred_logits has {logits.shape[-1]} classes, the criterion expects num_classes = {num_classes}"
        )
    check_targets(targets, logits.shape[0])


def denoising_targets(
    outputs: dict[str, Any], key: str, targets: list[dict[str, Tensor]], num_boxes: Tensor
) -> tuple[tuple[Tensor, Tensor, Tensor], Tensor]:
    """The denoising queries' matches (:func:`denoising_indices`) and box normaliser ``num_boxes * groups``.

    ``key`` names the denoising outputs in messages (RT-DETR ``dn_aux_outputs``, D-FINE ``dn_outputs``);
    a ``ValueError`` when ``outputs`` has them but no ``dn_meta``.
    """
    meta = outputs.get("dn_meta")
    if meta is None:
        raise ValueError(f"outputs has {key} but no dn_meta (the DenoisingGroup's meta)")
    index = denoising_indices(meta, targets, outputs["pred_logits"].device)
    return index, num_boxes * meta["dn_num_group"]


def denoising_indices(
    meta: dict[str, Any], targets: list[dict[str, Tensor]], device: torch.device
) -> tuple[Tensor, Tensor, Tensor]:
    """``(batch_idx, query_idx, target_idx)`` of the denoising positives, ``target_idx`` into the
    concatenated targets: positive ``g * n_b + j`` of image ``b`` reconstructs its target ``j``."""
    positive, num_group = meta["dn_positive_idx"], meta["dn_num_group"]
    if len(positive) != len(targets):
        raise ValueError(f"dn_meta has positives for {len(positive)} images, the batch has {len(targets)}")
    batch, query, target = [], [], []
    offset = 0
    for b, (idx, t) in enumerate(zip(positive, targets)):
        n = len(t["labels"])
        if idx.numel() != n * num_group:
            raise ValueError(
                f"dn_meta: image {b} has {idx.numel()} denoising positives, expected "
                f"{n} boxes x {num_group} groups = {n * num_group}"
            )
        query.append(idx.to(device, torch.int64))
        batch.append(torch.full((idx.numel(),), b, dtype=torch.int64, device=device))
        target.append((torch.arange(n, device=device) + offset).repeat(num_group))
        offset += n
    return torch.cat(batch), torch.cat(query), torch.cat(target)


def _suffixed(losses: dict[str, Tensor], suffix: str) -> dict[str, Tensor]:
    return {k + suffix: v for k, v in losses.items()}
