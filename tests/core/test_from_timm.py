"""peg_core.interop.from_timm: today's timm backbones as a CPVT with the same outputs, at 224 and 256x320."""

from __future__ import annotations

import pytest
import torch

timm = pytest.importorskip("timm")

from peg_core.interop import from_timm  # noqa: E402
from peg_core.models import CPVT  # noqa: E402

MODELS = {
    "vit_small_patch16_rope_224": "rope-axial",
    "vit_small_patch16_rope_mixed_224": "rope-mixed",
    "vit_small_patch16_rope_mixed_ape_224": "learned+rope-mixed",
    "vit_small_patch16_dinov3": "rope-dinov3",
    "deit_tiny_patch16_224": "learned",
}
SIZES = [(224, 224), (256, 320)]


def _timm_model(name: str, **kwargs) -> torch.nn.Module:
    """Depth 2 (equality is what matters), layer scale 1 (so attention counts), a non-trivial head and table."""
    torch.manual_seed(0)
    kwargs.setdefault("num_classes", 10)
    model = timm.create_model(name, pretrained=False, dynamic_img_size=True, depth=2, **kwargs).eval()
    with torch.no_grad():
        for key, p in model.named_parameters():
            if "gamma" in key:
                p.fill_(1.0)
            elif key.startswith("head.") or key in ("pos_embed", "cls_token", "reg_token"):
                p.normal_(std=0.5)
    return model


@pytest.fixture(scope="module")
def converted():
    out = {}
    for name in MODELS:
        model = _timm_model(name)
        out[name] = (model, from_timm(model))
    return out


@pytest.mark.parametrize("name", list(MODELS))
def test_same_outputs_as_timm(converted, name):
    model, ours = converted[name]
    assert isinstance(ours, CPVT) and ours.pos_enc_kind == MODELS[name] and not ours.training
    torch.manual_seed(1)
    for size in SIZES:
        x = torch.randn(2, 3, *size)
        with torch.no_grad():
            want, got = model(x), ours(x)
            feats = model.forward_head(model.forward_features(x), pre_logits=True)
            ours_feats = ours.forward_head(ours.forward_features(x)[0], pre_logits=True)
        assert want.abs().max() > 0.1  # a head that says something
        assert (got - want).abs().max() <= 1e-4, (name, size)
        assert (ours_feats - feats).abs().max() <= 1e-4, (name, size)


def test_layouts_reach_the_cpvt(converted):
    _, dino = converted["vit_small_patch16_dinov3"]
    assert dino.num_prefix_tokens == 5 and dino.rope.half and dino.blocks[0].attn.qkv.bias is None
    assert "blocks.0.ls1.gamma" in dino.state_dict()
    model, mixed = converted["vit_small_patch16_rope_mixed_224"]
    assert torch.equal(mixed.rope.freqs, model.rope.freqs)
    assert "rope.freqs" in mixed.no_weight_decay()
    _, ape = converted["vit_small_patch16_rope_mixed_ape_224"]
    assert ape.no_embed_class and ape.pos_enc.pos_embed.shape == (1, 196, 384)


@pytest.mark.parametrize("name", ["vit_small_patch16_rope_mixed_224", "deit_tiny_patch16_224"])
def test_peg_at_is_the_identity_until_it_trains(name):
    model = _timm_model(name)
    ours = from_timm(model, peg_at=[0])
    assert set(ours.pos_blocks) == {"0"} and ours.pos_enc_kind.startswith("peg+")
    x = torch.randn(1, 3, 256, 320)
    with torch.no_grad():
        want = model(x)
        assert (ours(x) - want).abs().max() <= 1e-4
        for p in ours.pos_blocks.parameters():
            p.normal_(std=0.5)
        assert (ours(x) - want).abs().max() > 1e-2


def test_unsupported_models_raise_type_error():
    with pytest.raises(TypeError, match="from_timm supports"):
        from_timm(torch.nn.Linear(2, 2))
    swiglu = timm.create_model("vit_small_plus_patch16_dinov3", pretrained=False, depth=1)
    with pytest.raises(TypeError, match="mlp"):
        from_timm(swiglu)
    with pytest.raises(ValueError, match="peg_at"):
        from_timm(_timm_model("deit_tiny_patch16_224"), peg_at=[5])
