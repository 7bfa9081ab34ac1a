"""``tools.study_cost``: FlopCounterMode's depthwise-conv count, a CPVT's encoding share, the printed table."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from peg_core import PEG2d, PegOptions
from peg_core.models import CPVT
from tools.study_cost import cpvt_encoding_cost, main


def flops(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


@pytest.mark.parametrize(("c", "k", "h", "w"), [(192, 3, 14, 14), (7, 5, 9, 4), (16, 1, 3, 5)])
def test_flop_counter_counts_depthwise_groups(c: int, k: int, h: int, w: int) -> None:
    """A depthwise conv is 2·k²·C·H·W FLOPs (not 2·k²·C²·H·W): FlopCounterMode divides by the groups."""
    x, weight = torch.randn(1, c, h, w), torch.randn(c, 1, k, k)
    assert flops(lambda: F.conv2d(x, weight, padding=k // 2, groups=c)) == 2 * k * k * c * h * w


def test_dynamic_peg_flops() -> None:
    """Grouped conv over (1, B*C, H, W) + router Linear(C, K) + the kernel mix (B, K) @ (K, C·k² | C)."""
    b, c, k, kk, h, w = 3, 8, 3, 4, 5, 7
    peg = PEG2d(c, k, dynamic=True, num_kernels=kk)
    x = torch.randn(b, h * w, c)
    with torch.no_grad():
        got = flops(lambda: peg(x, (h, w)))
    assert got == 2 * k * k * b * c * h * w + 2 * b * c * kk + 2 * b * kk * (c * k * k + c)


def test_cpvt_share_from_the_model() -> None:
    with torch.device("meta"):
        model = CPVT(32, 2, 2, patch_size=8, num_classes=5, peg_at=(-1, 1)).eval()
    cost = cpvt_encoding_cost(model, (40, 56))  # 5x7 grid
    assert cost["params"] == 2 * (32 * 9 + 32)
    assert cost["model_params"] == sum(p.numel() for p in model.parameters())
    assert cost["flops"] == 2 * (2 * 9 * 32 * 5 * 7)
    assert cost["flops"] < cost["model_flops"] and cost["flops_share"] == cost["flops"] / cost["model_flops"]

    with torch.device("meta"):
        learned = CPVT(32, 2, 2, patch_size=8, num_classes=5, pos_enc="learned", img_size=32).eval()
    cost = cpvt_encoding_cost(learned, 48)  # the 4x4 table, resized to 6x6: the resize is not a FLOP here
    assert cost["params"] == 16 * 32 and cost["flops"] == 0
    # real tensors: the same encoding figures; the model total may lack the attention products, which
    # FlopCounterMode does not see in CPU's fused SDPA kernel (on meta SDPA runs as counted matmuls)
    real = CPVT(32, 2, 2, patch_size=8, num_classes=5, peg=PegOptions(dynamic=True)).eval()
    with torch.device("meta"):
        meta = CPVT(32, 2, 2, patch_size=8, num_classes=5, peg=PegOptions(dynamic=True)).eval()
    on_cpu, on_meta = cpvt_encoding_cost(real, 24), cpvt_encoding_cost(meta, 24)
    for key in ("params", "model_params", "flops"):
        assert on_cpu[key] == on_meta[key], key
    attention = 2 * (2 * 2 * 9 * 9 * 32)  # 2 blocks x (QK^T + AV), 9 tokens, width 32
    assert on_meta["model_flops"] - on_cpu["model_flops"] in (0, attention)


def test_main_prints_table_and_claim_check(capsys) -> None:
    text = main(["--archs", "cpvt_tiny", "--encodings", "peg,learned", "--sizes", "224"])
    assert text == capsys.readouterr().out.strip()
    assert "| cpvt_tiny | peg | 1,920 | 0.034 | 0.677 | 0.027 |" in text  # 1,728 + 192; 2·9·192·196
    assert "| cpvt_tiny | learned | 37,632 | 0.658 | 0.000 | 0.000 |" in text  # 196 x 192 table
    assert "~960" in text and "the 1,920 formula holds" in text and "< 1%: yes" in text
    with pytest.raises(SystemExit) as e:
        main(["--archs", "cpvt_huge"])
    assert e.value.code == 2
