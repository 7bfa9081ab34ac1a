"""D-FINE's losses (Peng et al., ICLR 2025) and DEIM's matchability-aware loss (Huang et al., CVPR 2025).

On top of RT-DETR's class loss (varifocal or focal) and L1 + GIoU box losses, D-FINE supervises the
per-edge distributions of fine-grained distribution refinement (:mod:`.fdr`):

* **FGL** (fine-grained localisation): each matched edge's ground-truth offset falls between two
  bins of the weighting function :math:`W`; the loss is the cross-entropy towards those two bins,
  weighted by the linear interpolation between them (a distribution focal loss) and by the IoU of
  the predicted box with its target.
* **DDF** (decoupled distillation focal, GO-LSD's self-distillation): every earlier decoder layer's
  distributions are pulled towards the last layer's (detached) ones by a temperature-softened KL
  divergence, weighted per query by the IoU for matched queries and by the teacher's confidence for
  the others, the matched and unmatched means balanced by the square roots of their counts.
* **GO-LSD's union set**: the box and localisation losses of every layer use the union of the
  Hungarian matches of all layers (each query keeping the target it was matched to most often),
  normalised by the size of that union.

DEIM replaces the class loss by **MAL**: a binary cross-entropy towards ``IoU ** gamma`` on the
matched class, weight 1 on positives and ``p ** gamma`` (times an optional ``mal_alpha``) on
negatives, so low-IoU matches still get a useful target.

Targets are peg_detr's DETR targets: dicts with ``labels`` int64 ``(M,)`` in ``[0, num_classes)``
and ``boxes`` ``(M, 4)`` normalised cxcywh.  Logits are sigmoid scores (no "no object" column).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torchvision.ops import box_convert, sigmoid_focal_loss

from ..common import (
    DetectionCriterion,
    MatchedTargets,
    box_normaliser,
    concat_targets,
    device_indices,
    loss_weights,
)
from ..matcher import HungarianMatcher, match_by_query_count
from ..rtdetr.criterion import (
    RTDETR_WEIGHTS,
    check_sigmoid_outputs,
    denoising_targets,
    paired_iou,
    varifocal_loss,
)
from .fdr import weighting_function

__all__ = [
    "DEIM_LOSSES",
    "DFINE_LOSSES",
    "DFINE_WEIGHTS",
    "DFineCriterion",
    "bbox2distance",
    "build_dfine_weight_dict",
    "distillation_loss",
    "fine_grained_localization_loss",
    "matchability_aware_loss",
    "paired_giou",
    "translate_gt",
    "union_matches",
]

LOSSES = ("vfl", "focal", "mal", "boxes", "local")
CLASS_LOSSES = ("vfl", "focal", "mal")
#: D-FINE's losses (with ``alpha=0.75, gamma=2.0``)
DFINE_LOSSES = ("vfl", "boxes", "local")
#: DEIM's losses (with ``gamma=1.5``, ``mal_alpha=None``; weights mal 1, bbox 5, giou 2, fgl 0.15, ddf 1.5)
DEIM_LOSSES = ("mal", "boxes", "local")
#: D-FINE's loss weights, ``loss key -> weight``: RT-DETR's class (any of the class losses) and box
#: weights, FGL 0.15, DDF 1.5 (DEIM's are the same)
DFINE_WEIGHTS: Mapping[str, float] = MappingProxyType(
    {**RTDETR_WEIGHTS, "loss_focal": 1.0, "loss_mal": 1.0, "loss_fgl": 0.15, "loss_ddf": 1.5}
)

Matches = list[tuple[Tensor, Tensor]]


# --------------------------------------------------------------------------------------------
# Pure functions
# --------------------------------------------------------------------------------------------


def bbox2distance(points: Tensor, boxes: Tensor, reg_scale: Tensor | float) -> Tensor:
    """Edge offsets ``(..., 4)`` that turn reference boxes into ``boxes``: the inverse of
    :func:`~peg_detr.models.dfine.fdr.distance2bbox`.

    ``points``: reference boxes ``(..., 4)`` cxcywh; ``boxes``: ``(..., 4)`` cxcywh.  Returns the
    left, top, right, bottom offsets in units of ``w / reg_scale`` (horizontal) and
    ``h / reg_scale`` (vertical) measured outwards from the half-size ``0.5 * reg_scale``, so a box
    equal to its reference gives 0 on every edge.  A ``1e-16`` in the unit keeps a zero-size
    reference finite (D-FINE's guard).
    """
    s = reg_scale.abs() if isinstance(reg_scale, Tensor) else abs(reg_scale)
    cx, cy, w, h = points.unbind(-1)
    x1, y1, x2, y2 = box_convert(boxes, "cxcywh", "xyxy").unbind(-1)
    unit_w, unit_h = w / s + 1e-16, h / s + 1e-16
    return torch.stack(
        [
            (cx - x1) / unit_w - 0.5 * s,
            (cy - y1) / unit_h - 0.5 * s,
            (x2 - cx) / unit_w - 0.5 * s,
            (y2 - cy) / unit_h - 0.5 * s,
        ],
        dim=-1,
    )


def translate_gt(distance: Tensor, project: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Continuous edge offsets -> the two bins around each, with linear interpolation weights.

    ``distance``: any shape (flattened to ``(K,)``), offsets as :func:`bbox2distance` returns;
    ``project``: ``(N + 1,)`` bin offsets :math:`W` (:func:`~peg_detr.models.dfine.fdr.weighting_function`,
    strictly increasing).  Returns ``left`` int64 ``(K,)`` in ``[0, N - 1]`` (the right bin is
    ``left + 1``), ``weight_left`` and ``weight_right`` ``(K,)`` summing to 1:

    * inside ``[W_0, W_N)``: ``left`` is the last bin with ``W_left <= d`` and
      ``weight_right = (d - W_left) / (W_{left+1} - W_left)``;
    * below ``W_0`` (or NaN): all weight on bin 0 (``left = 0``, ``weight_left = 1``);
    * at or above ``W_N``: all weight on bin ``N`` (``left = N - 1``, ``weight_right = 1``).
    """
    n = project.numel() - 1
    d = distance.reshape(-1).to(project.dtype)
    raw = (project.unsqueeze(0) <= d.unsqueeze(1)).sum(1) - 1  # (K,) in [-1, N]
    left = raw.clamp(0, n - 1)
    to_left = (d - project[left]).abs()
    to_right = (project[left + 1] - d).abs()
    weight_right = to_left / (to_left + to_right)
    weight_right = torch.where(raw < 0, 0.0, torch.where(raw >= n, 1.0, weight_right))
    return left, 1.0 - weight_right, weight_right


def fine_grained_localization_loss(
    corners: Tensor, left: Tensor, weight_left: Tensor, weight_right: Tensor, weight: Tensor
) -> Tensor:
    """FGL summed over edges: ``weight * (w_l * CE(corners, left) + w_r * CE(corners, left + 1))``.

    ``corners``: ``(K, N + 1)`` logits of ``K`` edges; ``left``, ``weight_left``, ``weight_right``
    from :func:`translate_gt`; ``weight``: ``(K,)`` (the IoU of the edge's box, a constant).
    A distribution that puts all its mass on the target's two bins in the right proportion has the
    smallest loss (the entropy of ``(w_l, w_r)``; 0 when the offset sits on a bin).
    """
    logp = corners.log_softmax(-1)
    ce_left = -logp.gather(1, left.unsqueeze(1)).squeeze(1)
    ce_right = -logp.gather(1, (left + 1).unsqueeze(1)).squeeze(1)
    return ((ce_left * weight_left + ce_right * weight_right) * weight).sum()


def distillation_loss(student: Tensor, teacher: Tensor, temperature: float = 5.0) -> Tensor:
    """``T^2 * KL(softmax(teacher / T) || softmax(student / T))`` per row: ``(K,)`` for ``(K, N + 1)``
    logits.  No gradient flows into ``teacher``."""
    t = temperature
    log_p = (teacher.detach() / t).log_softmax(-1)
    log_q = (student / t).log_softmax(-1)
    return F.kl_div(log_q, log_p, log_target=True, reduction="none").sum(-1) * (t * t)


def matchability_aware_loss(
    logits: Tensor, positive: Tensor, iou: Tensor, gamma: float = 1.5, alpha: float | None = None
) -> Tensor:
    """DEIM's MAL summed over all entries of ``logits`` ``(..., C)``.

    ``positive`` (bool, same shape) marks each matched query's target class, ``iou`` (same shape)
    holds its IoU there.  A binary cross-entropy towards ``iou ** gamma`` on positives (weight 1,
    so a poorly localised match still learns a small positive score) and towards 0 on negatives,
    weighted by ``alpha * sigmoid(logit) ** gamma`` (``alpha`` omitted when None, as DEIM's
    default).  Targets and weights are constants.
    """
    prob = logits.detach().sigmoid()
    target = torch.where(positive, iou.detach().clamp(min=0).pow(gamma), 0.0)
    neg = prob.pow(gamma) if alpha is None else alpha * prob.pow(gamma)
    weight = torch.where(positive, 1.0, neg)
    return F.binary_cross_entropy_with_logits(logits, target, weight=weight, reduction="sum")


def paired_giou(boxes1: Tensor, boxes2: Tensor) -> Tensor:
    """Generalised IoU ``(N,)`` of each row pair of xyxy boxes ``(N, 4)`` (no epsilon, as DETR's)."""
    lt = torch.maximum(boxes1[:, :2], boxes2[:, :2])
    rb = torch.minimum(boxes1[:, 2:], boxes2[:, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    union = (boxes1[:, 2:] - boxes1[:, :2]).prod(-1) + (boxes2[:, 2:] - boxes2[:, :2]).prod(-1) - inter
    hull = (torch.maximum(boxes1[:, 2:], boxes2[:, 2:]) - torch.minimum(boxes1[:, :2], boxes2[:, :2])).prod(
        -1
    )
    return inter / union - (hull - union) / hull


def union_matches(layers: list[Matches]) -> Matches:
    """GO-LSD's union set of several layers' matches, per image.

    ``layers``: one list per layer of per-image ``(query_idx, target_idx)`` int64 (host) tensors.
    Every (query, target) pair matched by any layer is kept once; a query matched to different
    targets keeps the one it was matched to most often (ties: the smallest target index).  Returns
    per image ``(query_idx, target_idx)`` with queries ascending.  A target can appear several
    times (different layers may match it to different queries): the union is one-to-many.
    """
    out: Matches = []
    for per_image in zip(*layers):
        query = torch.cat([m[0] for m in per_image])
        target = torch.cat([m[1] for m in per_image])
        if query.numel() == 0:
            out.append((query, target))
            continue
        # Unique pairs come sorted by (query, target); a stable sort on the count then a stable
        # sort on the query puts, for each query, its most frequent target first (ties: smallest).
        pairs, counts = torch.unique(torch.stack([query, target], 1), dim=0, return_counts=True)
        pairs = pairs[torch.argsort(counts, descending=True, stable=True)]
        pairs = pairs[torch.argsort(pairs[:, 0], stable=True)]
        first = torch.ones(len(pairs), dtype=torch.bool)
        first[1:] = pairs[1:, 0] != pairs[:-1, 0]
        out.append((pairs[first, 0].clone(), pairs[first, 1].clone()))
    return out


def build_dfine_weight_dict(
    weights: Mapping[str, float] = DFINE_WEIGHTS,
    *,
    losses: tuple[str, ...] = DFINE_LOSSES,
    dec_layers: int = 6,
    aux_loss: bool = True,
    denoising: bool = True,
) -> dict[str, float]:
    """The weight dict: ``weights`` (keys missing there: :data:`DFINE_WEIGHTS`') for every output's copy.

    Keys for the losses in ``losses`` only.  Suffixes: ``""`` (last layer), with ``aux_loss``
    ``_aux_i`` for the ``dec_layers - 1`` earlier layers, ``_pre`` (the pre-bbox head) and
    ``_enc_0`` (encoder proposals); with ``denoising`` ``_dn_i`` for all ``dec_layers`` layers and
    ``_dn_pre``.  ``loss_fgl`` exists where a layer has corners (last, ``_aux_i``, ``_dn_i``),
    ``loss_ddf`` where it has a teacher (``_aux_i``, ``_dn_i``: the last denoising layer is its own
    teacher, its DDF is a zero).
    """
    _check_losses(losses)
    w = loss_weights(DFINE_WEIGHTS, weights, "D-FINE")
    plain = {f"loss_{k}": w[f"loss_{k}"] for k in CLASS_LOSSES if k in losses}
    if "boxes" in losses:
        plain.update(loss_bbox=w["loss_bbox"], loss_giou=w["loss_giou"])
    local = {"loss_fgl": w["loss_fgl"]} if "local" in losses else {}
    distill = {"loss_ddf": w["loss_ddf"]} if "local" in losses else {}

    out = {k: w for k, w in {**plain, **local}.items()}
    if aux_loss:
        for i in range(dec_layers - 1):
            out.update({f"{k}_aux_{i}": w for k, w in {**plain, **local, **distill}.items()})
        out.update({f"{k}_pre": w for k, w in plain.items()})
        out.update({f"{k}_enc_0": w for k, w in plain.items()})
    if denoising:
        for i in range(dec_layers):
            out.update({f"{k}_dn_{i}": w for k, w in {**plain, **local, **distill}.items()})
        out.update({f"{k}_dn_pre": w for k, w in plain.items()})
    return out


def _check_losses(losses: tuple[str, ...]) -> None:
    unknown = sorted(set(losses) - set(LOSSES))
    if unknown:
        raise ValueError(f"unknown D-FINE losses {unknown}: choose from {list(LOSSES)}")


# --------------------------------------------------------------------------------------------
# The criterion
# --------------------------------------------------------------------------------------------


class DFineCriterion(DetectionCriterion):
    """Losses of D-FINE / DEIM for the outputs of a D-FINE decoder and a list of targets.

    ``forward(outputs, targets)`` returns a dict of unweighted scalars (the weights are applied by
    :meth:`total`, as :class:`~peg_detr.models.rtdetr.RTDETRCriterion` does), per output:

    * the class loss in ``losses``: ``loss_vfl`` (:func:`~peg_detr.models.rtdetr.criterion.varifocal_loss`,
      ``alpha``/``gamma``), ``loss_focal`` (sigmoid focal loss, ``alpha``/``gamma``) or ``loss_mal``
      (:func:`matchability_aware_loss`, ``gamma``/``mal_alpha``), on each output's own Hungarian
      matches, normalised by the number of target boxes;
    * ``"boxes"``: ``loss_bbox`` (L1 on cxcywh) and ``loss_giou`` (``1 - GIoU``);
    * ``"local"``, for outputs with ``pred_corners``: ``loss_fgl``
      (:func:`fine_grained_localization_loss`, IoU-weighted, targets from the output's
      ``ref_points`` through :func:`bbox2distance` / :func:`translate_gt`) and, for outputs with
      ``teacher_corners``, ``loss_ddf`` (see below).

    With ``use_uni_set`` (D-FINE, DEIM) the box and local losses of the last layer, ``aux_outputs``,
    ``pre_outputs`` and the box loss of ``enc_aux_outputs`` use :func:`union_matches` of all these
    outputs' matches, normalised by the union's size; without, each output's own matches and the
    number of target boxes (transformers' ``DFineLoss``).  Suffixes: ``_aux_i``, ``_pre``,
    ``_enc_i``, and for the denoising queries (matched by construction through
    ``dn_meta["dn_positive_idx"]``, normalised by ``num_boxes * dn_num_group``) ``_dn_i`` and
    ``_dn_pre``.

    DDF of one output: per edge ``w * distillation_loss(student, teacher, T=5)``, ``w`` the IoU of the
    output's box for matched queries and the teacher's highest class probability for the others;
    the matched mean and the unmatched mean are combined with weights ``sqrt(#matched)`` and
    ``sqrt(#unmatched)`` (D-FINE's per-batch scale cancels out of that ratio).  As D-FINE does, the
    denoising outputs reuse the counts of the (last) non-denoising output rather than their own;
    an output that is its own teacher (the same tensor) gets a zero.

    ``outputs``: ``pred_logits (B, Q, num_classes)``, ``pred_boxes (B, Q, 4)``, and for the local
    losses ``pred_corners (B, Q, 4 * (reg_max + 1))``, ``ref_points (B, Q, 4)``, ``up`` and
    ``reg_scale`` (one-element tensors of the decoder); auxiliary dicts as the D-FINE model
    returns them (``aux_outputs``, ``pre_outputs``, ``enc_aux_outputs``, ``enc_meta``,
    ``dn_outputs``, ``dn_pre_outputs``, ``dn_meta``).  Computed in float32 whatever the inputs'
    dtype.  Normalisers are summed over processes and divided by the world size (at least 1).
    Unlike D-FINE's criterion, a NaN loss is not zeroed (its Objects365 workaround): it reaches the
    training engine, which stops on it.
    """

    def __init__(
        self,
        num_classes: int,
        *,
        matcher: HungarianMatcher | None = None,
        weight_dict: dict[str, float] | None = None,
        losses: tuple[str, ...] = DFINE_LOSSES,
        reg_max: int = 32,
        alpha: float = 0.75,
        gamma: float = 2.0,
        mal_alpha: float | None = None,
        use_uni_set: bool = True,
        distill_temperature: float = 5.0,
        dec_layers: int = 6,
    ) -> None:
        super().__init__()
        _check_losses(losses)
        if reg_max < 4 or reg_max % 2:
            raise ValueError(f"reg_max must be an even number >= 4, got {reg_max}")
        self.num_classes = num_classes
        self.matcher = matcher if matcher is not None else HungarianMatcher(2.0, 5.0, 2.0, focal=True)
        if not getattr(self.matcher, "focal", True):
            raise ValueError("D-FINE's logits are sigmoid scores: its matcher needs focal=True")
        self.losses = tuple(losses)
        self.weight_dict = (
            dict(weight_dict)
            if weight_dict is not None
            else build_dfine_weight_dict(losses=self.losses, dec_layers=dec_layers)
        )
        self.reg_max = reg_max
        self.alpha = alpha
        self.gamma = gamma
        self.mal_alpha = mal_alpha
        self.use_uni_set = use_uni_set
        self.distill_temperature = distill_temperature

    def forward(
        self, outputs: dict[str, Any], targets: list[dict[str, Tensor]], num_boxes: Tensor | None = None
    ) -> dict[str, Tensor]:
        """D-FINE's losses of ``outputs`` against ``targets`` (the class docstring lists them).

        ``num_boxes`` as :meth:`DetectionCriterion.forward`; the union-set normaliser (a count of
        matches, known only now) is scaled by the same factor, so D-FINE normalises here itself.
        """
        self.check(outputs, targets)
        device = outputs["pred_logits"].device
        own_boxes = box_normaliser(sum(len(t["labels"]) for t in targets), device)
        scale = None if num_boxes is None else num_boxes / own_boxes
        return self.compute(outputs, targets, own_boxes if num_boxes is None else num_boxes, scale=scale)

    def compute(
        self,
        outputs: dict[str, Any],
        targets: list[dict[str, Tensor]],
        num_boxes: Tensor,
        scale: Tensor | None = None,
    ) -> dict[str, Tensor]:
        """The losses normalised by ``num_boxes`` ``()``; the union-set normaliser times ``scale`` ``()``
        (the given normaliser over this batch's own; None: 1)."""
        device = outputs["pred_logits"].device
        labels, boxes = concat_targets(targets, device)
        geometry = self._geometry(outputs)

        named: list[tuple[str, dict[str, Any]]] = [("", outputs)]
        named += [(f"_aux_{i}", o) for i, o in enumerate(outputs.get("aux_outputs", []))]
        if outputs.get("pre_outputs") is not None:
            named.append(("_pre", outputs["pre_outputs"]))
        named += [(f"_enc_{i}", o) for i, o in enumerate(outputs.get("enc_aux_outputs", []))]
        host = self._match([o for _, o in named], targets)
        if self.use_uni_set:
            union = union_matches(host)
            *own, shared = device_indices([*host, union], targets, device)  # one host-to-device copy
            box_indices = [shared] * len(own)
            box_norm = box_normaliser(sum(len(q) for q, _ in union), device)
            box_norm = box_norm if scale is None else box_norm * scale
        else:
            own = box_indices = device_indices(host, targets, device)
            box_norm = num_boxes

        losses: dict[str, Tensor] = {}
        split: tuple[Tensor, Tensor] | None = None  # the last non-denoising DDF's counts
        for (suffix, out), index, box_index in zip(named, own, box_indices):
            cls_matched = MatchedTargets(labels, boxes, index, num_boxes)
            box_matched = MatchedTargets(labels, boxes, box_index, box_norm)
            layer, counts = self._layer_losses(out, cls_matched, box_matched, geometry, None)
            split = counts if counts is not None else split
            losses.update(_suffixed(layer, suffix))

        dn_named = [(f"_dn_{i}", o) for i, o in enumerate(outputs.get("dn_outputs", []))]
        if outputs.get("dn_pre_outputs") is not None:
            dn_named.append(("_dn_pre", outputs["dn_pre_outputs"]))
        if dn_named:
            # matched by construction, the same targets for the class and the box losses
            dn = MatchedTargets(labels, boxes, *denoising_targets(outputs, "dn_outputs", targets, num_boxes))
            for suffix, out in dn_named:
                layer, _ = self._layer_losses(out, dn, dn, geometry, split)
                losses.update(_suffixed(layer, suffix))
        return losses

    def check(self, outputs: dict[str, Any], targets: list[dict[str, Tensor]]) -> None:
        check_sigmoid_outputs(outputs, targets, self.num_classes)
        if "dn_aux_outputs" in outputs:
            raise ValueError("D-FINE's denoising outputs are named dn_outputs (dn_aux_outputs is RT-DETR's)")
        if (outputs.get("enc_meta") or {}).get("class_agnostic", False):
            raise ValueError(
                "class-agnostic encoder proposals are not supported: D-FINE's recipes select per class"
            )
        corners = outputs.get("pred_corners")
        if "local" in self.losses and corners is not None and corners.shape[-1] != 4 * (self.reg_max + 1):
            raise ValueError(
                f"pred_corners has {corners.shape[-1]} values per query, the criterion expects "
                f"4 * (reg_max + 1) = {4 * (self.reg_max + 1)}: reg_max must be the decoder's max_num_bins"
            )

    def _geometry(self, outputs: dict[str, Any]) -> tuple[Tensor, Tensor] | None:
        """The weighting function ``(reg_max + 1,)`` of the decoder's ``up`` / ``reg_scale`` and
        ``reg_scale`` ``(1,)`` (float32, detached), or None when no local loss is asked for."""
        if "local" not in self.losses:
            return None
        if "up" not in outputs or "reg_scale" not in outputs:
            raise ValueError("the local losses need the decoder's up and reg_scale in the outputs")
        device = outputs["pred_logits"].device
        up = torch.as_tensor(outputs["up"]).detach().to(device, torch.float32).reshape(1)
        reg_scale = torch.as_tensor(outputs["reg_scale"]).detach().to(device, torch.float32).reshape(1)
        return weighting_function(self.reg_max, up, reg_scale), reg_scale

    def _match(self, layers: list[dict[str, Tensor]], targets: list[dict[str, Tensor]]) -> list[Matches]:
        """Host Hungarian matches per layer; layers with the same number of queries share one
        device-to-host copy."""
        return match_by_query_count(self.matcher, layers, targets, self.num_classes)

    def _layer_losses(
        self,
        out: dict[str, Tensor],
        cls_matched: MatchedTargets,
        box_matched: MatchedTargets,
        geometry: tuple[Tensor, Tensor] | None,
        split: tuple[Tensor, Tensor] | None,
    ) -> tuple[dict[str, Tensor], tuple[Tensor, Tensor] | None]:
        """The requested losses of one output and, when it computed a DDF, its (matched, unmatched)
        query counts.

        ``cls_matched``: the output's own matches, for the class loss; ``box_matched``: its own or
        the union set, for the box and local losses; ``geometry``: :meth:`_geometry`'s; ``split``:
        counts to balance the DDF with instead of its own (the denoising outputs').
        """
        result: dict[str, Tensor] = {}
        pred_boxes = out["pred_boxes"].float()
        if any(k in self.losses for k in CLASS_LOSSES):
            result.update(self._class_losses(out["pred_logits"].float(), pred_boxes, cls_matched))

        b, q, _ = box_matched.index
        box_norm = box_matched.num_boxes
        matched_boxes = box_matched.matched_boxes
        src = box_convert(pred_boxes[b, q], "cxcywh", "xyxy")
        tgt = box_convert(matched_boxes, "cxcywh", "xyxy")
        if "boxes" in self.losses:
            result["loss_bbox"] = F.l1_loss(pred_boxes[b, q], matched_boxes, reduction="sum") / box_norm
            result["loss_giou"] = (1 - paired_giou(src, tgt)).sum() / box_norm
        counts = None
        if geometry is not None and "pred_corners" in out:
            project, reg_scale = geometry
            iou = paired_iou(src.detach(), tgt)  # a weight, not a prediction: no gradient
            corners = out["pred_corners"].float()
            bins = project.numel()
            ref = out["ref_points"][b, q].detach().float()
            left, w_left, w_right = translate_gt(bbox2distance(ref, matched_boxes, reg_scale), project)
            edges = corners[b, q].reshape(-1, bins)  # (M * 4, N + 1): left, top, right, bottom per box
            fgl = fine_grained_localization_loss(edges, left, w_left, w_right, iou.repeat_interleave(4))
            result["loss_fgl"] = fgl / box_norm
            if "teacher_corners" in out:
                result["loss_ddf"], counts = self._ddf(out, corners, iou, box_matched.index, split)
        return result, counts

    def _class_losses(self, logits: Tensor, pred_boxes: Tensor, matched: MatchedTargets) -> dict[str, Tensor]:
        """The class losses in ``losses`` of ``logits`` ``(B, Q, C)`` (``pred_boxes`` ``(B, Q, 4)``
        give the IoU targets) against the output's own matches."""
        b, q, _ = matched.index
        norm = matched.num_boxes
        cls = matched.matched_labels
        positive = torch.zeros_like(logits, dtype=torch.bool)
        positive[b, q, cls] = True
        out: dict[str, Tensor] = {}
        if "vfl" in self.losses or "mal" in self.losses:
            # The IoU is a target, not a prediction: no gradient flows into the boxes through it.
            src = box_convert(pred_boxes[b, q].detach(), "cxcywh", "xyxy")
            score = torch.zeros_like(logits)
            score[b, q, cls] = paired_iou(src, box_convert(matched.matched_boxes, "cxcywh", "xyxy"))
            if "vfl" in self.losses:
                out["loss_vfl"] = varifocal_loss(logits, positive, score, self.alpha, self.gamma) / norm
            if "mal" in self.losses:
                out["loss_mal"] = (
                    matchability_aware_loss(logits, positive, score, self.gamma, self.mal_alpha) / norm
                )
        if "focal" in self.losses:
            one_hot = positive.to(logits.dtype)
            out["loss_focal"] = (
                sigmoid_focal_loss(logits, one_hot, self.alpha, self.gamma, reduction="sum") / norm
            )
        return out

    def _ddf(
        self,
        out: dict[str, Tensor],
        corners: Tensor,
        iou: Tensor,
        index: tuple[Tensor, Tensor, Tensor],
        split: tuple[Tensor, Tensor] | None,
    ) -> tuple[Tensor, tuple[Tensor, Tensor] | None]:
        """Decoupled distillation focal loss of one output and its (matched, unmatched) counts.

        ``corners`` ``(B, Q, 4 * (reg_max + 1))`` float32; ``iou`` ``(K,)`` of the ``K`` matched
        queries ``index`` (the box losses' matches).
        """
        b, q, _ = index
        bins = corners.shape[-1] // 4
        teacher = out["teacher_corners"]
        if _same_tensor(teacher, out["pred_corners"]):
            # The last layer is its own teacher (D-FINE's denoising outputs): nothing to distil,
            # a zero that keeps the graph connected.
            return corners.sum() * 0, None
        kl = distillation_loss(
            corners.reshape(-1, bins), teacher.float().reshape(-1, bins), self.distill_temperature
        )
        kl = kl.view(*corners.shape[:2], 4)  # (B, Q, 4)
        weight = out["teacher_logits"].detach().float().sigmoid().amax(-1)  # (B, Q) teacher confidence
        weight = weight.index_put((b, q), iou.to(weight.dtype))
        matched = torch.zeros_like(weight, dtype=torch.bool).index_put(
            (b, q), torch.ones_like(b, dtype=torch.bool)
        )
        loss = weight.unsqueeze(-1) * kl
        n_pos = matched.sum().float()
        n_neg = matched.numel() - n_pos
        # Sums over masked entries divided by clamped counts: no host sync for an empty side.
        mean_pos = torch.where(matched.unsqueeze(-1), loss, 0).sum() / (4 * n_pos).clamp(min=1)
        mean_neg = torch.where(matched.unsqueeze(-1), 0, loss).sum() / (4 * n_neg).clamp(min=1)
        s_pos, s_neg = (n_pos.sqrt(), n_neg.sqrt()) if split is None else (split[0].sqrt(), split[1].sqrt())
        return (mean_pos * s_pos + mean_neg * s_neg) / (s_pos + s_neg), (n_pos, n_neg)


def _same_tensor(a: Tensor, b: Tensor) -> bool:
    """Whether ``a`` and ``b`` view the same memory the same way (a detached view counts), decided
    without comparing values (no device sync)."""
    return a is b or (a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride())


def _suffixed(losses: dict[str, Tensor], suffix: str) -> dict[str, Tensor]:
    return {k + suffix: v for k, v in losses.items()}
