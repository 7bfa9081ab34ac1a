"""convert_to_cpvt: a live timm / torchvision ViT loses its position table and gains zero-init PEGs."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from peg_core.interop import convert_to_cpvt

timm_vit = pytest.importorskip("timm.models.vision_transformer")
tv_vit = pytest.importorskip("torchvision.models.vision_transformer")

SMALL = dict(img_size=224, patch_size=16, embed_dim=64, depth=2, num_heads=2, num_classes=5)
TIMM_VARIANTS = {
    "cls": {},
    "reg4": dict(reg_tokens=4),
    "gap": dict(class_token=False, global_pool="avg"),
    "no_embed_class": dict(no_embed_class=True),
    "dynamic": dict(dynamic_img_size=True),
}


def _timm_pair(**kw) -> tuple[nn.Module, nn.Module]:
    """(model to convert, reference = same weights, table zeroed, dynamic_img_size so any size runs)."""
    model = timm_vit.VisionTransformer(**SMALL, **kw).eval()
    ref = timm_vit.VisionTransformer(**SMALL, **{**kw, "dynamic_img_size": True}).eval()
    ref.load_state_dict(model.state_dict())
    with torch.no_grad():
        ref.pos_embed.zero_()
    return model, ref


def _tv_model() -> nn.Module:
    model = tv_vit.VisionTransformer(
        image_size=224, patch_size=16, num_layers=2, num_heads=2, hidden_dim=64, mlp_dim=128, num_classes=5
    ).eval()
    nn.init.normal_(model.heads.head.weight)  # torchvision starts the head at zero: outputs would all be 0
    return model


def _tv_forward_without_table(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """torchvision's ViT forward written out by hand, minus ``pos_embedding``: ``(B, 3, H, W) -> (B, classes)``."""
    t = model.conv_proj(x).flatten(2).transpose(1, 2)  # (B, h*w, C)
    t = torch.cat([model.class_token.expand(x.shape[0], -1, -1), t], dim=1)
    for layer in model.encoder.layers:
        t = layer.forward(t)  # .forward: no hooks, so no PEG
    return model.heads(model.encoder.ln(t)[:, 0])


def _peg_ref(x: torch.Tensor, conv: nn.Conv2d, grid: tuple[int, int], prefix: int) -> torch.Tensor:
    """PEG by the formula: tokens -> (B, C, h, w) grid, depthwise conv with zero padding, add."""
    b, _, c = x.shape
    g = x[:, prefix:].transpose(1, 2).reshape(b, c, *grid)
    y = g + F.conv2d(g, conv.weight, conv.bias, padding=conv.weight.shape[-1] // 2, groups=c)
    return torch.cat([x[:, :prefix], y.flatten(2).transpose(1, 2)], dim=1)


@pytest.mark.parametrize("variant", list(TIMM_VARIANTS))
def test_timm_equals_zero_table_original(variant: str) -> None:
    torch.manual_seed(0)
    model, ref = _timm_pair(**TIMM_VARIANTS[variant])
    assert convert_to_cpvt(model) is model
    keys = model.state_dict().keys()
    assert "pos_embed" not in keys and {"pos_blocks.0.proj.weight", "pos_blocks.0.proj.bias"} <= set(keys)
    with torch.no_grad():
        for size in [(224, 224), (320, 256)]:  # the trained size, and a non-square one the original refuses
            x = torch.randn(2, 3, *size)
            torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)


def test_timm_distilled_equals_zero_table_original() -> None:
    deit = pytest.importorskip("timm.models.deit")
    torch.manual_seed(0)
    model = deit.VisionTransformerDistilled(**SMALL).eval()
    ref = deit.VisionTransformerDistilled(**SMALL, dynamic_img_size=True).eval()
    ref.load_state_dict(model.state_dict())
    with torch.no_grad():
        ref.pos_embed.zero_()
        convert_to_cpvt(model)
        x = torch.randn(2, 3, 320, 256)
        torch.testing.assert_close(model(x), ref(x), atol=1e-5, rtol=1e-5)


def test_torchvision_equals_zero_table_original() -> None:
    torch.manual_seed(0)
    model = _tv_model().double()
    zeroed = copy.deepcopy(model)
    with torch.no_grad():
        zeroed.encoder.pos_embedding.zero_()
    x224 = torch.randn(2, 3, 224, 224, dtype=torch.float64)
    x320 = torch.randn(2, 3, 320, 256, dtype=torch.float64)
    with torch.no_grad():
        expected224 = zeroed(x224)
        torch.testing.assert_close(
            _tv_forward_without_table(model, x224), expected224
        )  # the hand forward is right
        convert_to_cpvt(model)
        assert "encoder.pos_embedding" not in model.state_dict()
        torch.testing.assert_close(model(x224), expected224)
        torch.testing.assert_close(model(x320), _tv_forward_without_table(model, x320))


def test_live_pegs_match_formula_on_non_square_grid() -> None:
    """Random PEG weights after blocks 0 and 1: the output is blocks + PEG formula at grid (20, 16)."""
    torch.manual_seed(0)
    model, _ = _timm_pair(reg_tokens=2)
    convert_to_cpvt(model, peg_at=(0, 1), kernel_size=5)
    model = model.double()
    with torch.no_grad():
        for p in model.pos_blocks.parameters():
            p.normal_(0, 0.2)
        x = torch.randn(2, 3, 320, 256, dtype=torch.float64)
        t = model.patch_embed.proj(x).flatten(2).transpose(1, 2)
        prefix = torch.cat([model.cls_token, model.reg_token], 1).expand(2, -1, -1)
        t = torch.cat([prefix, t], 1)
        for i, blk in enumerate(model.blocks):
            t = _peg_ref(blk.forward(t), model.pos_blocks[str(i)].proj, (20, 16), prefix=3)
        torch.testing.assert_close(model(x), model.forward_head(model.norm(t)))


def test_torchvision_live_peg_grid() -> None:
    torch.manual_seed(0)
    model = convert_to_cpvt(_tv_model().double(), peg_at=1)
    with torch.no_grad():
        for p in model.pos_blocks.parameters():
            p.normal_(0, 0.2)
        x = torch.randn(1, 3, 96, 160, dtype=torch.float64)  # grid (6, 10)
        t = model.conv_proj(x).flatten(2).transpose(1, 2)
        t = torch.cat([model.class_token, t], 1)
        t = model.encoder.layers[0].forward(t)
        t = _peg_ref(model.encoder.layers[1].forward(t), model.pos_blocks["1"].proj, (6, 10), prefix=1)
        torch.testing.assert_close(model(x), model.heads(model.encoder.ln(t)[:, 0]))


@pytest.mark.parametrize("build", ["timm", "torchvision"])
def test_sizes_not_multiple_of_patch_are_padded(build: str) -> None:
    torch.manual_seed(0)
    model = convert_to_cpvt(_timm_pair()[0] if build == "timm" else _tv_model())
    x = torch.randn(1, 3, 100, 77)
    with torch.no_grad():
        torch.testing.assert_close(model(x), model(F.pad(x, (0, 3, 0, 12))))  # 112 x 80: 7 x 5 patches


def test_gradient_step_on_peg_changes_output() -> None:
    torch.manual_seed(0)
    model = convert_to_cpvt(_timm_pair()[0])
    x = torch.randn(2, 3, 160, 96)
    with torch.no_grad():
        before = model(x)
    opt = torch.optim.SGD(model.pos_blocks.parameters(), lr=1.0)
    model(x).square().sum().backward()
    grad = model.pos_blocks["0"].proj.weight.grad
    assert grad is not None and grad.abs().sum() > 0
    opt.step()
    with torch.no_grad():
        assert (model(x) - before).abs().max() > 1e-3
    sd = model.state_dict()
    assert torch.equal(sd["pos_blocks.0.proj.weight"], model.pos_blocks["0"].proj.weight)


@pytest.mark.parametrize("build", ["timm", "torchvision"])
def test_copies_get_their_own_pegs(build: str) -> None:
    """deepcopy (EMA) and torch.save/load of the whole model: each copy's hooks run its own PEGs."""
    torch.manual_seed(0)
    model = convert_to_cpvt(_timm_pair()[0] if build == "timm" else _tv_model())
    loaded = pickle.loads(pickle.dumps(model))  # what torch.save of a whole model does, in memory
    twin = copy.deepcopy(model)
    x = torch.randn(1, 3, 64, 48)
    with torch.no_grad():
        before = model(x)
        torch.testing.assert_close(loaded(x), before)
        for copied in (twin, loaded):
            for p in copied.pos_blocks.parameters():
                p.normal_(0, 0.5)
            assert (copied(x) - before).abs().max() > 1e-3
        torch.testing.assert_close(model(x), before)


def test_errors() -> None:
    with pytest.raises(TypeError, match="Linear"):
        convert_to_cpvt(nn.Linear(2, 2))
    with pytest.raises(ValueError, match=r"outside the model's 2 blocks"):
        convert_to_cpvt(_timm_pair()[0], peg_at=(0, 2))
    with pytest.raises(ValueError, match="at least one"):
        convert_to_cpvt(_tv_model(), peg_at=())
    model = convert_to_cpvt(_tv_model())
    with pytest.raises(ValueError, match="already"):
        convert_to_cpvt(model)
