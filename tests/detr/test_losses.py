"""SetCriterion on hand-built cases with values computed from the formulas."""

from __future__ import annotations

import math

import pytest
import torch

from peg_detr.models import HungarianMatcher, SetCriterion, build_weight_dict


def make_criterion(num_classes=3, eos=0.1, aux=0):
    return SetCriterion(num_classes, HungarianMatcher(), build_weight_dict(1.0, 5.0, 2.0, aux), eos_coef=eos)


def confident_logits(classes, num_classes):
    """Logits ``(1, Q, K+1)`` strongly predicting ``classes[q]`` at query q."""
    logits = torch.full((1, len(classes), num_classes + 1), -10.0)
    for q, c in enumerate(classes):
        logits[0, q, c] = 10.0
    return logits


def test_perfect_prediction_gives_zero_box_losses():
    tgt_boxes = torch.tensor([[0.3, 0.4, 0.2, 0.1], [0.7, 0.6, 0.3, 0.4]])
    boxes = torch.tensor([[[0.5, 0.5, 0.1, 0.1], [0.7, 0.6, 0.3, 0.4], [0.3, 0.4, 0.2, 0.1]]])
    logits = confident_logits([3, 2, 0], 3)  # query 0 says no-object
    targets = [{"labels": torch.tensor([0, 2]), "boxes": tgt_boxes}]
    losses = make_criterion()({"pred_logits": logits, "pred_boxes": boxes}, targets)
    assert losses["loss_bbox"].item() == pytest.approx(0.0, abs=1e-7)
    assert losses["loss_giou"].item() == pytest.approx(0.0, abs=1e-6)
    assert losses["loss_ce"].item() == pytest.approx(0.0, abs=1e-6)
    assert losses["class_error"].item() == 0.0
    assert losses["cardinality_error"].item() == 0.0


def test_known_values_l1_giou_and_weighted_ce():
    """One target, two queries: every number checked against a hand computation in float64."""
    num_classes = 2
    # Target xyxy (0, 0, .5, .5); query 0 is the same box shifted to xyxy (.25, .25, .75, .75).
    tgt = torch.tensor([[0.25, 0.25, 0.5, 0.5]])
    boxes = torch.tensor([[[0.5, 0.5, 0.5, 0.5], [0.9, 0.9, 0.05, 0.05]]])
    logits = torch.tensor([[[0.3, 1.2, -0.4], [0.5, -0.2, 0.8]]])
    targets = [{"labels": torch.tensor([1]), "boxes": tgt}]
    losses = make_criterion(num_classes, eos=0.1)({"pred_logits": logits, "pred_boxes": boxes}, targets)

    # Query 0 is the match (close box and high class-1 score): L1 = |0.5-0.25| + |0.5-0.25| (cx, cy).
    assert losses["loss_bbox"].item() == pytest.approx(0.5, abs=1e-6)
    inter, union, hull = 0.25 * 0.25, 0.25 + 0.25 - 0.0625, 0.75 * 0.75
    giou = inter / union - (hull - union) / hull
    assert losses["loss_giou"].item() == pytest.approx(1 - giou, abs=1e-6)
    # Weighted CE: query 0 -> class 1 (weight 1), query 1 -> no-object (weight 0.1); mean by weights.
    lg = logits.double()[0]
    nll0 = -torch.log_softmax(lg[0], -1)[1].item()
    nll1 = -torch.log_softmax(lg[1], -1)[2].item()
    assert losses["loss_ce"].item() == pytest.approx((1.0 * nll0 + 0.1 * nll1) / 1.1, rel=1e-6)
    assert losses["class_error"].item() == 0.0
    # Argmax: query 0 class 1, query 1 no-object -> one prediction for one target.
    assert losses["cardinality_error"].item() == 0.0


def test_no_target_normalisation_and_empty_images():
    """Zero boxes: box losses are 0, the CE says 'no object everywhere', num_boxes clamps to 1."""
    logits = torch.randn(2, 4, 4)
    boxes = torch.rand(2, 4, 4) * 0.5 + 0.25
    targets = [{"labels": torch.zeros(0, dtype=torch.int64), "boxes": torch.zeros(0, 4)} for _ in range(2)]
    losses = make_criterion()({"pred_logits": logits, "pred_boxes": boxes}, targets)
    assert losses["loss_bbox"].item() == 0.0 and losses["loss_giou"].item() == 0.0
    want = -torch.log_softmax(logits.double(), -1)[..., 3].mean().item()  # all weights 0.1: mean of NLLs
    assert losses["loss_ce"].item() == pytest.approx(want, rel=1e-6)


def test_box_losses_divide_by_num_boxes_over_batch():
    """Two images, three boxes: L1 is the summed error over matched boxes divided by 3."""
    tgt = [torch.tensor([[0.5, 0.5, 0.2, 0.2]]), torch.tensor([[0.3, 0.3, 0.2, 0.2], [0.7, 0.7, 0.2, 0.2]])]
    boxes = torch.stack(
        [
            torch.stack([tgt[0][0] + 0.01, torch.tensor([0.1, 0.9, 0.05, 0.05])]),
            tgt[1] + torch.tensor([0.02, 0.0, 0.0, 0.0]),
        ]
    )
    logits = torch.zeros(2, 2, 4)
    targets = [
        {"labels": torch.tensor([0]), "boxes": tgt[0]},
        {"labels": torch.tensor([1, 2]), "boxes": tgt[1]},
    ]
    losses = make_criterion()({"pred_logits": logits, "pred_boxes": boxes}, targets)
    assert losses["loss_bbox"].item() == pytest.approx((4 * 0.01 + 2 * 0.02) / 3, abs=1e-6)


def test_aux_losses_weights_and_total():
    crit = make_criterion(aux=2)
    assert crit.weight_dict == {
        **{"loss_ce": 1.0, "loss_bbox": 5.0, "loss_giou": 2.0},
        **{f"loss_{n}_{i}": w for i in range(2) for n, w in (("ce", 1.0), ("bbox", 5.0), ("giou", 2.0))},
    }
    logits = torch.randn(1, 3, 4, requires_grad=True)
    boxes = torch.rand(1, 3, 4).clamp(0.1, 0.9)
    out = {
        "pred_logits": logits,
        "pred_boxes": boxes,
        "aux_outputs": [{"pred_logits": logits, "pred_boxes": boxes}] * 2,
    }
    targets = [{"labels": torch.tensor([1]), "boxes": torch.tensor([[0.5, 0.5, 0.3, 0.3]])}]
    losses = crit(out, targets)
    for i in range(2):  # identical aux outputs -> identical losses
        for n in ("ce", "bbox", "giou"):
            assert losses[f"loss_{n}_{i}"].item() == pytest.approx(losses[f"loss_{n}"].item())
    total = crit.total(losses)
    want = 3 * (losses["loss_ce"] + 5 * losses["loss_bbox"] + 2 * losses["loss_giou"])
    assert total.item() == pytest.approx(want.item(), rel=1e-6)
    total.backward()
    assert torch.isfinite(logits.grad).all() and logits.grad.abs().sum() > 0
    assert "class_error_0" not in losses


def test_bad_targets_are_named():
    crit = make_criterion(num_classes=3)
    out = {"pred_logits": torch.randn(1, 2, 4), "pred_boxes": torch.rand(1, 2, 4)}
    with pytest.raises(ValueError, match="outside"):
        crit(out, [{"labels": torch.tensor([3]), "boxes": torch.rand(1, 4)}])
    with pytest.raises(ValueError, match=r"\(M, 4\)"):
        crit(out, [{"labels": torch.tensor([1]), "boxes": torch.rand(2, 4)}])
    with pytest.raises(ValueError, match="num_classes"):
        make_criterion(num_classes=5)(out, [{"labels": torch.tensor([1]), "boxes": torch.rand(1, 4)}])
    assert math.isclose(crit.empty_weight[-1].item(), 0.1, rel_tol=1e-6)
