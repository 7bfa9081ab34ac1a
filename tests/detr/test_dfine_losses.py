"""D-FINE's and DEIM's losses: hand-computed small cases (weighting function, box -> bin targets,
FGL, DDF, MAL) and the whole criterion against transformers' DFineLoss / Deimv2Loss on the same
synthetic outputs."""

from __future__ import annotations

import math

import pytest
import torch

from peg_detr.models.dfine.criterion import (
    DFineCriterion,
    bbox2distance,
    build_dfine_weight_dict,
    distillation_loss,
    fine_grained_localization_loss,
    matchability_aware_loss,
    translate_gt,
    union_matches,
)
from peg_detr.models.dfine.fdr import distance2bbox, weighting_function
from peg_detr.models.matcher import HungarianMatcher

UP, REG_SCALE = torch.tensor([0.5]), torch.tensor([4.0])


def project(bins: int) -> torch.Tensor:
    return weighting_function(bins, UP, REG_SCALE)


def target(labels, boxes):
    return {"labels": torch.tensor(labels, dtype=torch.int64), "boxes": torch.tensor(boxes).view(-1, 4)}


# --- pure functions on hand-computed cases -------------------------------------------------------


def test_weighting_function_hand_values():
    # c = up * reg_scale = 2, step = (c + 1) ** (2 / (N - 2)).
    # N = 4 -> step 3, W = [-2c, 1 - 3, 0, 3 - 1, 2c].
    assert project(4).tolist() == [-4.0, -2.0, 0.0, 2.0, 4.0]
    # N = 8 -> step 3 ** (1 / 3) = 1.44225: inner offsets step^k - 1 for k = 1, 2, 3 (the last = c).
    w = project(8)
    inner = [3 ** (1 / 3) - 1, 3 ** (2 / 3) - 1, 2.0]  # 0.44225, 1.08008, 2
    want = [-4.0, *[-v for v in reversed(inner)], 0.0, *inner, 4.0]
    torch.testing.assert_close(w, torch.tensor(want), rtol=0, atol=1e-6)


def test_bbox2distance_inverts_distance2bbox_and_reference_box_is_zero():
    g = torch.Generator().manual_seed(0)
    ref = torch.cat([0.3 + 0.4 * torch.rand(6, 2, generator=g), 0.1 + 0.3 * torch.rand(6, 2, generator=g)], 1)
    boxes = torch.cat(
        [0.3 + 0.4 * torch.rand(6, 2, generator=g), 0.1 + 0.3 * torch.rand(6, 2, generator=g)], 1
    )
    dist = bbox2distance(ref, boxes, REG_SCALE)
    torch.testing.assert_close(distance2bbox(ref, dist, REG_SCALE), boxes, rtol=0, atol=1e-6)
    assert bbox2distance(ref, ref, 4.0).abs().max() < 1e-5


def test_translate_gt_hand_cases():
    # N = 4, W = [-4, -2, 0, 2, 4].
    d = torch.tensor([0.0, 1.0, 3.0, -3.0, 0.5, -5.0, 4.0, 10.0, float("nan")])
    left, wl, wr = translate_gt(d, project(4))
    assert left.tolist() == [2, 2, 3, 0, 2, 0, 3, 3, 0]
    torch.testing.assert_close(wr, torch.tensor([0.0, 0.5, 0.5, 0.5, 0.25, 0.0, 1.0, 1.0, 0.0]))
    torch.testing.assert_close(wl + wr, torch.ones(9))


def test_box_equal_to_reference_targets_the_centre_bin():
    ref = torch.tensor([[0.5, 0.4, 0.2, 0.3]])
    for bins in (4, 8, 32):
        left, wl, wr = translate_gt(bbox2distance(ref, ref.clone(), REG_SCALE), project(bins))
        # All four edges: offset 0 -> the centre bin N / 2 (W = 0) with weight 1 (left) / 0 (right).
        mass = torch.zeros(4, bins + 1)
        mass[torch.arange(4), left] += wl
        mass[torch.arange(4), left + 1] += wr
        want = torch.zeros(4, bins + 1)
        want[:, bins // 2] = 1
        torch.testing.assert_close(mass, want, rtol=0, atol=1e-5)


def test_bbox2distance_matches_transformers():
    pytest.importorskip("transformers")
    from transformers.loss.loss_d_fine import bbox2distance as hf_bbox2distance

    g = torch.Generator().manual_seed(1)
    ref = torch.cat(
        [0.3 + 0.4 * torch.rand(20, 2, generator=g), 0.05 + 0.3 * torch.rand(20, 2, generator=g)], 1
    )
    boxes = torch.cat(
        [0.1 + 0.8 * torch.rand(20, 2, generator=g), 0.02 + 0.6 * torch.rand(20, 2, generator=g)], 1
    )
    xyxy = torch.cat([boxes[:, :2] - boxes[:, 2:] / 2, boxes[:, :2] + boxes[:, 2:] / 2], 1)
    hf_pos, hf_wr, hf_wl = hf_bbox2distance(ref, xyxy, 8, 4.0, UP)
    left, wl, wr = translate_gt(bbox2distance(ref, boxes, REG_SCALE), project(8))
    assert torch.equal(left, hf_pos.long())  # transformers' float position, N - 0.1 at the top
    torch.testing.assert_close(wr, hf_wr, rtol=0, atol=1e-5)
    torch.testing.assert_close(wl, hf_wl, rtol=0, atol=1e-5)


def test_fgl_of_correct_and_wrong_distributions():
    one = torch.ones(1)
    left, wl, wr = translate_gt(torch.tensor([0.0]), project(4))  # on bin 2 exactly
    peaked = torch.full((1, 5), -30.0)
    peaked[0, 2] = 30.0
    assert fine_grained_localization_loss(peaked, left, wl, wr, one) < 1e-12
    # Offset 1, halfway between bins 2 and 3, logits [2, 0, 0, 0, 0]: CE is log(e^2 + 4) at both bins.
    left, wl, wr = translate_gt(torch.tensor([1.0]), project(4))
    wrong = torch.tensor([[2.0, 0.0, 0.0, 0.0, 0.0]])
    got = fine_grained_localization_loss(wrong, left, wl, wr, torch.tensor([0.8]))
    assert got.item() == pytest.approx(0.8 * math.log(math.e**2 + 4), rel=1e-6)  # 0.8 * 2.43271


def test_ddf_of_identical_student_and_teacher_is_zero():
    corners = torch.randn(12, 9, generator=torch.Generator().manual_seed(2))
    assert distillation_loss(corners, corners.clone()).abs().max() < 1e-6
    # The last layer, its own teacher, inside the criterion: an exact zero that still backpropagates.
    crit = DFineCriterion(3, reg_max=4)
    out = synthetic_outputs(
        torch.Generator().manual_seed(3), bins=4, layers=1, queries=4, classes=3, dn_group=1
    )
    last = out["dn_outputs"][-1]
    last["pred_corners"].requires_grad_(True)
    assert last["teacher_corners"] is last["pred_corners"]
    losses = crit(out, synthetic_targets())
    assert losses["loss_ddf_dn_0"].item() == 0.0 and losses["loss_ddf_dn_0"].requires_grad


def test_ddf_hand_case_and_split():
    # One image, two queries; query 0 matched (IoU weight 0.5), query 1 unmatched (teacher
    # probability sigmoid(0) = 0.5 on its best class).  With teacher = student except query 1's
    # first edge, only that edge has a KL: the matched mean is 0 and the result is
    # sqrt(1) / (sqrt(1) + sqrt(1)) * (0.5 * kl / 4).
    bins = 4
    student = torch.zeros(1, 2, 4 * (bins + 1))
    teacher = student.clone()
    teacher[0, 1, :5] = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0])
    kl = distillation_loss(student[0, 1, :5].view(1, 5), teacher[0, 1, :5].view(1, 5), 5.0).item()
    p = torch.softmax(torch.tensor([0.2, 0, 0, 0, 0]), 0)
    assert kl == pytest.approx(25 * float((p * (p * 5).log()).sum()), rel=1e-5)
    crit = DFineCriterion(2, reg_max=bins, losses=("local",))
    out = {
        "pred_logits": torch.tensor([[[5.0, -5.0], [-5.0, -5.0]]]),
        "pred_boxes": torch.tensor([[[0.5, 0.5, 0.4, 0.4], [0.1, 0.1, 0.05, 0.05]]]),
        "pred_corners": student.clone(),
        "ref_points": torch.tensor([[[0.5, 0.5, 0.4, 0.4], [0.1, 0.1, 0.05, 0.05]]]),
        "up": UP,
        "reg_scale": REG_SCALE,
    }
    aux = {**out, "pred_corners": student, "teacher_corners": teacher, "teacher_logits": torch.zeros(1, 2, 2)}
    # Target: IoU 0.5 with query 0's box (0.4 x 0.4 inside 0.4 x 0.8).
    out["aux_outputs"] = [aux]
    losses = crit(out, [target([0], [0.5, 0.5, 0.4, 0.8])])
    assert losses["loss_ddf_aux_0"].item() == pytest.approx(0.5 * (0.5 * kl / 4), rel=1e-5)


def test_mal_hand_case_two_queries():
    # gamma 1.5.  Query 0 matched with IoU 0.64 and logit 1: target 0.64^1.5 = 0.512, weight 1,
    # BCE = softplus(1) - 0.512 = 0.801262.  Query 1 unmatched with logit -1: weight
    # sigmoid(-1)^1.5 = 0.139473, BCE = softplus(-1) = 0.313262 -> 0.043691.
    logits = torch.tensor([[[1.0], [-1.0]]])
    positive = torch.tensor([[[True], [False]]])
    iou = torch.tensor([[[0.64], [0.0]]])
    want = (math.log1p(math.e) - 0.512) + (1 / (1 + math.e)) ** 1.5 * math.log1p(math.exp(-1))
    assert matchability_aware_loss(logits, positive, iou, gamma=1.5).item() == pytest.approx(want, rel=1e-6)
    assert want == pytest.approx(0.844953, abs=1e-6)
    # The same through the criterion: the target box (0.5 x 0.5) around query 0's (0.4 x 0.4): IoU 0.64.
    crit = DFineCriterion(1, losses=("mal",), gamma=1.5)
    out = {
        "pred_logits": logits,
        "pred_boxes": torch.tensor([[[0.5, 0.5, 0.4, 0.4], [0.1, 0.1, 0.05, 0.05]]]),
    }
    losses = crit(out, [target([0], [0.5, 0.5, 0.5, 0.5])])
    assert losses["loss_mal"].item() == pytest.approx(want, rel=1e-6)
    # mal_alpha scales the negatives only.
    crit.mal_alpha = 0.5
    half = (math.log1p(math.e) - 0.512) + 0.5 * (1 / (1 + math.e)) ** 1.5 * math.log1p(math.exp(-1))
    assert crit(out, [target([0], [0.5, 0.5, 0.5, 0.5])])["loss_mal"].item() == pytest.approx(half, rel=1e-6)


def test_focal_hand_case():
    # alpha 0.25, gamma 2.  Query 0 matched (class 0), logit 1: alpha (1 - p)^2 softplus(-1) with
    # p = sigmoid(1) -> 0.005665.  Query 1 unmatched, logit -1: (1 - alpha) p^2 softplus(-1) with
    # p = sigmoid(-1) -> 0.016993.
    p = 1 / (1 + math.exp(-1))
    want = 0.25 * (1 - p) ** 2 * math.log1p(math.exp(-1)) + 0.75 * (1 - p) ** 2 * math.log1p(math.exp(-1))
    assert want == pytest.approx(0.022658, abs=1e-6)
    crit = DFineCriterion(1, losses=("focal",), alpha=0.25, gamma=2.0)
    out = {
        "pred_logits": torch.tensor([[[1.0], [-1.0]]]),
        "pred_boxes": torch.tensor([[[0.5, 0.5, 0.4, 0.4], [0.1, 0.1, 0.05, 0.05]]]),
    }
    got = crit(out, [target([0], [0.5, 0.5, 0.5, 0.5])])["loss_focal"]
    assert got.item() == pytest.approx(want, rel=1e-6)


def test_union_matches_keeps_each_querys_most_frequent_target():
    layers = [
        [(torch.tensor([0, 1, 2]), torch.tensor([0, 1, 2])), (torch.tensor([3]), torch.tensor([0]))],
        [(torch.tensor([0, 1, 4]), torch.tensor([1, 1, 2])), (torch.tensor([3]), torch.tensor([0]))],
        [(torch.tensor([0, 5, 2]), torch.tensor([1, 0, 2])), (torch.tensor([1]), torch.tensor([0]))],
    ]
    (q0, t0), (q1, t1) = union_matches(layers)
    # Query 0: target 1 twice, target 0 once -> 1.  Queries 2 (target 2), 4, 5 once each.
    assert q0.tolist() == [0, 1, 2, 4, 5] and t0.tolist() == [1, 1, 2, 2, 0]
    assert q1.tolist() == [1, 3] and t1.tolist() == [0, 0]
    # A tie (query 7: targets 3 and 1 once each) goes to the smaller target.
    ((q, t),) = union_matches(
        [[(torch.tensor([7]), torch.tensor([3]))], [(torch.tensor([7]), torch.tensor([1]))]]
    )
    assert q.tolist() == [7] and t.tolist() == [1]
    empty = torch.empty(0, dtype=torch.int64)
    assert union_matches([[(empty, empty)], [(empty, empty)]])[0][0].numel() == 0


def test_union_matches_equals_transformers_dense_o2o():
    pytest.importorskip("transformers")
    from transformers.loss.loss_deimv2 import Deimv2Loss

    g = torch.Generator().manual_seed(4)
    for _ in range(20):
        layers = []
        for _ in range(5):
            per_image = []
            for n in (4, 2):
                q = torch.randperm(6, generator=g)[:n]
                per_image.append((q, torch.randperm(n, generator=g)))
            layers.append(per_image)
        ours = union_matches(layers)
        theirs = Deimv2Loss._get_dense_o2o_indices(None, layers[0], layers[1:])
        for (q, t), (hq, ht) in zip(ours, theirs):
            assert sorted(zip(q.tolist(), t.tolist())) == sorted(zip(hq.tolist(), ht.tolist()))


# --- the whole criterion against transformers --------------------------------------------------


def synthetic_targets() -> list[dict[str, torch.Tensor]]:
    return [
        target([1, 0, 2], [[0.3, 0.3, 0.2, 0.3], [0.6, 0.5, 0.3, 0.2], [0.5, 0.7, 0.25, 0.25]]),
        target([2, 2], [[0.4, 0.6, 0.3, 0.3], [0.7, 0.3, 0.2, 0.25]]),
    ]


def _boxes(g: torch.Generator, *shape: int) -> torch.Tensor:
    centre = 0.25 + 0.5 * torch.rand(*shape, 2, generator=g)
    size = 0.1 + 0.3 * torch.rand(*shape, 2, generator=g)
    return torch.cat([centre, size], -1)


def synthetic_outputs(
    g: torch.Generator,
    *,
    bins: int = 8,
    layers: int = 3,
    queries: int = 10,
    classes: int = 4,
    dn_group: int = 2,
    dn_queries: int | None = None,
    pre: bool = True,
) -> dict:
    """Random outputs laid out as the D-FINE model returns them: ``layers`` decoder layers (the last
    one is the main output, every earlier one has the last as teacher), a pre-bbox head, one set
    of encoder proposals, and ``dn_group`` denoising groups over ``dn_queries`` queries per image
    (positives at random distinct positions) for :func:`synthetic_targets`."""
    b, c4 = 2, 4 * (bins + 1)
    logits = [torch.randn(b, queries, classes, generator=g) for _ in range(layers)]
    boxes = [_boxes(g, b, queries) for _ in range(layers)]
    corners = [torch.randn(b, queries, c4, generator=g) for _ in range(layers)]
    ref = _boxes(g, b, queries)  # D-FINE's layers share the pre-bbox head's reference boxes
    out = {
        "pred_logits": logits[-1],
        "pred_boxes": boxes[-1],
        "pred_corners": corners[-1],
        "ref_points": ref,
        "up": UP,
        "reg_scale": REG_SCALE,
        "aux_outputs": [
            {
                "pred_logits": logits[i],
                "pred_boxes": boxes[i],
                "pred_corners": corners[i],
                "ref_points": ref,
                "teacher_corners": corners[-1],
                "teacher_logits": logits[-1],
            }
            for i in range(layers - 1)
        ],
        "enc_aux_outputs": [
            {
                "pred_logits": torch.randn(b, queries, classes, generator=g),
                "pred_boxes": _boxes(g, b, queries),
            }
        ],
        "enc_meta": {"class_agnostic": False},
    }
    if pre:
        out["pre_outputs"] = {
            "pred_logits": torch.randn(b, queries, classes, generator=g),
            "pred_boxes": _boxes(g, b, queries),
        }
    sizes = [len(t["labels"]) for t in synthetic_targets()]
    nq = dn_queries if dn_queries is not None else 2 * dn_group * max(sizes)
    dn_logits = [torch.randn(b, nq, classes, generator=g) for _ in range(layers)]
    dn_boxes = [_boxes(g, b, nq) for _ in range(layers)]
    dn_corners = [torch.randn(b, nq, c4, generator=g) for _ in range(layers)]
    dn_ref = _boxes(g, b, nq)
    out["dn_outputs"] = [
        {
            "pred_logits": dn_logits[i],
            "pred_boxes": dn_boxes[i],
            "pred_corners": dn_corners[i],
            "ref_points": dn_ref,
            "teacher_corners": dn_corners[-1],
            "teacher_logits": dn_logits[-1],
        }
        for i in range(layers)
    ]
    out["dn_pre_outputs"] = {
        "pred_logits": torch.randn(b, nq, classes, generator=g),
        "pred_boxes": _boxes(g, b, nq),
    }
    positives = [torch.randperm(nq, generator=g)[: dn_group * n] for n in sizes]
    out["dn_meta"] = {"dn_positive_idx": positives, "dn_num_group": dn_group, "dn_num_split": [nq, queries]}
    return out


def _hf_layer(o: dict) -> dict:
    return {("logits" if k == "pred_logits" else k): v for k, v in o.items()}


def to_transformers(out: dict) -> tuple[dict, list[dict], dict[str, str]]:
    """The same outputs in transformers' layout, and our key -> their key.

    transformers has no pre-bbox / denoising-pre outputs and puts the encoder proposals at the end
    of ``auxiliary_outputs``: our ``pre_outputs`` go there too (before the encoder's), so that
    their suffixes are ``_aux_{L-1}`` (pre) and ``_aux_{L}`` (encoder).  Their last layer has no
    corners; it is given its own corners as teacher, which makes their FGL of the last layer
    comparable (their DDF of it is a zero, ours is absent).
    """
    aux = out["aux_outputs"]
    main = _hf_layer({k: out[k] for k in ("pred_logits", "pred_boxes", "pred_corners", "ref_points")})
    main.update(teacher_corners=out["pred_corners"], teacher_logits=out["pred_logits"])
    extra = ([out["pre_outputs"]] if "pre_outputs" in out else []) + out["enc_aux_outputs"]
    main["auxiliary_outputs"] = [_hf_layer(o) for o in aux + extra]
    main["dn_auxiliary_outputs"] = [_hf_layer(o) for o in out["dn_outputs"]]
    main["denoising_meta_values"] = out["dn_meta"]
    names = {"": ""} | {f"_aux_{i}": f"_aux_{i}" for i in range(len(aux))}
    if "pre_outputs" in out:
        names["_pre"] = f"_aux_{len(aux)}"
    names["_enc_0"] = f"_aux_{len(aux) + len(extra) - 1}"
    names |= {f"_dn_{i}": f"_dn_{i}" for i in range(len(out["dn_outputs"]))}
    targets = [{"class_labels": t["labels"], "boxes": t["boxes"]} for t in synthetic_targets()]
    return main, targets, names


def compare(ours: dict, theirs: dict, names: dict[str, str], weights: dict[str, float]) -> dict[str, float]:
    """Max |ours * weight - theirs| per loss name; every one of their terms must have ours."""
    diffs: dict[str, float] = {}
    matched = set()
    for key, value in ours.items():
        loss = "_".join(key.split("_")[:2])
        suffix = key[len(loss) :]
        if suffix not in names:
            continue  # _dn_pre: transformers has none
        theirs_key = loss + names[suffix]
        assert theirs_key in theirs, f"transformers has no {theirs_key} for our {key}"
        matched.add(theirs_key)
        d = abs(value.item() * weights[loss] - theirs[theirs_key].item())
        diffs[loss] = max(diffs.get(loss, 0.0), d)
    # Their only extra term: the last layer's DDF against itself, a zero.
    assert set(theirs) - matched == {"loss_ddf"} and theirs["loss_ddf"].item() == 0.0
    return diffs


HF_MATCHER = {"cost_class": 2.0, "cost_bbox": 5.0, "cost_giou": 2.0}


def test_criterion_equals_transformers_dfine_loss():
    """transformers' DFineLoss matches every output on its own (no union set): ours with
    ``use_uni_set=False``.  Every query of the batch is matched (queries > targets), so the
    non-denoising DDF split is 5 matched of 2 x 10; transformers balances the denoising DDF with
    the denoising counts, D-FINE (and we) with the decoder's: with ``dn_group * 10`` denoising
    queries per image, 10 positives of 40, the two ratios are equal and so are the losses.
    (Their focal class loss cannot run: it passes integer targets and alpha as num_boxes; ours is
    checked by hand in test_focal_hand_case.)"""
    pytest.importorskip("transformers")
    from transformers import DFineConfig
    from transformers.loss.loss_d_fine import DFineLoss

    g = torch.Generator().manual_seed(5)
    out = synthetic_outputs(g, bins=8, classes=4, queries=10, dn_group=2, dn_queries=20)
    config = DFineConfig(num_labels=4, max_num_bins=8, **{f"matcher_{k}": v for k, v in HF_MATCHER.items()})
    hf = DFineLoss(config)
    hf_out, hf_targets, names = to_transformers(out)
    theirs = hf(hf_out, hf_targets)

    crit = DFineCriterion(
        4, losses=("vfl", "boxes", "local"), reg_max=8, alpha=0.75, gamma=2.0, use_uni_set=False
    )
    ours = crit(out, synthetic_targets())
    diffs = compare(ours, theirs, names, hf.weight_dict)
    print("vfl", {k: f"{v:.2e}" for k, v in diffs.items()})
    assert set(diffs) == {"loss_vfl", "loss_bbox", "loss_giou", "loss_fgl", "loss_ddf"}
    assert max(diffs.values()) <= 1e-5


def test_criterion_equals_transformers_deimv2_loss_with_mal():
    """DEIM's configuration (MAL, gamma 1.5, union set) against transformers' Deimv2Loss with
    dense one-to-one, which takes the union over the last layer and its auxiliary outputs (ours,
    the pre-bbox head's and the encoder's included: both given to it as auxiliary outputs).  The
    denoising group count and size are chosen so that the decoder's and the denoising DDF split
    ratios are equal (see test_criterion_equals_transformers_dfine_loss)."""
    pytest.importorskip("transformers")
    from transformers import Deimv2Config
    from transformers.loss.loss_deimv2 import Deimv2Loss

    crit = DFineCriterion(4, losses=("mal", "boxes", "local"), reg_max=8, gamma=1.5, use_uni_set=True)
    g = torch.Generator().manual_seed(6)
    queries = 20
    out = synthetic_outputs(g, bins=8, classes=4, queries=queries, dn_group=1, dn_queries=queries)
    named = [out, *out["aux_outputs"], out["pre_outputs"], *out["enc_aux_outputs"]]
    union = union_matches(crit._match(named, synthetic_targets()))
    n_union, n_targets = sum(len(q) for q, _ in union), 5
    assert n_union > n_targets  # the layers disagree: the union set is not one layer's matching
    # Ratio n_union / (2 * queries) == group * n_targets / (2 * dn_queries).
    gcd = math.gcd(n_union, n_targets * queries)
    group, dn_queries = n_union // gcd, n_targets * queries // gcd
    dn = synthetic_outputs(g, bins=8, classes=4, queries=queries, dn_group=group, dn_queries=dn_queries)
    out.update({k: dn[k] for k in ("dn_outputs", "dn_pre_outputs", "dn_meta")})

    config = Deimv2Config(
        num_labels=4,
        max_num_bins=8,
        focal_loss_gamma=1.5,
        **{f"matcher_{k}": v for k, v in HF_MATCHER.items()},
    )
    hf = Deimv2Loss(config)
    hf_out, hf_targets, names = to_transformers(out)
    theirs = hf(hf_out, hf_targets)
    ours = crit(out, synthetic_targets())
    diffs = compare(ours, theirs, names, hf.weight_dict)
    print("mal", {k: f"{v:.2e}" for k, v in diffs.items()})
    assert set(diffs) == {"loss_mal", "loss_bbox", "loss_giou", "loss_fgl", "loss_ddf"}
    assert max(diffs.values()) <= 1e-5


def test_denoising_ddf_uses_the_decoders_split():
    """D-FINE balances the denoising layers' DDF with the last non-denoising layer's counts."""
    crit = DFineCriterion(4, losses=("local",), reg_max=8, use_uni_set=False)  # 5 matched per layer
    g = torch.Generator().manual_seed(7)
    out = synthetic_outputs(g, queries=10, dn_group=2, dn_queries=12)
    targets = synthetic_targets()
    losses = crit(out, targets)
    # Recompute the first denoising layer's DDF by hand with the decoder's split (5 of 20 matched).
    dn, b, q = out["dn_outputs"][0], [], []
    for i, idx in enumerate(out["dn_meta"]["dn_positive_idx"]):
        b += [i] * len(idx)
        q += idx.tolist()
    b, q = torch.tensor(b), torch.tensor(q)
    n_pos = len(b)
    t = torch.arange(3).repeat(2).tolist() + (3 + torch.arange(2)).repeat(2).tolist()
    boxes = torch.cat([x["boxes"] for x in targets])[t]
    xyxy = lambda x: torch.cat([x[:, :2] - x[:, 2:] / 2, x[:, :2] + x[:, 2:] / 2], 1)  # noqa: E731
    from torchvision.ops import box_iou

    iou = torch.diag(box_iou(xyxy(dn["pred_boxes"][b, q]), xyxy(boxes)))
    kl = distillation_loss(dn["pred_corners"].reshape(-1, 9), dn["teacher_corners"].reshape(-1, 9)).view(
        2, 12, 4
    )
    weight = dn["teacher_logits"].sigmoid().amax(-1)
    weight[b, q] = iou
    mask = torch.zeros(2, 12, dtype=torch.bool)
    mask[b, q] = True
    loss = weight.unsqueeze(-1) * kl
    pos, neg = loss[mask].mean(), loss[~mask].mean()
    want = (pos * 5**0.5 + neg * 15**0.5) / (5**0.5 + 15**0.5)
    own = (pos * n_pos**0.5 + neg * (24 - n_pos) ** 0.5) / (n_pos**0.5 + (24 - n_pos) ** 0.5)
    assert abs(want - own) > 1e-3  # the two conventions differ here
    assert losses["loss_ddf_dn_0"].item() == pytest.approx(want.item(), rel=1e-5)


# --- keys, weights, dtypes, gradients -----------------------------------------------------------


def test_weight_dict_covers_every_loss():
    g = torch.Generator().manual_seed(8)
    out = synthetic_outputs(g, layers=3)
    for losses in (("vfl", "boxes", "local"), ("mal", "boxes", "local"), ("focal", "boxes")):
        crit = DFineCriterion(4, losses=losses, reg_max=8, dec_layers=3)
        got = crit(out, synthetic_targets())
        assert set(got) == set(crit.weight_dict), losses
    w = build_dfine_weight_dict(dec_layers=3)
    assert (w["loss_vfl"], w["loss_bbox"], w["loss_giou"], w["loss_fgl"], w["loss_ddf_aux_0"]) == (
        1,
        5,
        2,
        0.15,
        1.5,
    )
    assert build_dfine_weight_dict(losses=("mal", "boxes", "local"))["loss_mal_enc_0"] == 1.0
    assert "loss_fgl_pre" not in w and "loss_ddf" not in w and "loss_ddf_dn_2" in w
    with pytest.raises(ValueError, match="unknown"):
        DFineCriterion(4, losses=("vfl", "ce"))


def test_bf16_inputs_give_float32_losses_and_finite_gradients():
    g = torch.Generator().manual_seed(9)
    out = synthetic_outputs(g)
    leaves = []

    def cast(x):
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dim() == 3:
            y = x.to(torch.bfloat16).requires_grad_(True)
            leaves.append(y)
            return y
        return x

    # Keep the teachers the same tensors as the students they copy (cast once, share).
    cache: dict[int, torch.Tensor] = {}

    def walk(o):
        if isinstance(o, dict):
            return {k: walk(v) for k, v in o.items()}
        if isinstance(o, list):
            return [walk(v) for v in o]
        if isinstance(o, torch.Tensor):
            if id(o) not in cache:
                cache[id(o)] = cast(o)
            return cache[id(o)]
        return o

    half = walk(out)
    for losses in (("vfl", "boxes", "local"), ("mal", "boxes", "local"), ("focal", "boxes", "local")):
        crit = DFineCriterion(4, losses=losses, reg_max=8, dec_layers=3)
        got = crit(half, synthetic_targets())
        assert all(v.dtype == torch.float32 for v in got.values())
        full = crit(out, synthetic_targets())
        for k in got:
            assert got[k].item() == pytest.approx(full[k].item(), rel=0.05, abs=0.02), k
        total = crit.total(got)
        grads = torch.autograd.grad(total, leaves, allow_unused=True)
        assert all(gr is None or torch.isfinite(gr.float()).all() for gr in grads)
        assert sum(gr is not None for gr in grads) > 10


def test_empty_targets_and_matcher_choice():
    g = torch.Generator().manual_seed(10)
    out = synthetic_outputs(g, dn_group=1)
    out.pop("dn_outputs"), out.pop("dn_pre_outputs"), out.pop("dn_meta")
    empty = [target([], []), target([], [])]
    crit = DFineCriterion(4, reg_max=8)
    got = crit(out, empty)
    assert all(torch.isfinite(v) for v in got.values())
    assert got["loss_bbox"].item() == 0.0 and got["loss_vfl"].item() > 0
    with pytest.raises(ValueError, match="focal=True"):
        DFineCriterion(4, matcher=HungarianMatcher(1.0, 5.0, 2.0))
    with pytest.raises(ValueError, match="dn_outputs"):
        crit({**out, "dn_aux_outputs": []}, synthetic_targets())


# --- a tiny D-FINE's training outputs -----------------------------------------------------------


def test_tiny_dfine_training_outputs_through_the_criterion():
    from peg_detr.models.dfine.build import build_dfine

    torch.manual_seed(0)
    model, crit, _ = build_dfine(
        "tiny", "sincos", num_classes=3, hidden_dim=32, num_heads=2, dec_layers=2, dim_feedforward=64,
        num_queries=10, num_points=[2, 2, 2], depth_mult=0.34, encoder_expansion=0.5, max_num_bins=8,
        num_denoising=6, lqe_hidden_dim=16,
    )  # fmt: skip
    # D-FINE zero-initialises the corner heads (every layer's distributions equal, DDF 0): perturb them.
    with torch.no_grad():
        for mlp in model.decoder.bbox_embed:
            mlp.layers[-1].weight.normal_(0, 0.05)
    model.train()
    targets = [
        target([0, 2], [[0.3, 0.3, 0.2, 0.2], [0.6, 0.6, 0.3, 0.4]]),
        target([1], [[0.5, 0.5, 0.4, 0.4]]),
    ]
    out = model(torch.randn(2, 3, 96, 128), targets)
    losses = crit(out, targets)
    assert set(losses) == set(crit.weight_dict)  # every output of the model is supervised and weighted
    assert losses["loss_ddf_aux_0"] > 0 and losses["loss_ddf_dn_0"] > 0 and losses["loss_ddf_dn_1"] == 0
    total = crit.total(losses)
    total.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert model.decoder.bbox_embed[0].layers[-1].weight.grad.abs().sum() > 0
