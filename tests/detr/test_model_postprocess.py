"""PostProcess on a hand-computed case."""

from __future__ import annotations

import math

import pytest
import torch

from peg_detr.models import PostProcess


def test_postprocess_hand_case():
    # Two classes + no-object; query 1's best logit is no-object, it still reports its best real class.
    logits = torch.tensor([[[2.0, 0.0, 0.0], [0.0, 1.0, 3.0]], [[0.0, 0.0, 0.0], [1.0, 0.0, -1.0]]])
    boxes = torch.tensor(
        [[[0.5, 0.5, 0.5, 0.5], [0.25, 0.75, 0.1, 0.2]], [[0.5, 0.5, 1.0, 1.0], [0.1, 0.1, 0.2, 0.2]]]
    )
    sizes = torch.tensor([[100, 200], [30, 40]])  # (h, w) of the original images
    res = PostProcess()({"pred_logits": logits, "pred_boxes": boxes}, sizes)
    assert len(res) == 2
    e = math.exp
    torch.testing.assert_close(res[0]["scores"], torch.tensor([e(2) / (e(2) + 2), e(1) / (1 + e(1) + e(3))]))
    assert res[0]["labels"].tolist() == [0, 1]
    torch.testing.assert_close(
        res[0]["boxes"], torch.tensor([[50.0, 25.0, 150.0, 75.0], [40.0, 65.0, 60.0, 85.0]])
    )
    torch.testing.assert_close(res[1]["scores"], torch.tensor([1 / 3, e(1) / (e(1) + 1 + e(-1))]))
    assert res[1]["labels"].tolist() == [0, 0]  # ties -> first class
    torch.testing.assert_close(res[1]["boxes"], torch.tensor([[0.0, 0.0, 40.0, 30.0], [0.0, 0.0, 8.0, 6.0]]))


def test_postprocess_checks_sizes():
    out = {"pred_logits": torch.randn(2, 3, 4), "pred_boxes": torch.rand(2, 3, 4)}
    with pytest.raises(ValueError, match=r"\(B, 2\)"):
        PostProcess()(out, torch.tensor([[10, 10]]))
