"""ResNet-vd's average-pool shortcut: ``ceil_mode``'s values without its symbolic-shape guard.

:class:`CeilAvgPool2x2` must equal ``nn.AvgPool2d(2, 2, 0, ceil_mode=True)`` bit for bit on even
and odd sides, and the backbone must go through ``torch.export`` with a dynamic height and width
over the whole range the ONNX export declares (``ceil_mode`` made it refuse every side that is
not a multiple of 32).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from peg_detr.models.rtdetr.backbone import CeilAvgPool2x2, build_resnet_vd


@pytest.mark.parametrize("size", [(8, 8), (7, 7), (6, 9), (9, 4), (1, 1), (1, 2), (33, 17)])
def test_pool_equals_ceil_mode_avg_pool(size):
    x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(sum(size))) * 10
    want = nn.AvgPool2d(2, 2, 0, ceil_mode=True)(x)
    got = CeilAvgPool2x2.guard_free(x)  # what an export traces
    assert got.shape == (2, 3, -(-size[0] // 2), -(-size[1] // 2))
    assert torch.equal(got, want)
    assert torch.equal(CeilAvgPool2x2.guard_free(x.to(memory_format=torch.channels_last)), want)
    assert torch.equal(CeilAvgPool2x2()(x), want)  # eager: the native kernel


def test_pool_by_hand_on_an_odd_side():
    x = torch.arange(9.0).view(1, 1, 3, 3)  # rows [0 1 2] [3 4 5] [6 7 8]
    want = torch.tensor([[[[(0 + 1 + 3 + 4) / 4, (2 + 5) / 2], [(6 + 7) / 2, 8.0]]]])
    assert torch.equal(CeilAvgPool2x2()(x), want) and torch.equal(CeilAvgPool2x2.guard_free(x), want)


def test_backbone_exports_with_dynamic_height_and_width_and_runs_at_odd_sizes():
    torch.manual_seed(0)
    model = build_resnet_vd("tiny").eval()
    dim = torch.export.Dim
    dynamic = ({0: dim("batch", min=1, max=1024), 2: dim("height", min=64, max=8192),
                3: dim("width", min=64, max=8192)},)  # fmt: skip
    # raises "Constraints violated (height, width)" with nn.AvgPool2d(ceil_mode=True)
    program = torch.export.export(model, (torch.randn(2, 3, 96, 128),), dynamic_shapes=dynamic, strict=False)
    for h, w in ((77, 203), (64, 100), (129, 65)):
        x = torch.randn(1, 3, h, w, generator=torch.Generator().manual_seed(h))
        with torch.no_grad():
            want, got = model(x), program.module()(x)
        assert [t.shape[-2:] for t in got] == [(-(-h // s), -(-w // s)) for s in (8, 16, 32)]
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
