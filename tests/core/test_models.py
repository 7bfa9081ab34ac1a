"""CPVT classifier: sizes, padding, PEG placement, pooling, learned-table resizing, DeiT/torchvision loading."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from peg_core import resize_pos_embed
from peg_core.interop import load_timm_deit
from peg_core.models import CPVT, cpvt_base, cpvt_small, cpvt_tiny
from peg_core.models.layers import Attention, drop_path


def small(**kw) -> CPVT:
    cfg = {"embed_dim": 32, "depth": 3, "num_heads": 2, "patch_size": 8, "img_size": 32, "num_classes": 5}
    return CPVT(**{**cfg, **kw}).eval()


def timm_keys(depth: int) -> set[str]:
    """The key set of a timm ``VisionTransformer`` / DeiT with a class token and learned ``pos_embed``."""
    keys = {"cls_token", "pos_embed", "patch_embed.proj.weight", "patch_embed.proj.bias"}
    keys |= {"norm.weight", "norm.bias", "head.weight", "head.bias"}
    for i in range(depth):
        for sub in ("norm1", "attn.qkv", "attn.proj", "norm2", "mlp.fc1", "mlp.fc2"):
            keys |= {f"blocks.{i}.{sub}.weight", f"blocks.{i}.{sub}.bias"}
    return keys


def deit_state_dict(model: CPVT) -> dict[str, torch.Tensor]:
    """A learned-table, class-token CPVT's weights under timm DeiT names."""
    sd = model.state_dict()
    sd["pos_embed"] = sd.pop("pos_enc.pos_embed")
    return sd


@torch.no_grad()
def test_cpvt_tiny_same_weights_at_three_sizes():
    model = cpvt_tiny(num_classes=10).eval()
    for (h, w), grid in (((224, 224), (14, 14)), ((384, 384), (24, 24)), ((224, 320), (14, 20))):
        x = torch.randn(1, 3, h, w)
        tokens, size = model.forward_features(x)
        assert size == grid and tokens.shape == (1, grid[0] * grid[1], 192)
        logits = model.forward_head(tokens)
        assert logits.shape == (1, 10) and torch.isfinite(logits).all()
        # GAP head: the head applied to the mean of the grid tokens.
        torch.testing.assert_close(logits, model.head(tokens.mean(1)))
    torch.testing.assert_close(model(x), logits)


def test_configs():
    with torch.device("meta"):  # shapes only, no memory or init time
        for fn, dim, heads, params in ((cpvt_tiny, 192, 3, 5.7e6), (cpvt_small, 384, 6, 22.1e6),
                                       (cpvt_base, 768, 12, 86.6e6)):  # fmt: skip
            m = fn()
            assert m.embed_dim == dim and m.blocks[0].attn.num_heads == heads and m.patch_size == 16
            assert len(m.blocks) == 12 and m.head.out_features == 1000 and list(m.pos_blocks) == ["0"]
            # DeiT-Ti / S / B sizes (5.7M / 22.1M / 86.6M) with the table swapped for one PEG.
            assert sum(p.numel() for p in m.parameters()) == pytest.approx(params, rel=0.03)


@torch.no_grad()
def test_pads_to_multiple_of_patch():
    model = small()
    x = torch.randn(2, 3, 29, 35)
    assert model.forward_features(x)[1] == (4, 5)
    padded = F.pad(x, (0, 5, 0, 3))  # 32 x 40: zeros at the bottom and right
    torch.testing.assert_close(model(x), model(padded), rtol=0, atol=0)


def _call_order(model: CPVT, x: torch.Tensor) -> list[str]:
    order: list[str] = []
    for name, mod in list(model.blocks.named_children()) + list(model.pos_blocks.named_children()):
        prefix = "blocks" if mod in list(model.blocks) else "peg"
        mod.register_forward_hook(lambda *_, n=f"{prefix}{name}": order.append(n))
    model(x)
    return order


def test_peg_at_placement():
    x = torch.randn(1, 3, 32, 32)
    assert _call_order(small(), x) == ["blocks0", "peg0", "blocks1", "blocks2"]
    m = small(depth=6, peg_at=(0, 1, 2, 3, 4, 5))
    assert sorted(m.pos_blocks) == [str(i) for i in range(6)]
    assert _call_order(m, x) == [n for i in range(6) for n in (f"blocks{i}", f"peg{i}")]
    assert "pos_blocks.5.proj.weight" in m.state_dict()
    with pytest.raises(
        ValueError, match=r"peg_at=\[0, 3\] has indices \[3\] outside -1 \(before block 0\) \.\. 2"
    ):
        small(peg_at=(0, 3))


@torch.no_grad()
def test_token_vs_avg_pool():
    tok = small(global_pool="token")
    assert tok.num_prefix_tokens == 1 and tok.pos_blocks["0"].num_prefix_tokens == 1
    x = torch.randn(2, 3, 32, 48)
    tokens, size = tok.forward_features(x)
    assert size == (4, 6) and tokens.shape == (2, 1 + 24, 32)
    torch.testing.assert_close(tok(x), tok.head(tokens[:, 0]))
    avg = small(global_pool="avg")
    assert avg.cls_token is None and "cls_token" not in avg.state_dict()
    assert avg.forward_features(x)[0].shape == (2, 24, 32)
    with pytest.raises(ValueError, match="global_pool must be one of"):
        small(global_pool="max")
    with pytest.raises(ValueError, match="pos_enc="):
        small(pos_enc="rope")
    with pytest.raises(ValueError, match=r"expected images \(B, C, H, W\)"):
        avg(torch.randn(3, 32, 32))


def _shuffle_patches(x: torch.Tensor, patch: int, perm: torch.Tensor) -> torch.Tensor:
    b, c, h, w = x.shape
    gh, gw = h // patch, w // patch
    tiles = (
        x.reshape(b, c, gh, patch, gw, patch).permute(0, 2, 4, 1, 3, 5).reshape(b, gh * gw, c, patch, patch)
    )
    tiles = tiles[:, perm].reshape(b, gh, gw, c, patch, patch).permute(0, 3, 1, 4, 2, 5)
    return tiles.reshape(b, c, h, w)


@torch.no_grad()
def test_only_position_encodings_break_patch_shuffle_invariance():
    x = torch.randn(2, 3, 32, 40)
    perm = torch.randperm(20)
    shuffled = _shuffle_patches(x, 8, perm)
    none = small(pos_enc="none")
    torch.testing.assert_close(none(x), none(shuffled), atol=1e-6, rtol=1e-6)
    for kind in ("peg", "learned", "sincos"):
        m = small(pos_enc=kind)
        assert (m(x) - m(shuffled)).abs().max() > 1e-4, kind


@torch.no_grad()
def test_learned_table_resizes_with_mode():
    model = small(pos_enc="learned", global_pool="token", pos_interpolation="bicubic")
    assert model.pos_enc.pos_embed.shape == (1, 1 + 16, 32)
    x = torch.randn(1, 3, 48, 40)  # grid 6x5, table built for 4x4
    for mode in ("bicubic", "nearest"):
        model.pos_interpolation = mode
        ref = small(pos_enc="learned", global_pool="token", img_size=(48, 40))
        sd = model.state_dict()
        sd["pos_enc.pos_embed"] = resize_pos_embed(sd["pos_enc.pos_embed"], (6, 5), (4, 4), 1, mode=mode)
        ref.load_state_dict(sd)
        torch.testing.assert_close(model(x), ref(x), rtol=1e-5, atol=1e-5)
    model.pos_interpolation = "bicubic"
    bicubic = model(x)
    model.pos_interpolation = "nearest"
    assert (model(x) - bicubic).abs().max() > 1e-4


def test_attention_matches_float64_formula():
    attn = Attention(16, 4).double()
    x = torch.randn(2, 7, 16, dtype=torch.float64, requires_grad=True)
    q, k, v = attn.qkv(x).reshape(2, 7, 3, 4, 4).permute(2, 0, 3, 1, 4)
    w = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(4), dim=-1)
    ref = attn.proj((w @ v).transpose(1, 2).reshape(2, 7, 16))
    out = attn(x)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    out.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_drop_path_keeps_expectation():
    x = torch.ones(20000, 3)
    y = drop_path(x, 0.25, training=True)
    assert y.unique().tolist() == pytest.approx([0.0, 1 / 0.75])
    assert (y[:, 0:1] == y).all()  # whole samples are dropped
    assert y.mean().item() == pytest.approx(1.0, abs=0.03)
    assert drop_path(x, 0.25, training=False) is x


def test_timm_deit_layout_loads():
    src = small(pos_enc="learned", global_pool="token")
    sd = deit_state_dict(src)
    assert set(sd) == timm_keys(3)
    x = torch.randn(2, 3, 32, 32)

    # Same config: identical outputs.
    dst = small(pos_enc="learned", global_pool="token")
    report = load_timm_deit(dst, {"model": {"module." + k: v for k, v in sd.items()}})
    assert not report.skipped and not report.missing and "pos_enc.pos_embed" in report.copied
    torch.testing.assert_close(dst(x), src(x))

    # Larger grid: the table is resized (bilinear here).
    big = small(pos_enc="learned", global_pool="token", img_size=48)
    load_timm_deit(big, sd, mode="bilinear")
    torch.testing.assert_close(
        big.pos_enc.pos_embed, resize_pos_embed(sd["pos_embed"], (6, 6), (4, 4), 1, mode="bilinear")
    )

    # PEG model: the table is dropped, the PEG starts at zero, so it is the source without its table.
    peg = small(pos_enc="peg", global_pool="token", num_classes=7)
    report = load_timm_deit(peg, sd)
    assert list(report.skipped)[:1] == ["pos_embed"] and report.missing == ["head.weight", "head.bias"]
    assert list(report.converted) == ["pos_blocks.0.proj.weight", "pos_blocks.0.proj.bias"]
    assert report.skipped["head.weight"].startswith("shape (5, 32)")
    src.pos_enc.pos_embed.data.zero_()
    src.head = peg.head
    torch.testing.assert_close(peg(x), src(x))


def test_distilled_deit_into_gap_model():
    src = small(pos_enc="learned", global_pool="token")
    sd = deit_state_dict(src)
    cls_row, grid = sd["pos_embed"][:, :1], sd["pos_embed"][:, 1:]
    sd["pos_embed"] = torch.cat([cls_row, torch.randn(1, 1, 32), grid], dim=1)  # (1, 2 + 16, C)
    sd["dist_token"] = torch.randn(1, 1, 32)
    sd["head_dist.weight"], sd["head_dist.bias"] = torch.randn(5, 32), torch.randn(5)
    gap = small(pos_enc="learned", global_pool="avg")
    report = load_timm_deit(gap, sd)
    assert sorted(report.skipped) == ["cls_token", "dist_token", "head_dist.bias", "head_dist.weight"]
    torch.testing.assert_close(gap.pos_enc.pos_embed, grid)  # both prefix rows gone, grid kept
    with pytest.raises(ValueError, match="has no class-token entry"):
        load_timm_deit(small(pos_enc="learned", global_pool="token"), {"pos_embed": grid, **gap.state_dict()})


@torch.no_grad()
def test_torchvision_vit_loads_with_equal_outputs():
    from torchvision.models import VisionTransformer

    tv = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64,
                           num_classes=5).eval()  # fmt: skip
    for p in tv.parameters():  # torchvision zero-inits the head and biases; make every weight count
        p.normal_(0, 0.2)
    ours = small(depth=2, pos_enc="learned", global_pool="token", mlp_ratio=2.0)
    report = load_timm_deit(ours, tv.state_dict())
    assert not report.skipped and not report.converted and report.copied
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(ours(x), tv(x), rtol=1e-4, atol=1e-5)
