"""Starting a video transformer from 2D checkpoints: CPVT (peg_core) and timm-DeiT state dicts."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from peg_core.models.cpvt import CPVT
from peg_video import build_video_model, load_2d_checkpoint
from peg_video.interop import inflate_patch_embed
from peg_video.models import TubeletEmbed

DIMS = {"embed_dim": 16, "depth": 2, "num_heads": 2}


def cpvt(**kw):
    torch.manual_seed(0)
    model = CPVT(**DIMS, num_classes=5, img_size=32, patch_size=8, **kw).double().eval()
    with torch.no_grad():  # make every parameter matter (LayerNorms, biases, the PEG)
        for prm in model.parameters():
            prm.add_(0.1 * torch.randn_like(prm))
    return model


def video(pos_enc, num_classes=5, img_size=32, **kw):
    opts = {**DIMS, **kw}
    return build_video_model("vit_tiny", pos_enc, num_classes, 4, img_size, (2, 8, 8), **opts).double().eval()


def static_clip(image, frames):
    """``(B, 3, H, W)`` -> ``(B, 3, T, H, W)`` with every frame the image."""
    return image.unsqueeze(2).expand(-1, -1, frames, -1, -1).contiguous()


@pytest.mark.parametrize("inflation", ["mean", "central"])
def test_patch_embedding_inflation(inflation):
    conv2d = torch.nn.Conv2d(3, 6, 4, stride=4).double()
    embed = TubeletEmbed((3, 4, 4), 3, 6).double()
    with torch.no_grad():
        embed.proj.weight.copy_(inflate_patch_embed(conv2d.weight, 3, inflation))
        embed.proj.bias.copy_(conv2d.bias)
    clip = torch.randn(2, 3, 6, 8, 12, dtype=torch.float64)
    tokens, size = embed(clip)
    assert size == (2, 2, 3)
    if inflation == "mean":  # tubelet = mean over its 3 frames of the 2D embedding
        mean = [
            sum(F.conv2d(clip[:, :, t], conv2d.weight, stride=4) for t in range(3 * i, 3 * i + 3)) / 3
            for i in range(2)
        ]
        expect = torch.stack(mean, 2) + conv2d.bias.view(1, -1, 1, 1, 1)  # the bias once per tubelet
    else:  # the middle frame of each tubelet
        expect = torch.stack([conv2d(clip[:, :, 3 * i + 1]) for i in range(2)], 2)
    torch.testing.assert_close(tokens, expect.flatten(2).transpose(1, 2), rtol=0, atol=1e-12)
    # a static clip embeds exactly like its frame with either inflation
    still = static_clip(clip[:, :, 0], 6)
    tokens, _ = embed(still)
    image_tokens = conv2d(clip[:, :, 0]).flatten(2).transpose(1, 2)
    torch.testing.assert_close(tokens[:, :6], image_tokens, rtol=0, atol=1e-12)
    torch.testing.assert_close(tokens[:, 6:], image_tokens, rtol=0, atol=1e-12)


@pytest.mark.parametrize("pos_enc", ["peg3d", "peg3d-factorized"])
def test_cpvt_init_sees_a_static_clip_as_its_frame(pos_enc):
    image_model = cpvt(pos_enc="peg", peg_at=(0, 1), global_pool="avg")
    model = video(pos_enc, peg_at=(0, 1))
    report = load_2d_checkpoint(model, image_model.state_dict(), source="cpvt")
    assert "inflated from the PEG2d pos_blocks.1" in report.converted["pos_blocks.1.proj.weight"]
    assert not report.missing  # every parameter came from the checkpoint
    image = torch.randn(2, 3, 32, 24, dtype=torch.float64)
    expect = image_model(image)
    for frames in (2, 4, 6):
        torch.testing.assert_close(model(static_clip(image, frames)), expect, rtol=0, atol=1e-10)
    # a PEG the video model does not have is reported, not silently dropped
    report = load_2d_checkpoint(video(pos_enc, peg_at=(0,)), image_model.state_dict(), source="cpvt")
    assert "pos_blocks.1.proj.weight" in report.skipped and "pos_blocks.0.proj.weight" in report.converted
    # a moving clip is no longer its first frame: the model now sees time
    clip = static_clip(image, 4)
    clip[:, :, 2:] = torch.randn_like(clip[:, :, 2:])
    assert (model(clip) - expect).abs().max() > 1e-3


def deit_state_dict(image_model, distilled=False):
    """timm DeiT names from CPVT(pos_enc="learned"): the table sits at the top level."""
    sd = dict(image_model.state_dict())
    sd["pos_embed"] = sd.pop("pos_enc.pos_embed")
    if distilled:  # DeiT-distilled: a second prefix token and head
        sd["dist_token"] = torch.zeros_like(sd["cls_token"])
        sd["pos_embed"] = torch.cat(
            [sd["pos_embed"][:, :1], torch.randn_like(sd["cls_token"]), sd["pos_embed"][:, 1:]], 1
        )
        sd["head_dist.weight"] = torch.zeros_like(sd["head.weight"])
    return {"model": {f"module.{k}": v for k, v in sd.items()}}  # wrapped as DDP checkpoints are


@pytest.mark.parametrize("distilled", [False, True])
def test_deit_init_learned_divided_matches_image_model(distilled):
    image_model = cpvt(pos_enc="learned", global_pool="token")
    model = video("learned", attention="divided", global_pool="token", img_size=40)
    report = load_2d_checkpoint(model, deit_state_dict(image_model, distilled), source="deit")
    assert report.converted["cls_token"] == "cls_token + pos_embed[:, 0]"
    assert report.converted["pos_enc.spatial"].startswith("pos_embed grid part resized to (5, 5)")
    assert torch.all(model.pos_enc.temporal == 0)
    assert torch.all(model.blocks[1].attn_t.proj.weight == 0)
    torch.testing.assert_close(model.blocks[1].attn_t.qkv.weight, image_model.blocks[1].attn.qkv.weight)
    assert not report.missing
    if distilled:
        assert {"dist_token", "head_dist.weight"} <= set(report.skipped)
    # the 2D model resizes its 4x4 table to 5x5 at 40 px with the same bicubic resize
    image = torch.randn(2, 3, 40, 40, dtype=torch.float64)
    expect = image_model(image)
    torch.testing.assert_close(model(static_clip(image, 4)), expect, rtol=0, atol=1e-10)


def test_head_dropped_and_report():
    image_model = cpvt(pos_enc="peg", global_pool="avg")
    model = video("peg3d", num_classes=7, peg_at=(-1, 0))  # the 2D model has no PEG before block 0
    report = load_2d_checkpoint(model, image_model.state_dict(), source="cpvt", inflation="central")
    assert set(report.missing) == {
        "head.weight",
        "head.bias",
        "pos_blocks.-1.proj.weight",
        "pos_blocks.-1.proj.bias",
    }
    assert "head dropped" in report.skipped["head.weight"]
    assert report.converted["patch_embed.proj.weight"] == "central inflation over 2 frames"
    torch.testing.assert_close(
        model.blocks[0].mlp.fc1.weight, image_model.blocks[0].mlp.fc1.weight, rtol=0, atol=0
    )
    text = str(report)
    assert "left at init" in text and "missing head.weight" in text
    # a learned table has no place in a PEG model: reported, not loaded
    table_model = cpvt(pos_enc="learned", global_pool="avg")
    report = load_2d_checkpoint(video("sincos"), table_model.state_dict(), source="cpvt")
    assert "not 'learned'" in report.skipped["pos_enc.pos_embed"]


def test_load_errors_name_keys_and_shapes():
    image_model = cpvt(pos_enc="peg", global_pool="avg")
    with pytest.raises(ValueError, match="source must be one of"):
        load_2d_checkpoint(video("peg3d"), image_model.state_dict(), source="mae")
    with pytest.raises(
        ValueError,
        match=r"patch_embed\.proj\.weight \(16, 3, 8, 8\) \(as \(16, 3, 2, 8, 8\) after mean.*\(32, 3, 2, 8, 8\)",
    ):
        load_2d_checkpoint(video("none", embed_dim=32), image_model.state_dict(), source="cpvt")
    with pytest.raises(ValueError, match=r"not a 2D kernel of the tubelet's spatial size \(16, 16\)"):
        build = build_video_model("vit_tiny", "none", 5, 4, 32, (2, 16, 16), **DIMS)
        load_2d_checkpoint(build, image_model.state_dict(), source="cpvt")
    with pytest.raises(ValueError, match=r"no 'blocks\.0\.attn\.qkv\.weight'"):
        load_2d_checkpoint(video("none"), {"patch_embed.proj.weight": torch.zeros(16, 3, 8, 8)}, "deit")
    with pytest.raises(ValueError, match=r"3x3 PEG2d of dim 16 does not inflate into .* \(3, 5, 5\)"):
        load_2d_checkpoint(video("peg3d", peg_kernel_size=(3, 5, 5)), image_model.state_dict())


def test_non_square_source_table_needs_its_grid():
    image_model = CPVT(
        **DIMS, num_classes=5, img_size=(32, 24), patch_size=8, pos_enc="learned", global_pool="token"
    )
    sd = deit_state_dict(image_model)
    model = video("learned", global_pool="token", img_size=(32, 24))
    with pytest.raises(ValueError, match="not a perfect square"):
        load_2d_checkpoint(model, sd, source="deit")
    load_2d_checkpoint(model, sd, source="deit", source_grid=(4, 3))
    table = image_model.pos_enc.pos_embed[:, 1:]  # a 4x3 grid, kept as it is
    torch.testing.assert_close(model.pos_enc.spatial, table.double(), rtol=0, atol=0)
