"""Hungarian matching between predictions and ground-truth boxes (DETR's set assignment)."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.ops import box_convert, generalized_box_iou

from peg_core.errors import NonFiniteError, require

__all__ = [
    "DETR_COSTS",
    "HungarianMatcher",
    "MatchCosts",
    "focal_class_cost",
    "match_by_query_count",
    "match_cost",
]


def focal_class_cost(logits: Tensor, tgt_labels: Tensor, alpha: float = 0.25, gamma: float = 2.0) -> Tensor:
    """Focal-loss class cost ``(N, M)`` of sigmoid logits ``(N, K)`` for target labels ``(M,)``.

    With ``p = sigmoid(logit[label])``: ``alpha (1 - p)^gamma (-log p) - (1 - alpha) p^gamma (-log(1 - p))``,
    the focal loss of calling the query positive minus that of calling it negative (Deformable
    DETR / RT-DETR's matching cost).  The logs are taken as softplus of the logit, finite for any logit.
    """
    x = logits.float()[:, tgt_labels]
    prob = x.sigmoid()
    pos = alpha * (1 - prob).pow(gamma) * F.softplus(-x)
    neg = (1 - alpha) * prob.pow(gamma) * F.softplus(x)
    return pos - neg


class MatchCosts(NamedTuple):
    """The settings of the matching cost :func:`match_cost` (default: DETR's).

    Attributes:
        cls, bbox, giou: the weights of the class, L1 and GIoU terms (DETR: 1, 5, 2).
        focal: ``(alpha, gamma)`` of :func:`focal_class_cost`, the class term of sigmoid logits
            (the RT-DETR family's); None: DETR's softmax probability.
    """

    cls: float = 1.0
    bbox: float = 5.0
    giou: float = 2.0
    focal: tuple[float, float] | None = None


#: DETR's matching cost: class 1 (softmax), L1 5, GIoU 2
DETR_COSTS = MatchCosts()


def match_cost(
    logits: Tensor, boxes: Tensor, tgt_labels: Tensor, tgt_boxes: Tensor, costs: MatchCosts = DETR_COSTS
) -> Tensor:
    """Pairwise matching cost ``(N, M)`` between ``N`` predictions and ``M`` targets.

    ``cost = -costs.cls * p[label] + costs.bbox * L1(box, tgt) - costs.giou * GIoU(box, tgt)``
    with ``p`` the softmax over the ``num_classes + 1`` logits ``(N, K+1)`` and
    boxes ``(N, 4)`` / ``(M, 4)`` in normalised cxcywh.  The class term uses the
    probability rather than its log, as DETR does, so all terms are bounded.
    With ``costs.focal`` the logits ``(N, K)`` are sigmoid scores (no "no object" class) and
    the class term is ``costs.cls * focal_class_cost(...)`` (RT-DETR's matcher).
    """
    if costs.focal is not None:
        class_term = focal_class_cost(logits, tgt_labels, *costs.focal)
    else:
        class_term = -logits.float().softmax(-1)[:, tgt_labels]
    boxes = boxes.float()
    tgt_boxes = tgt_boxes.float()
    l1 = torch.cdist(boxes, tgt_boxes, p=1)
    giou = generalized_box_iou(box_convert(boxes, "cxcywh", "xyxy"), box_convert(tgt_boxes, "cxcywh", "xyxy"))
    return costs.bbox * l1 + costs.cls * class_term - costs.giou * giou


class HungarianMatcher(nn.Module):
    """One-to-one assignment of each image's targets to its queries, minimising :func:`match_cost`.

    ``forward(outputs, targets)`` with ``outputs["pred_logits"]`` ``(B, Q, K+1)``,
    ``outputs["pred_boxes"]`` ``(B, Q, 4)`` and ``targets[b]["labels"]`` ``(M_b,)``,
    ``targets[b]["boxes"]`` ``(M_b, 4)`` returns, per image, ``(query_idx, target_idx)``
    int64 tensors of length ``min(Q, M_b)`` (query indices ascending).
    ``focal=True`` uses :func:`focal_class_cost` on sigmoid logits ``(B, Q, K)`` (RT-DETR:
    ``HungarianMatcher(2.0, 5.0, 2.0, focal=True)``).
    """

    def __init__(
        self,
        cost_class: float = 1.0,
        cost_bbox: float = 5.0,
        cost_giou: float = 2.0,
        *,
        focal: bool = False,
        focal_alpha: float = 0.25,
        focal_gamma: float = 2.0,
    ) -> None:
        super().__init__()
        if cost_class == 0 and cost_bbox == 0 and cost_giou == 0:
            raise ValueError("all matching costs are 0: set at least one of cost_class/cost_bbox/cost_giou")
        #: the settings as the one value :func:`match_cost` takes
        self.costs = MatchCosts(
            cost_class, cost_bbox, cost_giou, (focal_alpha, focal_gamma) if focal else None
        )

    @property
    def focal(self) -> bool:
        """Whether the class cost is the focal one (sigmoid logits, no "no object" class)."""
        return self.costs.focal is not None

    @torch.no_grad()
    def forward(
        self, outputs: dict[str, Tensor], targets: list[dict[str, Tensor]]
    ) -> list[tuple[Tensor, Tensor]]:
        return self.match_layers([outputs], targets)[0]

    @torch.no_grad()
    def match_layers(
        self,
        layers: list[dict[str, Tensor]],
        targets: list[dict[str, Tensor]],
        num_classes: int | None = None,
    ) -> list[list[tuple[Tensor, Tensor]]]:
        """:meth:`forward` for several decoder layers' outputs with one device-to-host copy.

        The cost matrices of all ``L`` layers ``(L, B, Q, M)`` (and, with
        ``num_classes``, the concatenated target labels, to check their range
        on the host) travel in a single transfer: the only synchronisation of a
        DETR training step.  Returns ``L`` lists of per-image ``(query_idx, target_idx)``.

        Raises:
            ValueError: targets that do not fit the batch, labels outside ``[0, num_classes)``.
            peg_core.errors.NonFiniteError: a NaN/inf cost (predictions of a diverged model); a
                ``ValueError`` too, which :func:`peg_core.engine.fit` turns into its NaN/inf stop.
        """
        logits = layers[0]["pred_logits"]
        if len(targets) != logits.shape[0]:
            raise ValueError(f"{len(targets)} targets for a batch of {logits.shape[0]} predictions")
        b, q = logits.shape[:2]
        sizes = [len(t["boxes"]) for t in targets]
        empty = torch.empty(0, dtype=torch.int64)
        if sum(sizes) == 0:
            return [[(empty, empty) for _ in targets] for _ in layers]
        labels = torch.cat([t["labels"] for t in targets])
        tgt_boxes = torch.cat([t["boxes"] for t in targets])
        # Out-of-range labels are reported after the transfer; clamped meanwhile so the
        # cost's gather cannot fault on the device.
        safe = labels.clamp(0, logits.shape[-1] - 1)
        # One cost matrix for all layers and images, then one block per image: fewer kernel launches.
        cost = match_cost(
            torch.cat([o["pred_logits"].flatten(0, 1) for o in layers]),
            torch.cat([o["pred_boxes"].flatten(0, 1) for o in layers]),
            safe,
            tgt_boxes,
            self.costs,
        )
        host = torch.cat([cost.flatten(), labels.to(cost.dtype)]).cpu()
        cost, host_labels = host[: cost.numel()].view(len(layers), b, q, -1), host[cost.numel() :]
        if num_classes is not None:
            for i, lab in enumerate(host_labels.to(torch.int64).split(sizes)):
                if lab.numel() and (int(lab.min()) < 0 or int(lab.max()) >= num_classes):
                    raise ValueError(
                        f"target {i}: labels {lab.tolist()} outside [0, num_classes={num_classes})"
                    )
        if not torch.isfinite(cost).all():
            # A diverged model's predictions (the targets are checked finite where they are read):
            # no assignment exists; the training engine stops the run on this error.
            raise NonFiniteError(
                "the matching cost has NaN/inf entries (non-finite pred_logits or pred_boxes)"
            )
        # Imported here so that building a model needs no scipy (tools/gpu_check.py runs with torch alone).
        linear_sum_assignment = require(
            "scipy.optimize", None, "scipy", what="matching"
        ).linear_sum_assignment

        out = []
        for layer_cost in cost:
            indices = []
            for i, block in enumerate(layer_cost.split(sizes, dim=-1)):
                rows, cols = linear_sum_assignment(block[i].numpy())
                indices.append(
                    (torch.as_tensor(rows, dtype=torch.int64), torch.as_tensor(cols, dtype=torch.int64))
                )
            out.append(indices)
        return out


def match_by_query_count(
    matcher: Any, layers: list[dict[str, Tensor]], targets: list[dict[str, Tensor]], num_classes: int
) -> list[list[tuple[Tensor, Tensor]]]:
    """``matcher.match_layers`` over layers of different query counts: per layer, the per-image host matches.

    Layers with the same number of queries (normally all: the encoder proposals are the top-``Q``)
    share one call, so one device-to-host copy.  ``matcher``: a :class:`HungarianMatcher` or any
    object with its ``match_layers``.
    """
    groups: dict[int, list[int]] = {}
    for i, o in enumerate(layers):
        groups.setdefault(o["pred_logits"].shape[1], []).append(i)
    per_layer: list[Any] = [None] * len(layers)
    for members in groups.values():
        matched = matcher.match_layers([layers[i] for i in members], targets, num_classes)
        for i, m in zip(members, matched):
            per_layer[i] = m
    return per_layer
