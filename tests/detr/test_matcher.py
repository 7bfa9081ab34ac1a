"""Hungarian matcher against brute force over all assignments."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from peg_detr.models import HungarianMatcher


def giou_py(a, b):
    """GIoU of two cxcywh boxes in plain Python floats (independent of torchvision)."""
    ax0, ay0, ax1, ay1 = a[0] - a[2] / 2, a[1] - a[3] / 2, a[0] + a[2] / 2, a[1] + a[3] / 2
    bx0, by0, bx1, by1 = b[0] - b[2] / 2, b[1] - b[3] / 2, b[0] + b[2] / 2, b[1] + b[3] / 2
    inter = max(0.0, min(ax1, bx1) - max(ax0, bx0)) * max(0.0, min(ay1, by1) - max(ay0, by0))
    union = a[2] * a[3] + b[2] * b[3] - inter
    hull = (max(ax1, bx1) - min(ax0, bx0)) * (max(ay1, by1) - min(ay0, by0))
    return inter / union - (hull - union) / hull


def cost_py(logits, boxes, labels, tgt, wc=1.0, wb=5.0, wg=2.0):
    """Cost matrix (as nested lists) from the definition: -wc p[label] + wb L1 - wg GIoU."""
    prob = torch.softmax(logits.double(), -1).tolist()
    boxes, tgt = boxes.tolist(), tgt.tolist()
    return [
        [
            -wc * prob[i][labels[j]]
            + wb * sum(abs(x - y) for x, y in zip(boxes[i], tgt[j]))
            - wg * giou_py(boxes[i], tgt[j])
            for j in range(len(tgt))
        ]
        for i in range(len(boxes))
    ]


def brute_force(cost):
    """Minimum total cost over all injective maps targets -> queries."""
    q, m = len(cost), len(cost[0]) if cost else 0
    best = math.inf
    for perm in itertools.permutations(range(q), m):
        best = min(best, sum(cost[perm[j]][j] for j in range(m)))
    return best


def random_boxes(n, gen):
    cxcy = torch.rand(n, 2, generator=gen) * 0.6 + 0.2
    wh = torch.rand(n, 2, generator=gen) * 0.3 + 0.05
    return torch.cat([cxcy, wh], 1)


@pytest.mark.parametrize("seed", range(6))
def test_matches_brute_force(seed):
    gen = torch.Generator().manual_seed(seed)
    num_queries, num_classes = 5, 4
    sizes = [3, 0, 5, 1]  # fewer targets than queries, none at all, as many as queries
    logits = torch.randn(len(sizes), num_queries, num_classes + 1, generator=gen)
    boxes = random_boxes(len(sizes) * num_queries, gen).view(len(sizes), num_queries, 4)
    targets = [
        {"labels": torch.randint(0, num_classes, (m,), generator=gen), "boxes": random_boxes(m, gen)}
        for m in sizes
    ]
    matcher = HungarianMatcher(1.0, 5.0, 2.0)
    indices = matcher({"pred_logits": logits, "pred_boxes": boxes}, targets)
    for b, ((qi, ti), t) in enumerate(zip(indices, targets)):
        m = len(t["labels"])
        assert qi.dtype == ti.dtype == torch.int64
        assert len(qi) == len(ti) == m
        assert sorted(ti.tolist()) == list(range(m))
        assert len(set(qi.tolist())) == m
        if m == 0:
            continue
        cost = cost_py(logits[b], boxes[b], t["labels"].tolist(), t["boxes"])
        got = sum(cost[i][j] for i, j in zip(qi.tolist(), ti.tolist()))
        assert got == pytest.approx(brute_force(cost), abs=1e-5)


def test_all_images_empty():
    matcher = HungarianMatcher()
    out = {"pred_logits": torch.randn(2, 3, 5), "pred_boxes": torch.rand(2, 3, 4)}
    targets = [{"labels": torch.zeros(0, dtype=torch.int64), "boxes": torch.zeros(0, 4)} for _ in range(2)]
    assert all(len(q) == 0 and len(t) == 0 for q, t in matcher(out, targets))


def test_obvious_assignment_and_errors():
    """Each target sits exactly on one query with a confident class: the matcher pairs them."""
    boxes = torch.tensor([[[0.2, 0.2, 0.1, 0.1], [0.7, 0.7, 0.2, 0.2], [0.5, 0.3, 0.3, 0.1]]])
    logits = torch.full((1, 3, 3), -5.0)
    logits[0, 0, 1] = logits[0, 1, 0] = logits[0, 2, 2] = 5.0
    targets = [{"labels": torch.tensor([0, 1]), "boxes": boxes[0, [1, 0]]}]
    ((qi, ti),) = HungarianMatcher()({"pred_logits": logits, "pred_boxes": boxes}, targets)
    assert dict(zip(ti.tolist(), qi.tolist())) == {0: 1, 1: 0}
    with pytest.raises(ValueError, match="all matching costs are 0"):
        HungarianMatcher(0, 0, 0)
    with pytest.raises(ValueError, match="targets for a batch"):
        HungarianMatcher()({"pred_logits": logits, "pred_boxes": boxes}, targets * 2)
    bad = boxes.clone()
    bad[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        HungarianMatcher()({"pred_logits": logits, "pred_boxes": bad}, targets)
