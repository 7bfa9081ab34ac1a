"""The multi-view evaluator against hand-computed numbers."""

import math

import pytest
import torch

from peg_video.evaluation import KineticsEvaluator

# 3 videos, 4 classes.  Views as probabilities (logits = log p so softmax gives them back).
P = torch.tensor(
    [
        [0.6, 0.3, 0.05, 0.05],  # video 0, view 0 (label 0)
        [0.1, 0.7, 0.1, 0.1],  # video 0, view 1
        [0.1, 0.1, 0.7, 0.1],  # video 1, view 0 (label 2)
        [0.2, 0.5, 0.2, 0.1],  # video 2, view 0 (label 3)
        [0.1, 0.1, 0.1, 0.7],  # video 2, view 1
    ]
)
LABELS = torch.tensor([0, 0, 2, 3, 3])
VIDEOS = torch.tensor([0, 0, 1, 2, 2])
VIEWS = torch.tensor([0, 1, 0, 0, 1])


def _evaluator(reduction="mean", topk=(1, 2)):
    ev = KineticsEvaluator(4, reduction=reduction, topk=topk)
    ev.update(P.log(), LABELS, VIDEOS, VIEWS)
    return ev


def test_hand_computed_mean_of_softmax():
    # fused: v0 [.35 .5 .075 .075] -> 1 (wrong, 0 is 2nd); v1 -> 2 (right);
    # v2 [.15 .3 .15 .4] -> 3 (right).  Clip level: views 0, 2, 4 right of 5.
    r = _evaluator().summarize()
    assert r["top1"] == pytest.approx(2 / 3)
    assert r["top2"] == pytest.approx(1.0)
    assert r["mean_class_accuracy"] == pytest.approx((0 + 1 + 1) / 3)
    assert r["clip_top1"] == pytest.approx(3 / 5)
    assert (r["num_videos"], r["num_views"]) == (3, 5)


def test_reductions():
    # max: v0 [.6 .7 .1 .1] -> 1 wrong; v2 [.2 .5 .2 .7] -> 3 right
    assert _evaluator("max").summarize()["top1"] == pytest.approx(2 / 3)
    assert _evaluator("sum").summarize()["top1"] == pytest.approx(2 / 3)
    # raw logits: v0 mean log p = [(log .6 + log .1)/2, (log .3 + log .7)/2, ...] = [-1.41, -0.78, ...] -> 1
    assert _evaluator("logits").summarize()["top1"] == pytest.approx(2 / 3)
    # a case where mean-of-softmax and max disagree: one confident wrong view against two mild right ones
    ev_mean, ev_max = KineticsEvaluator(2, "mean", (1,)), KineticsEvaluator(2, "max", (1,))
    p = torch.tensor([[0.05, 0.95], [0.6, 0.4], [0.6, 0.4]])  # mean [.417 .583] -> 1; max [.6 .95] -> 1
    q = torch.tensor([[0.3, 0.7], [0.9, 0.1], [0.9, 0.1]])  # mean [.7 .3] -> 0;  max [.9 .7] -> 0
    for ev in (ev_mean, ev_max):
        ev.update(
            torch.cat([p, q]).log(),
            torch.zeros(6, dtype=torch.long),
            torch.tensor([0, 0, 0, 1, 1, 1]),
            torch.tensor([0, 1, 2] * 2),
        )
    assert ev_mean.summarize()["top1"] == pytest.approx(0.5)
    assert ev_max.summarize()["top1"] == pytest.approx(0.5)
    ev_sum = KineticsEvaluator(2, "sum", (1,))
    ev_sum.update(
        torch.tensor([[0.2, 0.8], [0.7, 0.3], [0.7, 0.3]]).log(),
        torch.zeros(3, dtype=torch.long),
        torch.zeros(3, dtype=torch.long),
        torch.arange(3),
    )
    assert ev_sum.summarize()["top1"] == pytest.approx(1.0)  # [1.6 1.4] -> 0


def test_duplicates_from_padding_count_once():
    ev = _evaluator()
    ev.update(P[:2].log(), LABELS[:2], VIDEOS[:2], VIEWS[:2])  # padded repeat of video 0
    r = ev.summarize()
    assert (r["num_videos"], r["num_views"]) == (3, 5)
    assert r["top1"] == pytest.approx(2 / 3)


def test_empty_and_bad_shapes():
    r = KineticsEvaluator(4).summarize()
    assert r["num_videos"] == 0 and math.isnan(r["top1"])
    ev = KineticsEvaluator(4)
    with pytest.raises(ValueError, match=r"logits must be \(N, 4\)"):
        ev.update(torch.zeros(2, 3), torch.zeros(2), torch.zeros(2), torch.zeros(2))
    with pytest.raises(ValueError, match=r"view_index must have shape \(2,\)"):
        ev.update(torch.zeros(2, 4), torch.zeros(2), torch.zeros(2), torch.zeros(3))
    with pytest.raises(ValueError, match="reduction"):
        KineticsEvaluator(4, reduction="median")
