"""RT-DETR's training pieces on hand-computed cases: the focal-cost matcher, the varifocal loss,
the contrastive denoising groups, and the whole criterion against transformers' RTDetrLoss."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torchvision.ops import box_convert, generalized_box_iou

from peg_detr.models import HungarianMatcher
from peg_detr.models.matcher import focal_class_cost, match_cost
from peg_detr.models.rtdetr import (
    RTDETRCriterion,
    build_rtdetr_weight_dict,
    contrastive_denoising_group,
    varifocal_loss,
)
from peg_detr.task import weighted_loss


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def target(labels, boxes):
    return {"labels": torch.tensor(labels, dtype=torch.int64), "boxes": torch.tensor(boxes).view(-1, 4)}


# --- matcher -------------------------------------------------------------------------------------


def test_focal_cost_one_pair_matches_float64_formula():
    logit = 0.7
    cost = focal_class_cost(torch.tensor([[-1.0, logit, 2.0]]), torch.tensor([1]))
    p = sigmoid(logit)
    want = 0.25 * (1 - p) ** 2 * -math.log(p) - 0.75 * p**2 * -math.log(1 - p)
    assert cost.shape == (1, 1)
    assert cost.item() == pytest.approx(want, abs=1e-7)


def test_matcher_known_assignment_with_focal_cost():
    """Query 2 sits on target 0, query 0 on target 1, query 1 far away with the right class."""
    tgt = target([1, 0], [[0.3, 0.3, 0.2, 0.2], [0.7, 0.7, 0.2, 0.3]])
    boxes = torch.tensor([[[0.71, 0.69, 0.2, 0.3], [0.1, 0.9, 0.05, 0.05], [0.3, 0.31, 0.2, 0.2]]])
    logits = torch.tensor([[[0.0, 0.0], [3.0, 3.0], [0.0, 0.0]]])
    matcher = HungarianMatcher(2.0, 5.0, 2.0, focal=True)
    (rows, cols), (empty_rows, _) = matcher(
        {"pred_logits": logits.repeat(2, 1, 1), "pred_boxes": boxes.repeat(2, 1, 1)},
        [tgt, target([], [])],
    )
    assert rows.tolist() == [0, 2] and cols.tolist() == [1, 0]
    assert empty_rows.numel() == 0
    # The class term alone would pick query 1 for both targets: the box terms decide.
    cls = focal_class_cost(logits[0], tgt["labels"])
    assert cls[1].max() < cls[0].min()


def test_matcher_all_images_empty():
    out = HungarianMatcher(2.0, 5.0, 2.0, focal=True)(
        {"pred_logits": torch.randn(2, 3, 4), "pred_boxes": torch.rand(2, 3, 4)}, [target([], [])] * 2
    )
    assert [(r.numel(), c.numel()) for r, c in out] == [(0, 0), (0, 0)]


def test_detr_softmax_cost_is_bit_identical():
    gen = torch.Generator().manual_seed(0)
    logits, boxes = torch.randn(20, 6, generator=gen), torch.rand(20, 4, generator=gen) * 0.4 + 0.1
    tgt, labels = torch.rand(5, 4, generator=gen) * 0.4 + 0.1, torch.randint(0, 5, (5,), generator=gen)
    giou = generalized_box_iou(box_convert(boxes, "cxcywh", "xyxy"), box_convert(tgt, "cxcywh", "xyxy"))
    want = 5.0 * torch.cdist(boxes, tgt, p=1) - 1.0 * logits.softmax(-1)[:, labels] - 2.0 * giou
    assert torch.equal(match_cost(logits, boxes, labels, tgt), want)


# --- varifocal loss -------------------------------------------------------------------------------


def test_varifocal_one_query_two_classes_by_hand():
    """Target xyxy (0, 0, .5, .5), prediction (.25, .25, .75, .75): IoU 1/7 is the class-1 target."""
    logits = torch.tensor([[[0.4, -0.3]]])
    out = {"pred_logits": logits, "pred_boxes": torch.tensor([[[0.5, 0.5, 0.5, 0.5]]])}
    crit = RTDETRCriterion(2, weight_dict=build_rtdetr_weight_dict(aux_loss=False))
    losses = crit(out, [target([1], [0.25, 0.25, 0.5, 0.5])])
    q = 1 / 7
    p0, p1 = sigmoid(0.4), sigmoid(-0.3)
    neg = 0.75 * p0**2 * -math.log(1 - p0)  # class 0: background, weighted alpha p^gamma
    pos = q * -(q * math.log(p1) + (1 - q) * math.log(1 - p1))  # class 1: BCE towards q, weight q
    assert losses["loss_vfl"].item() == pytest.approx(neg + pos, rel=1e-6)
    assert losses["loss_bbox"].item() == pytest.approx(0.5, abs=1e-6)
    inter, union, hull = 0.0625, 0.4375, 0.5625
    assert losses["loss_giou"].item() == pytest.approx(1 - (inter / union - (hull - union) / hull), abs=1e-6)
    assert set(losses) == {"loss_vfl", "loss_bbox", "loss_giou"}


def test_varifocal_weights_carry_no_gradient_and_easy_negatives_vanish():
    logits = torch.tensor([-8.0, 0.0], requires_grad=True)
    loss = varifocal_loss(logits, torch.tensor([False, False]), torch.zeros(2))
    loss.backward()
    # d/dx of w * softplus(x) with w = 0.75 sigmoid(x)^2 held constant: w * sigmoid(x).
    want = [0.75 * sigmoid(x) ** 3 for x in (-8.0, 0.0)]
    assert logits.grad.tolist() == pytest.approx(want, rel=1e-5)
    assert logits.grad[0] < 1e-9


# --- denoising groups -------------------------------------------------------------------------------


NUM_CLASSES = 4


def dn_targets():
    return [
        target([0, 1, 2], [[0.5, 0.5, 0.2, 0.2], [0.3, 0.3, 0.1, 0.2], [0.6, 0.6, 0.3, 0.1]]),
        target([3], [0.4, 0.45, 0.2, 0.1]),
    ]


def embedding():
    torch.manual_seed(0)
    return nn.Embedding(NUM_CLASSES + 1, 8, padding_idx=NUM_CLASSES)


def group(**kw):
    kw.setdefault("generator", torch.Generator().manual_seed(1))
    return contrastive_denoising_group(dn_targets(), NUM_CLASSES, 6, embedding(), num_denoising=7, **kw)


def test_denoising_shapes_meta_and_mask_structure():
    g = group()
    # max 3 boxes -> 7 // 3 = 2 groups of 3 positives + 3 negatives.
    assert g.queries.shape == (2, 12, 8) and g.ref_boxes_unact.shape == (2, 12, 4)
    assert g.meta["dn_num_group"] == 2 and g.meta["dn_num_split"] == [12, 6]
    assert [i.tolist() for i in g.meta["dn_positive_idx"]] == [[0, 1, 2, 6, 7, 8], [0, 6]]
    want = torch.zeros(18, 18, dtype=torch.bool)
    for i in range(18):
        for j in range(18):
            if i >= 12:
                want[i, j] = j < 12  # matching queries never see denoising ones
            elif j < 12:
                want[i, j] = i // 6 != j // 6  # a group sees only itself
    assert torch.equal(g.attn_mask, want)


def test_denoising_without_noise_keeps_labels_and_boxes():
    g = group(label_noise_ratio=0.0, box_noise_scale=0.0)
    emb = embedding()
    labels = torch.tensor([[0, 1, 2], [3, NUM_CLASSES, NUM_CLASSES]]).repeat(1, 4)
    assert torch.equal(g.queries, emb(labels))
    boxes = torch.stack([t["boxes"] for t in [dn_targets()[0], dn_targets()[0]]])
    boxes[1] = 0
    boxes[1, 0] = dn_targets()[1]["boxes"][0]
    real = g.ref_boxes_unact.sigmoid().view(2, 4, 3, 4)[0]
    assert torch.allclose(real, boxes[0].expand(4, 3, 4), atol=1e-6)
    assert torch.allclose(g.ref_boxes_unact.sigmoid().view(2, 4, 3, 4)[1, :, 0], boxes[1, 0], atol=1e-6)


def test_denoising_negatives_move_beyond_half_size_positives_within():
    g = group(label_noise_ratio=0.0, box_noise_scale=1.0)
    gt = box_convert(dn_targets()[0]["boxes"], "cxcywh", "xyxy")
    half = dn_targets()[0]["boxes"][:, 2:].repeat(1, 2) / 2
    cxcywh = g.ref_boxes_unact[0].sigmoid().view(2, 2, 3, 4)  # (group, positive/negative, box, 4)
    shift = (box_convert(cxcywh, "cxcywh", "xyxy") - gt).abs() / half  # per corner, in half-sizes
    # Clipping to the image only shortens a move; these boxes are far enough from the borders.
    assert (cxcywh[..., :2] > 0.05).all() and (cxcywh[..., :2] < 0.95).all()
    assert (shift[:, 0] < 1 + 1e-4).all()  # positives: every corner within half a size
    # Negatives: every corner moves by 1 to 2 half-sizes.  When both corners of an axis move
    # inwards they cross, and the box collapses to the logit floor on that axis (as in RT-DETR).
    size = cxcywh[:, 1, :, 2:]
    collapsed = (size < 1e-4).repeat(1, 1, 2)
    neg = shift[:, 1]
    assert ((neg > 1 - 1e-4) & (neg < 2 + 1e-4) | collapsed).all()
    assert (~collapsed).sum() >= 6 and (cxcywh[:, 0, :, 2:] > 1e-3).all()


def test_denoising_label_noise_only_on_real_boxes_and_deterministic():
    a, b = group(label_noise_ratio=1.0), group(label_noise_ratio=1.0)
    assert torch.equal(a.queries, b.queries) and torch.equal(a.ref_boxes_unact, b.ref_boxes_unact)
    c = group(label_noise_ratio=1.0, generator=torch.Generator().manual_seed(2))
    assert not torch.equal(a.ref_boxes_unact, c.ref_boxes_unact)
    pad = embedding().weight[NUM_CLASSES]
    assert torch.equal(a.queries[1].view(4, 3, 8)[:, 1:], pad.expand(4, 2, 8))


def test_denoising_label_noise_rate():
    """Each label is redrawn with probability ratio / 2, uniformly: it changes w.p. ratio/2 * (C-1)/C."""
    targets = [target([1] * 500, [[0.5, 0.5, 0.2, 0.2]] * 500)]
    emb = nn.Embedding(NUM_CLASSES + 1, NUM_CLASSES + 1)
    emb.weight.data = torch.eye(NUM_CLASSES + 1)  # the query is the one-hot label
    g = contrastive_denoising_group(
        targets,
        NUM_CLASSES,
        1,
        emb,
        num_denoising=500,
        label_noise_ratio=0.8,
        generator=torch.Generator().manual_seed(0),
    )
    changed = (g.queries.argmax(-1) != 1).float().mean().item()
    assert changed == pytest.approx(0.4 * 3 / 4, abs=0.03)


def test_denoising_none_without_boxes_or_queries():
    emb = embedding()
    assert contrastive_denoising_group([target([], [])] * 2, NUM_CLASSES, 6, emb) is None
    assert contrastive_denoising_group(dn_targets(), NUM_CLASSES, 6, emb, num_denoising=0) is None
    with pytest.raises(ValueError, match="num_classes \\+ 1 = 5"):
        contrastive_denoising_group(dn_targets(), NUM_CLASSES, 6, nn.Embedding(4, 8))


# --- the criterion against transformers -------------------------------------------------------------


def random_outputs(gen, batch, queries, layers, dn_queries=0):
    def head(q):
        return {
            "pred_logits": torch.randn(batch, q, NUM_CLASSES, generator=gen) * 2,
            "pred_boxes": torch.cat(
                [
                    torch.rand(batch, q, 2, generator=gen) * 0.6 + 0.2,
                    torch.rand(batch, q, 2, generator=gen) * 0.3 + 0.05,
                ],
                -1,
            ),
        }

    out = head(queries)
    out["aux_outputs"] = [head(queries) for _ in range(layers - 1)]
    out["enc_aux_outputs"] = [head(queries)]
    if dn_queries:
        out["dn_aux_outputs"] = [head(dn_queries) for _ in range(layers)]
    return out


def to_hf(outputs, targets):
    def conv(o):
        return {"logits": o["pred_logits"], "pred_boxes": o["pred_boxes"]}

    hf = conv(outputs)
    hf["auxiliary_outputs"] = [conv(o) for o in outputs["aux_outputs"] + outputs["enc_aux_outputs"]]
    if "dn_aux_outputs" in outputs:
        hf["dn_auxiliary_outputs"] = [conv(o) for o in outputs["dn_aux_outputs"]]
        hf["denoising_meta_values"] = outputs["dn_meta"]
    return hf, [{"class_labels": t["labels"], "boxes": t["boxes"]} for t in targets]


@pytest.mark.parametrize("denoising", [False, True])
def test_criterion_equals_transformers_rtdetr_loss(denoising):
    from transformers import RTDetrConfig
    from transformers.loss.loss_rt_detr import RTDetrLoss

    gen = torch.Generator().manual_seed(3)
    layers = 3
    targets = dn_targets()
    group_ = contrastive_denoising_group(
        targets, NUM_CLASSES, 10, embedding(), num_denoising=7, generator=gen
    )
    outputs = random_outputs(gen, 2, 10, layers, dn_queries=12 if denoising else 0)
    if denoising:
        outputs["dn_meta"] = group_.meta
    crit = RTDETRCriterion(NUM_CLASSES, dec_layers=layers)
    ours = crit(outputs, targets)

    hf_loss = RTDetrLoss(
        RTDetrConfig(num_labels=NUM_CLASSES, weight_loss_vfl=1.0, weight_loss_bbox=5.0, weight_loss_giou=2.0)
    )
    theirs = hf_loss(*to_hf(outputs, targets))  # already weighted; the encoder is its last auxiliary layer
    rename = {f"_aux_{layers - 1}": "_enc_0"}
    mapped = {}
    for k, v in theirs.items():
        for old, new in rename.items():
            k = k.replace(old, new)
        mapped[k] = v
    assert (
        set(mapped)
        == set(ours)
        == set(crit.weight_dict) - (set() if denoising else {k for k in crit.weight_dict if "_dn_" in k})
    )
    for k, v in ours.items():
        assert (v * crit.weight_dict[k]).item() == pytest.approx(mapped[k].item(), abs=1e-5), k
    # Totals summed in float64 so that only the terms' own float32 error is compared.
    total = weighted_loss({k: v.double() for k, v in ours.items()}, crit.weight_dict)
    assert total.item() == pytest.approx(sum(v.double() for v in theirs.values()).item(), abs=1e-5)
    assert crit.total(ours).item() == pytest.approx(total.item(), rel=1e-6)


def test_denoising_losses_normalised_by_groups():
    """Perfect denoising predictions give zero box losses; one shifted positive gives L1 / (n * G)."""
    targets = dn_targets()
    g = group(label_noise_ratio=0.0, box_noise_scale=0.0)
    boxes = g.ref_boxes_unact.sigmoid().clone()
    boxes[0, 6, 0] += 0.06  # group 1's first positive of image 0
    outputs = random_outputs(torch.Generator().manual_seed(0), 2, 6, 1)
    outputs["dn_aux_outputs"] = [{"pred_logits": torch.zeros(2, 12, NUM_CLASSES), "pred_boxes": boxes}]
    outputs["dn_meta"] = g.meta
    losses = RTDETRCriterion(NUM_CLASSES, dec_layers=1)(outputs, targets)
    assert losses["loss_bbox_dn_0"].item() == pytest.approx(0.06 / (4 * 2), abs=1e-6)
    with pytest.raises(ValueError, match="no dn_meta"):
        del outputs["dn_meta"]
        RTDETRCriterion(NUM_CLASSES, dec_layers=1)(outputs, targets)


def test_criterion_rejects_wrong_class_count_and_softmax_matcher():
    with pytest.raises(ValueError, match="num_classes = 3"):
        RTDETRCriterion(3)(random_outputs(torch.Generator().manual_seed(0), 2, 4, 1), dn_targets())
    with pytest.raises(ValueError, match="focal=True"):
        RTDETRCriterion(3, matcher=HungarianMatcher())


def test_criterion_on_images_without_boxes():
    """No box anywhere: box losses are 0 and the VFL is the background term over all entries (/ 1)."""
    outputs = random_outputs(torch.Generator().manual_seed(0), 2, 5, 2)
    losses = RTDETRCriterion(NUM_CLASSES, dec_layers=2)(outputs, [target([], [])] * 2)
    assert losses["loss_bbox"].item() == 0.0 and losses["loss_giou_enc_0"].item() == 0.0
    x = outputs["aux_outputs"][0]["pred_logits"].double()
    want = (0.75 * x.sigmoid() ** 2 * torch.nn.functional.softplus(x)).sum().item()
    assert losses["loss_vfl_aux_0"].item() == pytest.approx(want, rel=1e-5)


def test_denoising_and_criterion_read_nothing_on_the_host(monkeypatch):
    """Besides the matcher's one transfer, neither the group nor the losses read a device value."""
    from tests.detr.test_sync_free import count_syncs

    crit = RTDETRCriterion(NUM_CLASSES, dec_layers=2)
    outputs = random_outputs(torch.Generator().manual_seed(0), 2, 10, 2, dn_queries=12)
    with count_syncs(monkeypatch, crit.matcher) as (counter, calls):
        outputs["dn_meta"] = group().meta
        total = crit.total(crit(outputs, dn_targets()))
    assert counter.events == []
    assert len(calls) == 1  # decoder layers and encoder proposals matched with one transfer
    assert torch.isfinite(total)


def test_denoising_layout_equals_transformers():
    """Noise off (the only RNG-free case): the same queries, boxes, mask and meta as transformers'."""
    from transformers.models.rt_detr.modeling_rt_detr import get_contrastive_denoising_training_group

    targets, emb = dn_targets(), embedding()
    hf_targets = [{"class_labels": t["labels"], "boxes": t["boxes"]} for t in targets]
    queries, boxes, mask, meta = get_contrastive_denoising_training_group(
        hf_targets, NUM_CLASSES, 6, emb, num_denoising_queries=7, label_noise_ratio=0.0, box_noise_scale=0.0
    )
    g = group(label_noise_ratio=0.0, box_noise_scale=0.0)
    assert torch.equal(g.queries, queries)
    # transformers leaves the boxes un-logit-ed when the box noise is off; ours are always logits.
    assert torch.allclose(g.ref_boxes_unact.sigmoid(), boxes, atol=1e-5)
    assert torch.equal(g.attn_mask, torch.isinf(mask))
    assert g.meta["dn_num_group"] == meta["dn_num_group"] and g.meta["dn_num_split"] == meta["dn_num_split"]
    assert all(torch.equal(a, b) for a, b in zip(g.meta["dn_positive_idx"], meta["dn_positive_idx"]))
