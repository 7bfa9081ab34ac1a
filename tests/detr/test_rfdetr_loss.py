"""RF-DETR's criterion: equal to transformers' loss, Group DETR matching and normaliser, IA-BCE by hand.

transformers' ``RfDetrForObjectDetection(labels=...)`` computes ``LwDetrForObjectDetectionLoss``
(Group DETR Hungarian matching, IA-BCE, L1, GIoU on the last layer, the earlier layers and the
encoder proposals).  Its keys map to ours as ``loss_ce -> loss_iabce``, ``_i -> _aux_i``,
``_enc -> _enc_0`` (``cardinality_error`` is a log, not a loss: ours has none).

Ties: the matching is a Hungarian assignment on continuous costs of a perturbed random model; the
two implementations compute the class cost slightly differently (transformers ``log(p + 1e-8)``,
ours ``softplus``), so an exact tie could make them pick different assignments.  The model tests
therefore first check that our matches equal transformers' matcher's on every output (none ties at
these seeds), and the direct test feeds both criteria the very same tensors.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from peg_detr.interop.hf_rfdetr import rfdetr_from_hf, rfdetr_from_hf_config, rfdetr_hf_to_ours
from peg_detr.models.rfdetr import (
    RFDETRCriterion,
    build_rfdetr_weight_dict,
    group_detr_matches,
    group_num_boxes,
    iou_aware_bce_loss,
    rfdetr_training_parts,
)
from peg_detr.models.rfdetr.backbone import IMAGENET_MEAN, IMAGENET_STD
from peg_detr.models.rtdetr import RTDETRPostProcess
from peg_detr.task import weighted_loss

transformers = pytest.importorskip("transformers")
pytest.importorskip("transformers.models.rf_detr")
pytest.importorskip("scipy")
from transformers.loss.loss_lw_detr import LwDetrForObjectDetectionLoss, LwDetrHungarianMatcher  # noqa: E402

TOL = 1e-5
NATIVE = (56, 56)  # the table's 14 x 14 grid at patch 4
NON_SQUARE = (48, 80)
GROUPS, QUERIES, CLASSES, LAYERS = 3, 10, 5, 2


def _config(**overrides):
    """A tiny ``RfDetrConfig`` (the parity test's): 4-block ViT of width 32, 2 decoder layers, 3 groups of 10."""
    backbone = dict(
        model_type="rf_detr_dinov2", hidden_size=32, num_hidden_layers=4, num_attention_heads=2, image_size=56,
        patch_size=4, num_windows=2, out_features=["stage1", "stage2", "stage4"],
    )  # fmt: skip
    options = dict(
        backbone_config=backbone, d_model=32, decoder_ffn_dim=64, decoder_layers=LAYERS,
        decoder_self_attention_heads=2, decoder_cross_attention_heads=4, decoder_n_points=2, num_queries=QUERIES,
        group_detr=GROUPS, num_labels=CLASSES, c2f_num_blocks=1, dropout=0.0,
    )  # fmt: skip
    options.update(overrides)
    return transformers.RfDetrConfig(**options)


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> tuple[object, Path]:
    """transformers' model, every parameter perturbed (no zero box head hides a mismatch), saved."""
    torch.manual_seed(0)
    model = transformers.RfDetrForObjectDetection(_config())
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    folder = tmp_path_factory.mktemp("rfdetr_loss")
    model.save_pretrained(folder)
    return model, folder


def _hf_pixels(x: torch.Tensor) -> torch.Tensor:
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in (IMAGENET_MEAN, IMAGENET_STD))
    return (x - mean) / std


def _targets(counts: list[int], seed: int) -> list[dict[str, torch.Tensor]]:
    """Random cxcywh boxes inside the image and labels, ``counts[b]`` for image ``b``."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in counts:
        centre = torch.rand(n, 2, generator=g) * 0.6 + 0.2
        size = torch.rand(n, 2, generator=g) * 0.3 + 0.05
        out.append(
            {"labels": torch.randint(0, CLASSES, (n,), generator=g), "boxes": torch.cat([centre, size], 1)}
        )
    return out


def _hf_labels(targets):
    return [{"class_labels": t["labels"], "boxes": t["boxes"]} for t in targets]


def _our_key(hf_key: str) -> str:
    """transformers' loss-dict key -> ours."""
    key = hf_key.replace("loss_ce", "loss_iabce")
    if key.endswith("_enc"):
        return key[: -len("_enc")] + "_enc_0"
    stem, last = key.rsplit("_", 1)
    return f"{stem}_aux_{last}" if last.isdigit() else key


def _compare(theirs_total, theirs: dict, ours: dict, criterion: RFDETRCriterion) -> float:
    """Max abs difference over the total and every term; every term of ours has a weight."""
    hf_terms = {
        _our_key(k): v for k, v in theirs.items() if k != "cardinality_error" and "cardinality" not in k
    }
    assert set(hf_terms) == set(ours) == set(criterion.weight_dict)
    diffs = [float((torch.as_tensor(hf_terms[k]) - ours[k]).detach().abs()) for k in ours]
    diffs.append(float((theirs_total - criterion.total(ours)).detach().abs()))
    return max(diffs)


# --- the whole model against transformers ---------------------------------------------------------


@pytest.mark.parametrize("size", [NATIVE, NON_SQUARE], ids=["native", "non-square"])
def test_equal_to_transformers_loss_in_training(hf_folder, size) -> None:
    """3 images with 3, 0 and 1 boxes: total, each term (1e-5) and each parameter's gradient."""
    hf, folder = hf_folder
    ours, _ = rfdetr_from_hf(folder)
    criterion, _ = rfdetr_training_parts(ours)
    hf.train()
    ours.train()
    targets = _targets([3, 0, 1], seed=3)
    x = torch.rand(3, 3, *size, generator=torch.Generator().manual_seed(4))
    try:
        hf.zero_grad()
        theirs = hf(pixel_values=_hf_pixels(x), labels=_hf_labels(targets))
        theirs.loss.backward()
    finally:
        hf.eval()
    out = ours(x)
    assert out["num_groups"] == GROUPS and out["pred_logits"].shape == (3, GROUPS * QUERIES, CLASSES)

    # No tie: our Group DETR matches equal transformers' matcher's on the last layer, the earlier
    # layers and the encoder proposals.
    hf_matcher = LwDetrHungarianMatcher(class_cost=2, bbox_cost=5, giou_cost=2)
    hf_outputs = [
        {"logits": theirs.logits, "pred_boxes": theirs.pred_boxes},
        *theirs.auxiliary_outputs,
        {"logits": theirs.enc_outputs_class, "pred_boxes": theirs.enc_outputs_coord_logits},
    ]
    layers = [out, *out["aux_outputs"], *out["enc_aux_outputs"]]
    ours_matches = group_detr_matches(criterion.matcher, layers, targets, GROUPS, CLASSES)
    for hf_out, mine in zip(hf_outputs, ours_matches, strict=True):
        hf_idx = hf_matcher(hf_out, _hf_labels(targets), GROUPS)
        assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(hf_idx, mine))
    assert [len(q) for q, _ in ours_matches[0]] == [3 * GROUPS, 0, 1 * GROUPS]

    losses = criterion(out, targets)
    assert _compare(theirs.loss, theirs.loss_dict, losses, criterion) < TOL
    total = weighted_loss(losses, criterion.weight_dict)  # what the engine's step computes
    assert float((total - theirs.loss).detach().abs()) < TOL
    total.backward()

    # Gradients: every parameter ours has, mapped back from transformers' by the key map.
    hf_grads = {k: p.grad for k, p in hf.named_parameters() if p.grad is not None}
    mapped, _, _ = rfdetr_hf_to_ours(hf_grads)
    params = dict(ours.named_parameters())
    missing = [n for n, p in params.items() if p.grad is None]
    assert not missing, missing
    assert set(mapped) == set(params)
    worst = max(float((params[k].grad - g).abs().max()) for k, g in mapped.items())
    assert worst < 1e-6, worst  # gradients up to ~0.5; measured 1.5e-8
    assert all(torch.isfinite(p.grad).all() for p in params.values())


def test_post_processor_takes_the_eval_output(hf_folder) -> None:
    _, folder = hf_folder
    model, _ = rfdetr_from_hf(folder)
    criterion, post = rfdetr_training_parts(model)
    assert isinstance(post, RTDETRPostProcess) and post.num_top_queries == QUERIES
    with torch.no_grad():
        out = model(torch.rand(1, 3, *NATIVE))
        dets = post(out, torch.tensor([[56, 56]]))
        # eval: one group, no num_groups in the output, the criterion matches one group
        losses = criterion(out, _targets([2], seed=5))
    assert dets[0]["boxes"].shape == (QUERIES, 4)
    assert set(losses) == {"loss_iabce", "loss_bbox", "loss_giou"}


# --- the criterion alone against transformers' loss function ---------------------------------------


def _random_outputs(batch: int, seed: int) -> dict[str, torch.Tensor]:
    """Leaf tensors standing for the model's outputs (layers stacked), in (0, 1) boxes."""
    g = torch.Generator().manual_seed(seed)
    n = GROUPS * QUERIES

    def boxes(*shape):
        centre = torch.rand(*shape, 2, generator=g) * 0.8 + 0.1
        return torch.cat([centre, torch.rand(*shape, 2, generator=g) * 0.4 + 0.02], -1)

    return {
        "logits": (torch.randn(LAYERS, batch, n, CLASSES, generator=g) * 2 - 2).requires_grad_(),
        "boxes": boxes(LAYERS, batch, n).requires_grad_(),
        "enc_logits": (torch.randn(batch, n, CLASSES, generator=g) * 2 - 2).requires_grad_(),
        "enc_boxes": boxes(batch, n).requires_grad_(),
    }


@pytest.mark.parametrize("counts", [[2, 0, 5], [0, 0]], ids=["mixed", "all-empty"])
def test_criterion_equals_transformers_loss_function_on_the_same_tensors(counts) -> None:
    """The very same output tensors into both: losses and their gradients w.r.t. every output."""
    t = _random_outputs(len(counts), seed=7)
    targets = _targets(counts, seed=8)
    cfg = _config()
    loss, loss_dict, _ = LwDetrForObjectDetectionLoss(
        t["logits"][-1], _hf_labels(targets), "cpu", t["boxes"][-1], cfg, t["logits"], t["boxes"],
        t["enc_logits"], t["enc_boxes"],
    )  # fmt: skip
    theirs = torch.autograd.grad(loss, list(t.values()))

    outputs = {
        "pred_logits": t["logits"][-1],
        "pred_boxes": t["boxes"][-1],
        "aux_outputs": [
            {"pred_logits": lg, "pred_boxes": bx} for lg, bx in zip(t["logits"][:-1], t["boxes"][:-1])
        ],
        "enc_aux_outputs": [{"pred_logits": t["enc_logits"], "pred_boxes": t["enc_boxes"]}],
        "num_groups": GROUPS,
    }
    criterion = RFDETRCriterion(CLASSES, dec_layers=LAYERS)
    losses = criterion(outputs, targets)
    assert _compare(loss, loss_dict, losses, criterion) < TOL
    mine = torch.autograd.grad(criterion.total(losses), list(t.values()))
    for a, b in zip(theirs, mine):
        assert (a - b).abs().max() < 1e-6
    if not sum(counts):  # no boxes: the class loss of all negatives over max(0 x G, 1) = 1
        assert float(losses["loss_bbox"].detach()) == 0 and float(losses["loss_iabce"].detach()) > 0


# --- Group DETR ----------------------------------------------------------------------------------


def test_group_normaliser_is_boxes_times_groups() -> None:
    targets = _targets([3, 0, 2], seed=1)
    assert float(group_num_boxes(targets, 13, torch.device("cpu"))) == 5 * 13
    assert float(group_num_boxes(targets, 1, torch.device("cpu"))) == 5
    # no boxes: clamped to 1 after the multiplication (rf-detr / transformers)
    assert float(group_num_boxes(_targets([0, 0], 1), 13, torch.device("cpu"))) == 1
    # --grad-accum-steps: the engine's share of the step's boxes, times the groups
    assert float(group_num_boxes(targets, 4, torch.device("cpu"), torch.tensor(2.5))) == 10.0


def test_micro_batches_with_the_engines_share_sum_to_the_large_batch() -> None:
    """``--grad-accum-steps``: the engine passes ``num_boxes`` = the step's boxes x the micro-batch's
    share (:func:`peg_detr.task.step_num_boxes`) and back-propagates ``share x loss``; the criterion
    multiplies by the groups, so the shares' sum is the large batch's every term."""
    t = _random_outputs(3, seed=21)
    targets = _targets([3, 0, 1], seed=22)

    def outputs(rows: slice) -> dict:
        return {
            "pred_logits": t["logits"][-1][rows],
            "pred_boxes": t["boxes"][-1][rows],
            "aux_outputs": [{"pred_logits": t["logits"][0][rows], "pred_boxes": t["boxes"][0][rows]}],
            "enc_aux_outputs": [{"pred_logits": t["enc_logits"][rows], "pred_boxes": t["enc_boxes"][rows]}],
            "num_groups": GROUPS,
        }

    criterion = RFDETRCriterion(CLASSES, dec_layers=LAYERS)
    large = criterion(outputs(slice(0, 3)), targets)
    step_boxes = torch.tensor(4.0)  # over processes / world size, at least 1
    summed: dict[str, torch.Tensor] = {}
    for rows, share in ((slice(0, 2), 2 / 3), (slice(2, 3), 1 / 3)):
        micro = criterion(outputs(rows), targets[rows], num_boxes=step_boxes * share)
        for k, v in micro.items():
            summed[k] = summed.get(k, 0) + share * v
    assert set(summed) == set(large)
    assert all(abs(float((summed[k] - large[k]).detach())) < 1e-6 for k in large)


def test_copied_groups_give_the_one_group_losses_and_matches() -> None:
    """G identical groups: each is matched on its own (the same queries, offset by g*Q), and with the
    normaliser boxes x G every loss equals the one group's."""
    t = _random_outputs(3, seed=11)
    one = {
        "pred_logits": t["logits"][-1][:, :QUERIES],
        "pred_boxes": t["boxes"][-1][:, :QUERIES],
        "enc_aux_outputs": [
            {"pred_logits": t["enc_logits"][:, :QUERIES], "pred_boxes": t["enc_boxes"][:, :QUERIES]}
        ],
    }
    copies = {
        "pred_logits": one["pred_logits"].repeat(1, 4, 1),
        "pred_boxes": one["pred_boxes"].repeat(1, 4, 1),
        "enc_aux_outputs": [{k: v.repeat(1, 4, 1) for k, v in one["enc_aux_outputs"][0].items()}],
        "num_groups": 4,
    }
    targets = _targets([4, 0, 2], seed=12)
    criterion = RFDETRCriterion(CLASSES, dec_layers=1)
    single, grouped = criterion(one, targets), criterion(copies, targets)
    assert set(single) == set(grouped)
    assert all(abs(float(single[k] - grouped[k])) < 1e-6 for k in single)
    (base,), (four,) = (
        group_detr_matches(criterion.matcher, [o], targets, g) for o, g in ((one, 1), (copies, 4))
    )
    for (q1, t1), (q4, t4) in zip(base, four):
        assert torch.equal(q4, torch.cat([q1 + g * QUERIES for g in range(4)]))
        assert torch.equal(t4, t1.repeat(4))


def test_groups_are_matched_separately_not_jointly() -> None:
    """One target, two groups: each group gets its own positive (a joint matching would give one)."""
    logits = torch.full((1, 4, 2), -3.0)
    boxes = torch.tensor(
        [[[0.5, 0.5, 0.2, 0.2], [0.1, 0.1, 0.05, 0.05], [0.9, 0.9, 0.05, 0.05], [0.52, 0.5, 0.2, 0.2]]]
    )
    target = [{"labels": torch.tensor([1]), "boxes": torch.tensor([[0.5, 0.5, 0.2, 0.2]])}]
    criterion = RFDETRCriterion(2, dec_layers=1)
    (((query, tgt),),) = group_detr_matches(
        criterion.matcher, [{"pred_logits": logits, "pred_boxes": boxes}], target, 2
    )
    assert query.tolist() == [0, 3] and tgt.tolist() == [0, 0]
    with pytest.raises(ValueError, match="Group DETR groups"):
        group_detr_matches(criterion.matcher, [{"pred_logits": logits, "pred_boxes": boxes}], target, 3)


# --- IA-BCE by hand ------------------------------------------------------------------------------


def test_ia_bce_one_query_two_classes_by_hand() -> None:
    """Class 0 positive with IoU 0.6, class 1 negative: the formula in float64, value and gradient."""
    x = torch.tensor([[0.4, -1.2]], dtype=torch.float64, requires_grad=True)
    positive = torch.tensor([[True, False]])
    iou = torch.tensor([[0.6, 0.0]], dtype=torch.float64)
    loss = iou_aware_bce_loss(x, positive, iou)
    p0, p1 = 1 / (1 + math.exp(-0.4)), 1 / (1 + math.exp(1.2))
    t = max(p0**0.25 * 0.6**0.75, 0.01)
    want = -t * math.log(p0) - (1 - t) * math.log(1 - p0) - p1**2 * math.log(1 - p1)
    assert float(loss) == pytest.approx(want, abs=1e-12)
    loss.backward()
    # positive: BCE towards the detached quality; negative: d/dx of p^2 * -log(1 - p) (weight not detached)
    assert float(x.grad[0, 0]) == pytest.approx(p0 - t, abs=1e-12)
    d_neg = 2 * p1 * p1 * (1 - p1) * -math.log(1 - p1) + p1**2 * p1
    assert float(x.grad[0, 1]) == pytest.approx(d_neg, abs=1e-12)


def test_ia_bce_quality_floor_and_finite_at_extreme_logits() -> None:
    x = torch.tensor([[-60.0, 60.0]], requires_grad=True)
    positive = torch.tensor([[True, False]])
    loss = iou_aware_bce_loss(x, positive, torch.tensor([[0.0, 0.0]]))
    # positive with IoU 0: quality floored at 0.01; the confident negative: ~60 (focal weight ~1)
    assert torch.isfinite(loss) and float(loss) == pytest.approx(0.01 * 60 + 60, rel=1e-4)
    loss.backward()
    assert torch.isfinite(x.grad).all()


def test_weight_dict_follows_the_model() -> None:
    model = rfdetr_from_hf_config(_config(decoder_layers=3))
    criterion, _ = rfdetr_training_parts(model, {"loss_iabce": 2.0, "loss_bbox": 4.0, "loss_giou": 1.0})
    w = criterion.weight_dict
    assert w["loss_iabce"] == 2.0 and w["loss_bbox"] == 4.0 and w["loss_giou"] == 1.0
    assert set(w) == {
        f"loss_{k}{s}" for k in ("iabce", "bbox", "giou") for s in ("", "_aux_0", "_aux_1", "_enc_0")
    }
    assert set(build_rfdetr_weight_dict(aux_loss=False)) == {"loss_iabce", "loss_bbox", "loss_giou"}


# --- training ------------------------------------------------------------------------------------


def test_twenty_steps_on_one_image_lower_the_loss() -> None:
    """AdamW at 1e-2 (no decay): a random model's two-stage selection reshuffles its queries while
    the zero-initialised box heads are still small, so a small rate only moves the loss sideways in
    20 steps; at 1e-2 the heads learn the two boxes.  The last 5 steps' mean is compared (the
    per-step loss is not monotone: the matching and the top-k change from step to step)."""
    torch.manual_seed(0)
    model = rfdetr_from_hf_config(_config()).train()
    criterion, _ = rfdetr_training_parts(model)
    x = torch.rand(1, 3, *NON_SQUARE, generator=torch.Generator().manual_seed(2))
    targets = _targets([2], seed=6)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    history = []
    for _ in range(20):
        loss = criterion.total(criterion(model(x), targets))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        history.append(float(loss))
    assert all(math.isfinite(v) for v in history)
    assert sum(history[-5:]) / 5 < 0.8 * history[0], history
