"""``peg_core.models.probe``: per-layer attention entropy and distance against a float64 reference."""

from __future__ import annotations

import math

import pytest
import torch

from peg_core.bias import ALiBiBias, LookHereBias
from peg_core.models import CPVT, Attention
from peg_core.models.probe import AttentionStats, attention_probe
from peg_video.models import VideoTransformer


@torch.no_grad()
def _reference(attn: Attention, x: torch.Tensor, bias: torch.Tensor | None, grid, prefix: int):
    """Entropy over all keys and distance to the grid keys, element by element in float64."""
    b, n, c = x.shape
    h = attn.num_heads
    qkv = (x.double() @ attn.qkv.weight.double().T + attn.qkv.bias.double()).reshape(b, n, 3, h, c // h)
    q, k = qkv[:, :, 0].transpose(1, 2), qkv[:, :, 1].transpose(1, 2)
    logits = q @ k.transpose(-2, -1) / math.sqrt(c // h)
    if bias is not None:
        logits = logits + bias.double()
    a = logits.softmax(-1)
    pos = [(i, j) for i in range(grid[0]) for j in range(grid[1])]
    ent, dist, count = 0.0, 0.0, 0
    for bi in range(b):
        for hi in range(h):
            for qi in range(prefix, n):
                row = a[bi, hi, qi]
                ent -= sum(float(p) * math.log(float(p)) for p in row if p > 0)
                pq = pos[qi - prefix]
                on = row[prefix:]
                dist += sum(float(p) * math.dist(pq, pk) for p, pk in zip(on, pos, strict=True)) / float(
                    on.sum()
                )
                count += 1
    return ent / count, dist / count


@pytest.mark.parametrize(
    ("grid", "prefix", "with_bias"), [((3, 5), 1, True), ((4, 2), 0, False), ((2, 3), 2, True)]
)
def test_stats_match_the_reference(grid, prefix, with_bias):
    torch.manual_seed(0)
    attn = Attention(16, 4).eval()
    x = torch.randn(3, prefix + math.prod(grid), 16)
    bias = ALiBiBias(4)(grid, num_prefix_tokens=prefix) if with_bias else None
    stats = AttentionStats(grid, chunk=2)  # two chunks over the batch of 3
    with attention_probe(stats), torch.no_grad():
        attn(x, attn_mask=bias)
    got = stats.summary()
    want = _reference(attn, x, bias, grid, prefix)
    assert got["entropy"] == pytest.approx([want[0]], rel=1e-5)
    assert got["distance"] == pytest.approx([want[1]], rel=1e-5)
    assert Attention.probe is None  # cleared on exit


def test_lookhere_masks_lower_entropy_and_distance_and_bool_masks_work():
    torch.manual_seed(0)
    attn = Attention(16, 4).eval()
    x = torch.randn(2, 20, 16)
    plain, masked, boolean = AttentionStats((4, 5)), AttentionStats((4, 5)), AttentionStats((4, 5))
    bias = LookHereBias(4)((4, 5))
    with torch.no_grad():
        for stats, mask in ((plain, None), (masked, bias), (boolean, bias > -1e30)):
            with attention_probe(stats):
                attn(x, attn_mask=mask)
    assert masked.summary()["entropy"][0] < plain.summary()["entropy"][0]
    assert masked.summary()["distance"][0] < plain.summary()["distance"][0]
    # a bool mask (True = attend) with the same visibility: the penalties are gone, entropy in between
    assert masked.summary()["entropy"][0] < boolean.summary()["entropy"][0] < plain.summary()["entropy"][0]


def test_layers_in_call_order_unknown_grids_skipped_and_one_probe_at_a_time():
    torch.manual_seed(0)
    model = CPVT(embed_dim=32, depth=3, num_heads=4, num_classes=3, img_size=32, patch_size=8,
                 global_pool="token").eval()  # fmt: skip
    stats = AttentionStats((3, 5), num_prefix_tokens=1)
    with attention_probe(stats), torch.no_grad():
        model(torch.randn(2, 3, 24, 40))
        model(torch.randn(2, 3, 24, 40))  # a second forward adds to the same three layers
        model(torch.randn(1, 3, 32, 32))  # a 4x4 grid this probe does not know: skipped
    s = stats.summary()
    assert len(s["entropy"]) == 3 and stats.skipped == 3
    # uniform attention over 16 keys would be log 16; a random model is close to it and below
    assert all(0 < e <= math.log(16) + 1e-6 for e in s["entropy"])
    outer, inner = AttentionStats((2, 2)), AttentionStats((2, 2))
    with attention_probe(outer), pytest.raises(RuntimeError, match="already active"), attention_probe(inner):
        pass
    assert Attention.probe is None


def test_divided_video_attention_reports_space_and_time():
    torch.manual_seed(0)
    model = VideoTransformer(embed_dim=32, depth=2, num_heads=4, num_classes=3, num_frames=4, img_size=32,
                             tubelet=(2, 8, 8), attention="divided", global_pool="token").eval()  # fmt: skip
    grid = (2, 4, 4)
    stats = AttentionStats(grid, also=(grid[1:], grid[:1]))
    with attention_probe(stats), torch.no_grad():
        model(torch.randn(1, 3, 4, 32, 32))
    s = stats.summary()
    assert len(s["entropy"]) == 4 and stats.skipped == 0  # (space, time) x 2 blocks
