"""The video transformer (every position encoding, attention and pool), other clip sizes, and X3D."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from peg_core import sincos_2d
from peg_core.encodings import LearnedPositionEncoding3d, SinCosPositionEncoding3d
from peg_video import build_video_model
from peg_video.models import VIT_CONFIGS, DividedBlock, VideoTransformer

POS_ENCODINGS = ["peg3d", "peg3d-factorized", "learned", "sincos", "none"]
TINY = {"embed_dim": 16, "depth": 2, "num_heads": 2}


def tiny(pos_enc="peg3d", num_frames=8, img_size=32, tubelet=(2, 8, 8), **kw):
    opts = {**TINY, **kw}
    return build_video_model("vit_tiny", pos_enc, 5, num_frames, img_size, tubelet, **opts).eval()


@pytest.mark.parametrize("attention", ["joint", "divided"])
@pytest.mark.parametrize("pos_enc", POS_ENCODINGS)
def test_shapes_for_every_configuration(pos_enc, attention):
    clip = torch.randn(2, 3, 8, 32, 24)
    for pool in ("avg", "token"):
        model = tiny(pos_enc, attention=attention, global_pool=pool)
        assert isinstance(model, VideoTransformer)
        assert (model.cls_token is not None) == (pool == "token")
        assert all(isinstance(b, DividedBlock) for b in model.blocks) == (attention == "divided")
        tokens, size = model.forward_features(clip)
        assert size == (4, 4, 3)
        assert tokens.shape == (2, model.num_prefix_tokens + 4 * 4 * 3, 16)
        logits = model(clip)
        assert logits.shape == (2, 5) and torch.isfinite(logits).all()
        pooled = model.forward_head(tokens, pre_logits=True)
        expect = tokens[:, 0] if pool == "token" else tokens.mean(1)
        torch.testing.assert_close(pooled, expect)
        torch.testing.assert_close(model.head(pooled), logits)


def test_named_sizes_and_default_pool():
    for name, dim, heads in (("vit_tiny", 192, 3), ("vit_small", 384, 6), ("vit_base", 768, 12)):
        m = build_video_model(name, depth=1)
        assert m.embed_dim == dim and m.blocks[0].attn.num_heads == heads
        assert m.grid_size == (8, 14, 14) and m.global_pool == "avg" and m.head.out_features == 400
    assert {depth for _, depth, _ in VIT_CONFIGS.values()} == {12}


@pytest.mark.parametrize("pos_enc", POS_ENCODINGS)
def test_same_weights_at_other_clip_lengths_and_resolutions(pos_enc):
    """Trained for 16 frames at 224 px: runs at 8/32 frames and 288 px, as a model built for that size would."""
    model = build_video_model("vit_tiny", pos_enc, 3, 16, 224, embed_dim=8, depth=1, num_heads=2).eval()
    for frames, side in ((8, 288), (32, 224)):
        clip = torch.randn(1, 3, frames, side, side)
        out = model(clip)
        assert out.shape == (1, 3) and torch.isfinite(out).all()
        other = build_video_model("vit_tiny", pos_enc, 3, frames, side, embed_dim=8, depth=1, num_heads=2)
        state = model.state_dict()
        grid = (frames // 2, side // 16, side // 16)
        if pos_enc == "learned":
            spatial, temporal = model.pos_enc.tables(grid)
            assert spatial.shape == (1, grid[1] * grid[2], 8) and temporal.shape == (1, grid[0], 8)
            # independent reference: bicubic in space, linear in time, on the (C, ...) layout
            s_ref = F.interpolate(
                model.pos_enc.spatial.reshape(1, 14, 14, 8).permute(0, 3, 1, 2), grid[1:], mode="bicubic"
            )
            t_ref = F.interpolate(model.pos_enc.temporal.transpose(1, 2), grid[0], mode="linear")
            torch.testing.assert_close(spatial, s_ref.flatten(2).transpose(1, 2))
            torch.testing.assert_close(temporal, t_ref.transpose(1, 2))
            state = {**state, "pos_enc.spatial": spatial, "pos_enc.temporal": temporal}
        other.load_state_dict(state)  # strict: the same parameters at any size
        torch.testing.assert_close(other.eval()(clip), out, rtol=1e-5, atol=1e-6)


def test_learned_and_sincos_codes_from_the_formula():
    learned = LearnedPositionEncoding3d(8, (3, 2, 4), num_prefix_tokens=1)
    x = torch.zeros(1, 1 + 24, 8)
    pos = learned.position(x, (3, 2, 4))
    assert torch.all(pos[:, 0] == 0)
    grid = pos[0, 1:].reshape(3, 2, 4, 8)
    for t, h, w in ((0, 0, 0), (2, 1, 3), (1, 0, 2)):
        expect = learned.spatial[0, h * 4 + w] + learned.temporal[0, t]
        torch.testing.assert_close(grid[t, h, w], expect)

    dim, temp = 8, 10000.0
    pos = SinCosPositionEncoding3d(dim).position(torch.zeros(1, 2 * 3 * 5, dim), (2, 3, 5))[0]
    spatial = sincos_2d((3, 5), dim)  # peg_core's 2D table, tested there
    for t, h, w in ((0, 0, 0), (1, 2, 4), (1, 0, 3)):
        half = dim // 2  # temporal: [sin(t w_k) | cos(t w_k)], w_k = T^(-k / (C/2))
        tm = [math.sin(t / temp ** (k / half)) for k in range(half)]
        tm += [math.cos(t / temp ** (k / half)) for k in range(half)]
        expect = spatial[h * 5 + w] + torch.tensor(tm)
        torch.testing.assert_close(pos[t * 15 + h * 5 + w], expect, rtol=1e-6, atol=1e-6)


def naive_attention(x, attn, heads):
    """Multi-head self-attention of one sequence ``(N, C)`` written out: softmax(q k^T / sqrt(d)) v."""
    n, c = x.shape
    q, k, v = F.linear(x, attn.qkv.weight, attn.qkv.bias).reshape(n, 3, heads, c // heads).unbind(1)
    w = torch.einsum("nhd,mhd->hnm", q, k) / math.sqrt(c // heads)
    out = torch.einsum("hnm,mhd->nhd", w.softmax(-1), v).reshape(n, c)
    return F.linear(out, attn.proj.weight, attn.proj.bias)


def test_divided_block_matches_loop_reference():
    torch.manual_seed(1)
    blk = DividedBlock(8, 2).double().eval()
    with torch.no_grad():
        for prm in blk.parameters():
            prm.normal_(0, 0.3)
    t, h, w, p = 3, 2, 2, 1
    x = torch.randn(2, p + t * h * w, 8, dtype=torch.float64)
    ref = x.clone()
    hw = h * w
    for b in range(2):
        grid = x[b, p:].reshape(t, hw, 8)
        delta = torch.stack([naive_attention(blk.norm_t(grid[:, s]), blk.attn_t, 2) for s in range(hw)], 1)
        ref[b, p:] = (grid + delta).reshape(t * hw, 8)
        mid = ref[b].clone()
        outs = [
            naive_attention(blk.norm1(torch.cat([mid[:p], mid[p + f * hw : p + (f + 1) * hw]])), blk.attn, 2)
            for f in range(t)
        ]
        ref[b, :p] = mid[:p] + torch.stack([o[:p] for o in outs]).mean(0)
        ref[b, p:] = mid[p:] + torch.cat([o[p:] for o in outs])
        ref[b] = ref[b] + blk.mlp(blk.norm2(ref[b]))
    torch.testing.assert_close(blk(x, (t, h, w), p), ref, rtol=0, atol=1e-10)
    with pytest.raises(ValueError, match=r"needs N = 1 \+ 2x2x2 = 9"):
        blk(x, (2, 2, 2), p)


def test_fresh_divided_block_acts_per_frame():
    blk = DividedBlock(8, 2).eval()
    blk.reset_temporal()
    x = torch.randn(1, 2 * 6, 8)
    per_frame = torch.cat([super(DividedBlock, blk).forward(x[:, f * 6 : (f + 1) * 6]) for f in range(2)], 1)
    torch.testing.assert_close(blk(x, (2, 2, 3)), per_frame)


def test_peg_positions_and_order():
    assert tuple(tiny().pos_blocks) == ("0",)
    # "all": after every block, the meaning of every model of the suite (peg_core.peg.resolve_peg_at)
    assert tiny(depth=3, peg_at="all").peg_at == (0, 1, 2)
    model = tiny(depth=3, peg_at=(-1, 0, 1))
    assert model.peg_at == (-1, 0, 1) and tuple(model.pos_blocks) == ("-1", "0", "1")
    calls = []
    for name, mod in [*model.pos_blocks.items(), *((f"b{i}", b) for i, b in enumerate(model.blocks))]:
        mod.register_forward_hook(lambda m, a, o, name=name: calls.append(name))
    model(torch.randn(1, 3, 4, 16, 16))
    assert calls == ["-1", "b0", "0", "b1", "1", "b2"]  # a PEG at the input of every block
    assert tiny(pos_enc="learned").peg_at == ()
    with pytest.raises(ValueError, match=r"indices \[3\] outside -1"):
        tiny(depth=3, peg_at=(0, 3))
    with pytest.raises(ValueError, match="'all' or block indices"):
        tiny(peg_at="every")
    with pytest.raises(ValueError, match="at least one"):
        tiny(peg_at=())


@pytest.mark.parametrize("pos_enc", POS_ENCODINGS)
def test_only_none_is_blind_to_tubelet_order(pos_enc):
    """Reversing the tubelets in time leaves a position-free GAP model unchanged, and no other."""
    torch.manual_seed(3)
    model = tiny(pos_enc, depth=1).double()
    clip = torch.randn(1, 3, 8, 16, 16, dtype=torch.float64)
    reversed_tubelets = clip.reshape(1, 3, 4, 2, 16, 16).flip(2).reshape(1, 3, 8, 16, 16)
    gap = (model(clip) - model(reversed_tubelets)).abs().max().item()
    if pos_enc == "none":
        assert gap < 1e-12
    else:
        assert gap > 1e-4


def test_input_and_option_errors():
    model = tiny()
    with pytest.raises(ValueError, match=r"expected clips \(B, 3, T, H, W\)"):
        model(torch.randn(1, 1, 8, 32, 32))
    with pytest.raises(ValueError, match="T=7 is not a multiple of 2"):
        model(torch.randn(1, 3, 7, 32, 32))
    with pytest.raises(ValueError, match="W=30 is not a multiple of 8"):
        model(torch.randn(1, 3, 8, 32, 30))
    with pytest.raises(ValueError, match="unknown position encoding 'rope'"):
        tiny("rope")
    with pytest.raises(ValueError, match="the video ViT has a 3-D token grid; encoding 'peg' runs on 2-D"):
        tiny("peg")
    with pytest.raises(ValueError, match="the video ViT takes no table\\+rotary combination"):
        tiny("learned+rope-3d")
    with pytest.raises(ValueError, match="attention must be one of"):
        tiny(attention="axial")
    with pytest.raises(ValueError, match="global_pool must be one of"):
        tiny(global_pool="max")
    with pytest.raises(ValueError, match="unknown video model 'vit_huge'"):
        build_video_model("vit_huge")
    with pytest.raises(TypeError, match="build_video_model"):
        build_video_model("vit_tiny", depth=1, wrong_option=1)
    with pytest.raises(ValueError, match="multiples of the tubelet"):
        tiny(num_frames=9)


def test_drop_path_trains_stochastically_and_evaluates_deterministically():
    model = tiny(drop_path_rate=0.5, depth=2)
    clip = torch.randn(4, 3, 4, 16, 16)
    torch.testing.assert_close(model(clip), model(clip))
    model.train()
    assert not torch.allclose(model(clip), model(clip))


def test_bf16_autocast_and_weight_decay_names():
    model = tiny("learned", global_pool="token")
    clip = torch.randn(1, 3, 8, 32, 32)
    ref = model(clip)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(clip)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, rtol=0.05, atol=0.05)
    names = dict(model.named_parameters())
    assert model.no_weight_decay() <= set(names)


@torch.no_grad()
@pytest.mark.filterwarnings("ignore:.*torch.jit.script.*:FutureWarning")  # raised inside pytorchvideo
def test_x3d_baseline_returns_logits_at_any_size():
    from pytorchvideo.models.x3d import create_x3d

    model = build_video_model("x3d_xs", num_classes=7, num_frames=4, img_size=32).eval()
    clip = torch.randn(2, 3, 4, 32, 32)
    out = model(clip)
    assert out.shape == (2, 7)
    assert not torch.allclose(out.sum(1), torch.ones(2))  # logits, not softmax
    # the same network as pytorchvideo's, with the global pool equal to its fixed pool at the training size
    ref = create_x3d(input_clip_length=4, input_crop_size=32, model_num_class=7, head_activation=None).eval()
    ref.load_state_dict(model.state_dict())
    torch.testing.assert_close(out, ref(clip), rtol=1e-4, atol=1e-5)
    assert model(torch.randn(1, 3, 8, 64, 64)).shape == (1, 7)
    for name in ("x3d_s", "x3d_m"):
        pool = build_video_model(name, num_classes=3).blocks[-1].pool.pool
        assert isinstance(pool, torch.nn.AdaptiveAvgPool3d)
    with pytest.raises(ValueError, match="without a position encoding"):
        build_video_model("x3d_s", pos_enc="learned")
    with pytest.raises(ValueError, match="unknown X3D model"):
        from peg_video.models import build_x3d

        build_x3d("x3d_l")
