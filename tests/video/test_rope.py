"""The video transformer with 3-D RoPE (``rope-3d``, ``peg3d+rope-3d``): sizes, order, divided attention, CLI."""

from __future__ import annotations

import json

import pytest
import torch

from peg_core.registry import parse_pos_enc
from peg_video import build_video_model
from peg_video.models.vit import VIDEO_ENCODINGS
from tests.video.runs import TINY, synthetic_set

SMALL = {"embed_dim": 24, "depth": 2, "num_heads": 2}  # head_dim 12: two rotary pairs per axis


def tiny(pos_enc="rope-3d", num_frames=8, img_size=32, **kw):
    torch.manual_seed(0)
    model = build_video_model("vit_tiny", pos_enc, 5, num_frames, img_size, (2, 8, 8), **{**SMALL, **kw})
    return model.eval()


def test_choices_and_keys():
    assert "rope-3d" in VIDEO_ENCODINGS.names()
    both_spec = parse_pos_enc("peg3d+rope-3d", VIDEO_ENCODINGS)
    assert (both_spec.conditional.name, both_spec.rotary.name) == ("peg3d", "rope-3d")
    none, rope, both = tiny("none"), tiny("rope-3d"), tiny("peg3d+rope-3d")
    assert set(rope.state_dict()) == set(none.state_dict())  # fixed frequencies: no key
    assert set(both.state_dict()) - set(none.state_dict()) == {
        "pos_blocks.0.proj.weight",
        "pos_blocks.0.proj.bias",
    }
    assert rope.rope.ndim == 3 and rope.rope.head_dim == 12 and both.peg_at == (0,)


@pytest.mark.parametrize("attention", ["joint", "divided"])
@pytest.mark.parametrize("pool", ["avg", "token"])
def test_shapes_at_other_clip_lengths_and_sizes(attention, pool):
    """Built for 8 frames at 32 px; runs at T = 8 / 16 frames and 32 / 48 px (the table follows the grid)."""
    for pos_enc in ("rope-3d", "peg3d+rope-3d"):
        model = tiny(pos_enc, attention=attention, global_pool=pool)
        for frames in (8, 16):
            for side in (32, 48):
                tokens, size = model.forward_features(torch.randn(2, 3, frames, side, side))
                assert size == (frames // 2, side // 8, side // 8)
                assert tokens.shape == (2, model.num_prefix_tokens + size[0] * size[1] * size[2], 24)
                assert torch.isfinite(tokens).all()


@pytest.mark.parametrize("attention", ["joint", "divided"])
def test_peg3d_with_zero_peg_equals_rope3d(attention):
    rope, both = tiny("rope-3d", attention=attention), tiny("peg3d+rope-3d", attention=attention)
    with torch.no_grad():
        for peg in both.pos_blocks.values():
            peg.proj.weight.zero_()
            peg.proj.bias.zero_()
    both.load_state_dict(rope.state_dict(), strict=False)
    clip = torch.randn(2, 3, 8, 32, 40)
    with torch.no_grad():
        torch.testing.assert_close(both(clip), rope(clip), rtol=0, atol=0)


def _permuted_tubelets(clip: torch.Tensor, perm: torch.Tensor, tubelet=(2, 8, 8)) -> torch.Tensor:
    """The clip with its tubelets moved to other grid cells (``perm`` over the T'*H'*W' cells, row-major)."""
    b, c, t, h, w = clip.shape
    kt, kh, kw = tubelet
    g = (t // kt, h // kh, w // kw)
    cells = (
        clip.reshape(b, c, g[0], kt, g[1], kh, g[2], kw)
        .permute(0, 2, 4, 6, 1, 3, 5, 7)
        .reshape(b, -1, c, kt, kh, kw)
    )
    cells = cells[:, perm].reshape(b, *g, c, kt, kh, kw).permute(0, 4, 1, 5, 2, 6, 3, 7)
    return cells.reshape(b, c, t, h, w)


@pytest.mark.parametrize("attention", ["joint", "divided"])
def test_outputs_depend_on_token_order(attention):
    """Permuting the tubelets leaves `none` (average pool) unchanged and changes `rope-3d`."""
    clip = torch.randn(2, 3, 8, 32, 32)
    n = 4 * 4 * 4
    if attention == "joint":
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    else:  # divided attention is not permutation-invariant across frames: permute within each frame
        perm = torch.cat(
            [f * 16 + torch.randperm(16, generator=torch.Generator().manual_seed(f)) for f in range(4)]
        )
    moved = _permuted_tubelets(clip, perm)
    assert not torch.equal(moved, clip)
    with torch.no_grad():
        none, rope = tiny("none", attention=attention), tiny("rope-3d", attention=attention)
        for name, w in none.named_parameters():  # sharp attention (at init q . k is ~0: uniform weights)
            if "qkv.weight" in name:
                w.normal_(0, 0.5)
        rope.load_state_dict(none.state_dict())
        torch.testing.assert_close(none(moved), none(clip), atol=1e-5, rtol=0)
        assert (rope(moved) - rope(clip)).abs().max() > 1e-3


def test_divided_attention_rotates_time_and_space_separately():
    """The temporal attention gets the t-only table, the spatial one the (h, w) table with the class token unrotated."""
    model = tiny("rope-3d", attention="divided", global_pool="token")
    rope_t, rope_s = model._rope_tables((4, 3, 5))
    full_sin, full_cos = model.rope((4, 3, 5))  # (T*H*W, D) row-major
    grid_sin, grid_cos = full_sin.reshape(4, 3, 5, -1), full_cos.reshape(4, 3, 5, -1)
    torch.testing.assert_close(rope_t[0], grid_sin[:, 0, 0])
    torch.testing.assert_close(rope_t[1], grid_cos[:, 0, 0])
    assert rope_s[0].shape == (1 + 15, 12)
    torch.testing.assert_close(rope_s[0][1:], grid_sin[0].reshape(15, -1))
    assert rope_s[0][0].abs().max() == 0 and (rope_s[1][0] == 1).all()  # class token: identity


@pytest.mark.slow
@pytest.mark.parametrize("pos_enc", ["rope-3d", "peg3d+rope-3d"])
def test_train_one_epoch_and_eval_at_12_frames_from_the_cli(tmp_path, capsys, pos_enc):
    from peg_core.engine import read_checkpoint
    from peg_video.__main__ import main

    data = synthetic_set(tmp_path / "syn", num_train=8, num_val=4, frames=24, seed=2)
    out = tmp_path / "run"
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(["train", "--train-ann", str(data / "train.csv"), "--val-ann", str(data / "val.csv"),
                     "--output-dir", str(out), *TINY, "--pos-enc", pos_enc, "--epochs", "1"]) == 0  # fmt: skip
        assert read_checkpoint(out / "checkpoint.pth", "video")["model_config"]["pos_enc"] == pos_enc
        capsys.readouterr()
        assert main(["eval", "--checkpoint", str(out / "checkpoint.pth"), "--num-frames", "12",
                     "--output-dir", str(tmp_path / "ev"), "--no-progress", "--workers", "0"]) == 0  # fmt: skip
    finally:
        torch.set_num_threads(before)
    metrics = json.loads((tmp_path / "ev" / "report.json").read_text())["eval"]
    assert metrics["num_frames"] == 12 and metrics["num_videos"] == 4 and 0 <= metrics["top1"] <= 1
