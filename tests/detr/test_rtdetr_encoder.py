"""RT-DETR's ResNet-vd backbone and hybrid encoder: parity with transformers, position encodings, freezing."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torchvision.ops import FrozenBatchNorm2d

from peg_core.interop import WeightsError
from peg_core.peg import PegOptions
from peg_detr.interop.hf_rtdetr import (
    encoder_hf_config,
    encoder_hf_keys,
    encoder_hf_to_ours,
    encoder_ours_to_hf,
    rtdetr_build_options,
)
from peg_detr.models.rtdetr import (
    AIFI_ENCODINGS,
    HybridEncoder,
    ResNetVd,
    RTDetrSinCos2d,
    build_resnet_vd,
    rtdetr_sincos_2d,
)

transformers = pytest.importorskip("transformers")
from transformers.models.rt_detr import modeling_rt_detr  # noqa: E402

SMALL_BACKBONE = dict(
    layer_type="basic", depths=[1, 1, 1, 1], hidden_sizes=[32, 64, 128, 256], embedding_size=32
)


def _small_config(**overrides) -> transformers.RTDetrConfig:
    backbone = transformers.RTDetrResNetConfig(**SMALL_BACKBONE, out_features=["stage2", "stage3", "stage4"])
    options = dict(encoder_hidden_dim=64, d_model=64, encoder_in_channels=[64, 128, 256],
                   decoder_in_channels=[64, 64, 64], anchor_image_size=None)  # fmt: skip
    return transformers.RTDetrConfig(backbone_config=backbone, **{**options, **overrides})


def _randomise_norms(model: nn.Module, seed: int = 0) -> None:
    """Non-trivial batch-norm statistics and affine terms (HF's init leaves most at identity / ~0)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            if name.endswith("running_var"):
                t.copy_(torch.rand(t.shape, generator=g) + 0.5)
            elif name.endswith("running_mean") or ("norm" in name and name.endswith("bias")):
                t.copy_(torch.randn(t.shape, generator=g) * 0.1)
            elif "norm" in name and name.endswith("weight") and t.dim() == 1:
                t.copy_(torch.rand(t.shape, generator=g) + 0.5)


def _ours_from_hf(hf) -> nn.Module:
    """Backbone + encoder built from ``hf``'s config.json fields (the one mapping, :func:`rtdetr_build_options`),
    under the detector's attribute names, loaded from ``hf``'s state dict (strict)."""
    options = rtdetr_build_options(hf.config.to_dict())
    backbone = ResNetVd(**options["backbone"])
    encoder = HybridEncoder(pos_enc="sincos", **options["encoder"])
    model = nn.ModuleDict({"backbone": backbone, "encoder": encoder})
    state = hf.state_dict()
    mapped = {ours: state[key] for key, ours in encoder_hf_keys(state).items()}
    model.load_state_dict(mapped, strict=True)
    return model.eval()


@torch.no_grad()
def _hf_encoder(hf, x: torch.Tensor) -> list[torch.Tensor]:
    """HF's backbone -> encoder_input_proj -> encoder, in RTDetrModel.forward's order."""
    mask = torch.ones(x.shape[0], *x.shape[2:], dtype=torch.long)
    feats = hf.model.backbone(x, mask)
    proj = [hf.model.encoder_input_proj[level](f) for level, (f, _) in enumerate(feats)]
    return list(hf.model.encoder(proj).last_hidden_state)


def _assert_close_levels(ours: list[torch.Tensor], ref: list[torch.Tensor], atol: float = 1e-4) -> None:
    assert len(ours) == len(ref) == 3
    for level, (a, b) in enumerate(zip(ours, ref)):
        assert a.shape == b.shape, level
        assert b.abs().mean() > 1e-2, f"level {level}: reference output is degenerate"
        torch.testing.assert_close(a, b, atol=atol, rtol=0, msg=lambda m, level=level: f"level {level}: {m}")


def _assert_same_architecture(
    ours: nn.Module, backbone: ResNetVd, encoder: HybridEncoder, config: dict
) -> None:
    """``ours`` (built from the HF config) has the presets' shapes, and writes back the HF config's fields."""
    shapes = {k: v.shape for k, v in ours.state_dict().items()}
    presets = nn.ModuleDict({"backbone": backbone, "encoder": encoder}).state_dict()
    assert shapes == {k: v.shape for k, v in presets.items()}
    written = encoder_hf_config(ours["backbone"], ours["encoder"])
    for key, value in written.items():
        if key == "backbone_config":
            assert value == {k: config[key][k] for k in value}
        else:
            assert value == config[key], key


def _small_ours(pos_enc: str = "sincos", **enc_options) -> nn.Module:
    backbone = ResNetVd(18, depths=(1, 1, 1, 1), widths=(32, 64, 128, 256), stem_width=32)
    encoder = HybridEncoder([64, 128, 256], 64, pos_enc=pos_enc, **enc_options)
    return nn.ModuleDict({"backbone": backbone, "encoder": encoder})


def _run(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    return model["encoder"](model["backbone"](x))


@pytest.fixture(scope="module")
def small_pair():
    torch.manual_seed(0)
    hf = transformers.RTDetrForObjectDetection(_small_config()).eval()
    _randomise_norms(hf)
    return hf, _ours_from_hf(hf)


def test_small_config_is_read_and_written_back(small_pair):
    hf, ours = small_pair
    preset = ResNetVd(18, depths=(1, 1, 1, 1), widths=(32, 64, 128, 256), stem_width=32)
    _assert_same_architecture(ours, preset, HybridEncoder([64, 128, 256], 64), hf.config.to_dict())
    with pytest.raises(ValueError, match="pos_enc 'peg' cannot be exported"):
        encoder_hf_config(ours["backbone"], HybridEncoder([64, 128, 256], 64, pos_enc="peg"))
    with pytest.raises(WeightsError, match="rt_detr_resnet"):
        rtdetr_build_options({"backbone_config": {"model_type": "resnet"}})
    kwargs = rtdetr_build_options(hf.config.to_dict(), pos_enc="peg")["encoder"]
    assert kwargs["in_channels"] == [64, 128, 256] and kwargs["hidden_dim"] == 64


@pytest.mark.parametrize("size", [(320, 320), (256, 384)])
def test_small_config_matches_transformers(small_pair, size):
    hf, ours = small_pair
    x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        feats = ours["backbone"](x)
        ref_feats = hf.model.backbone.model(x).feature_maps
        for a, b in zip(feats, ref_feats):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
        out = ours["encoder"](feats)
    _assert_close_levels(out, _hf_encoder(hf, x))
    assert [tuple(o.shape[-2:]) for o in out] == [(size[0] // s, size[1] // s) for s in (8, 16, 32)]


def test_default_r50vd_config_matches_transformers():
    torch.manual_seed(0)
    hf = transformers.RTDetrForObjectDetection(transformers.RTDetrConfig(anchor_image_size=None)).eval()
    _randomise_norms(hf)
    ours = _ours_from_hf(hf)
    _assert_same_architecture(ours, ResNetVd(50), HybridEncoder(), hf.config.to_dict())
    x = torch.randn(1, 3, 256, 384, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = _run(ours, x)
    _assert_close_levels(out, _hf_encoder(hf, x))


def test_r18vd_expansion_half_matches_transformers():
    """RT-DETR R18's encoder has expansion 0.5: CSP layers then have a ``conv3`` (HF ``hidden_expansion``)."""
    torch.manual_seed(0)
    hf = transformers.RTDetrForObjectDetection(_small_config(hidden_expansion=0.5)).eval()
    _randomise_norms(hf, seed=3)
    ours = _ours_from_hf(hf)
    assert "encoder.fpn_blocks.0.conv3.conv.weight" in ours.state_dict()
    x = torch.randn(1, 3, 192, 256, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        out = _run(ours, x)
    _assert_close_levels(out, _hf_encoder(hf, x))


@pytest.mark.parametrize(
    ("name", "hf_backbone"),
    [
        ("r18vd", dict(layer_type="basic", depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512])),
        ("r34vd", dict(layer_type="basic", depths=[3, 4, 6, 3], hidden_sizes=[64, 128, 256, 512])),
        ("r101vd", dict(layer_type="bottleneck", depths=[3, 4, 23, 3])),
    ],
)
def test_backbone_state_dict_is_hf_layout(name, hf_backbone):
    """Every depth's keys and shapes are HF's ``RTDetrResNetBackbone`` with frozen norms, one to one."""
    config = transformers.RTDetrResNetConfig(**hf_backbone, out_features=["stage2", "stage3", "stage4"])
    hf = transformers.RTDetrResNetBackbone(config)
    modeling_rt_detr.replace_batch_norm(hf)
    ref = {k: tuple(v.shape) for k, v in hf.state_dict().items()}
    ours = build_resnet_vd(name)
    assert {k: tuple(v.shape) for k, v in ours.state_dict().items()} == ref
    assert ours.out_channels == list(hf.channels)


def test_key_map_round_trips_and_leaves_others_out(small_pair):
    hf, ours = small_pair
    hf_keys = [k for k in hf.state_dict() if k.startswith(("model.backbone.", "model.encoder"))]
    to_ours = encoder_hf_keys(hf.state_dict())
    assert sorted(to_ours) == sorted(hf_keys)
    assert sorted(to_ours.values()) == sorted(ours.state_dict())
    assert all(encoder_ours_to_hf(o) == h for h, o in to_ours.items())
    assert encoder_hf_keys(ours.state_dict(), to_hf=True) == {o: h for h, o in to_ours.items()}
    assert encoder_hf_to_ours("model.decoder.layers.0.self_attn.q_proj.weight") is None
    assert encoder_hf_to_ours("model.encoder_input_proj.2.0.weight") == "encoder.input_proj.2.0.weight"
    assert encoder_ours_to_hf("encoder.input_proj.2.1.bias") == "model.encoder_input_proj.2.1.bias"
    assert encoder_ours_to_hf("encoder.aifi.0.pegs.-1.proj.weight") is None
    assert encoder_ours_to_hf("decoder.layers.0.x") is None


def test_saved_file_layout_maps_to_the_same_weights(small_pair, tmp_path):
    """``save_pretrained`` writes AIFI under transformers 4's names; both layouts map to our keys."""
    from safetensors.torch import load_file

    hf, ours = small_pair
    hf.save_pretrained(tmp_path)
    saved = load_file(tmp_path / "model.safetensors")
    assert any(k.startswith("model.encoder.encoder.0.layers.0.fc1.") for k in saved)  # the file layout
    from_file = encoder_hf_keys(saved)
    assert sorted(from_file.values()) == sorted(ours.state_dict())
    mine = ours.state_dict()
    assert all(torch.equal(saved[h], mine[o]) for h, o in from_file.items())
    assert encoder_hf_keys(mine, to_hf=True, layout="file") == {o: h for h, o in from_file.items()}
    with pytest.raises(ValueError, match="layout must be one of"):
        encoder_ours_to_hf("backbone.x", layout="hub")


def test_sincos_table_is_rtdetr_formula():
    h, w, dim, temp = 3, 5, 16, 10000.0
    table = RTDetrSinCos2d(dim, temp).table((h, w))
    assert table.dtype == torch.float64
    q = dim // 4
    expect = torch.empty(h * w, dim, dtype=torch.float64)
    for i in range(h):
        for j in range(w):
            for k in range(q):
                omega = 1.0 / temp ** (k / q)
                row = expect[i * w + j]
                row[k], row[q + k] = math.sin(i * omega), math.cos(i * omega)
                row[2 * q + k], row[3 * q + k] = math.sin(j * omega), math.cos(j * omega)
    torch.testing.assert_close(table, expect, atol=1e-12, rtol=0)
    hf_table = modeling_rt_detr.build_2d_sinusoidal_position_embedding(9, 13, 64, 10000.0)
    assert torch.equal(rtdetr_sincos_2d((9, 13), 64, like=hf_table), hf_table)


def test_sincos_is_computed_for_each_size_without_cache():
    enc = HybridEncoder([8, 8, 8], 32, num_heads=4, dim_feedforward=64)
    assert not list(enc.aifi[0].buffers()) and "aifi.0.pos" not in str(list(enc.state_dict()))
    tokens = torch.zeros(1, 6 * 10, 32)
    pos = enc.aifi[0].pos.position(tokens, (6, 10))
    assert pos.shape == (1, 60, 32)
    torch.testing.assert_close(pos[0], RTDetrSinCos2d(32).table((6, 10), tokens))
    assert enc.aifi[0].pos.position(torch.zeros(1, 4 * 7, 32), (4, 7)).shape == (1, 28, 32)


def _tiny_pair(pos_a: str, pos_b: str, **options) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    a = _small_ours(pos_a, **options).eval()
    b = _small_ours(pos_b, **options).eval()
    missing, unexpected = b.load_state_dict(a.state_dict(), strict=False)
    assert not unexpected
    return a, b, missing


def test_peg_equals_none_until_its_weights_move():
    none, peg, missing = _tiny_pair("none", "peg")
    assert missing == ["encoder.aifi.0.pegs.-1.proj.weight", "encoder.aifi.0.pegs.-1.proj.bias"]
    x = torch.randn(1, 3, 160, 224)
    with torch.no_grad():
        ref = _run(none, x)
        for a, b in zip(_run(peg, x), ref):
            torch.testing.assert_close(a, b, atol=0, rtol=0)
        nn.init.normal_(peg["encoder"].aifi[0].pegs["-1"].proj.weight, std=0.1)
        moved = _run(peg, x)
    assert all((a - b).abs().max() > 1e-3 for a, b in zip(moved, ref))


def test_sincos_differs_from_none():
    none, sincos, missing = _tiny_pair("none", "sincos")
    assert missing == []
    x = torch.randn(1, 3, 128, 128)
    with torch.no_grad():
        assert (_run(none, x)[2] - _run(sincos, x)[2]).abs().max() > 1e-3


@pytest.mark.parametrize("pos_enc", [*AIFI_ENCODINGS.names(), "peg+rope-axial", "peg+rope-mixed"])
def test_every_pos_enc_runs_at_other_sizes_and_trains(pos_enc):
    torch.manual_seed(0)
    model = nn.ModuleDict(
        {"backbone": build_resnet_vd("tiny"), "encoder": HybridEncoder([32, 64, 128], 32, num_heads=4,
                                                                       dim_feedforward=64, pos_enc=pos_enc)}
    )  # fmt: skip
    model.eval()
    with torch.no_grad():
        # 288x416: odd stride-32 grid (9x13); 136x200: sides not multiples of 32 (ceil halvings).
        for b, h, w in [(1, 288, 416), (2, 96, 160), (1, 136, 200)]:
            out = _run(model, torch.randn(b, 3, h, w))
            expect = [(math.ceil(h / s), math.ceil(w / s)) for s in (8, 16, 32)]
            assert [tuple(o.shape[-2:]) for o in out] == expect
            assert all(o.shape[:2] == (b, 32) and torch.isfinite(o).all() for o in out)
    model.train()
    sum(o.square().mean() for o in _run(model, torch.randn(2, 3, 96, 128))).backward()
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(p.grad is not None and torch.isfinite(p.grad).all() for p in trainable.values())
    for name, p in trainable.items():
        if ".pegs." in name or ".rope." in name or ".pos." in name:
            assert p.grad.abs().sum() > 0, name  # the position modules learn (the zero PEG too)


def test_position_module_keys():
    def keys(pos_enc: str) -> set[str]:
        enc = HybridEncoder([8, 8, 8], 32, num_heads=4, dim_feedforward=64, pos_enc=pos_enc)
        base = set(HybridEncoder([8, 8, 8], 32, num_heads=4, dim_feedforward=64, pos_enc="none").state_dict())
        return set(enc.state_dict()) - base

    assert keys("sincos") == keys("rope-axial") == set()
    assert keys("learned") == {"aifi.0.pos.pos_embed"}
    assert keys("rope-mixed") == {"aifi.0.rope.freqs"}
    assert keys("peg+rope-mixed") == {
        "aifi.0.rope.freqs",
        "aifi.0.pegs.-1.proj.weight",
        "aifi.0.pegs.-1.proj.bias",
    }
    enc = HybridEncoder(
        [8, 8, 8], 32, num_heads=4, pos_enc="peg", peg_at=(0,), peg=PegOptions(separable=True)
    )
    assert {k for k in enc.state_dict() if ".pegs." in k} == {
        "aifi.0.pegs.0.proj_w.weight", "aifi.0.pegs.0.proj.weight", "aifi.0.pegs.0.proj.bias"}  # fmt: skip
    with pytest.raises(ValueError, match="RT-DETR's AIFI encoder has no table encoding 'sine'"):
        HybridEncoder([8, 8, 8], 32, pos_enc="sine")


def test_channels_last_input_gives_the_same_maps():
    torch.manual_seed(0)
    model = _small_ours("peg").eval()
    nn.init.normal_(model["encoder"].aifi[0].pegs["-1"].proj.weight, std=0.1)
    x = torch.randn(1, 3, 128, 192)
    with torch.no_grad():
        ref = _run(model, x)
        model = model.to(memory_format=torch.channels_last)
        out = _run(model, x.to(memory_format=torch.channels_last))
    for a, b in zip(out, ref):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert out[2].is_contiguous(memory_format=torch.channels_last)


def test_backbone_batch_norm_is_frozen_and_freeze_at():
    bb = build_resnet_vd("tiny")
    norms = [m for m in bb.modules() if isinstance(m, (FrozenBatchNorm2d, nn.BatchNorm2d))]
    assert norms and all(isinstance(m, FrozenBatchNorm2d) and m.eps == 1e-5 for m in norms)
    assert not any(p for m in norms for p in m.parameters())  # buffers only: nothing to train
    assert all(p.requires_grad for p in bb.parameters())  # freeze_at=-1: every conv trains
    before = {k: v.clone() for k, v in bb.state_dict().items() if "normalization" in k}
    bb.train()
    bb(torch.randn(2, 3, 64, 64))
    assert all(torch.equal(v, bb.state_dict()[k]) for k, v in before.items())  # no running stats update

    frozen = build_resnet_vd("tiny", freeze_at=2)
    trains = {n.split(".layers")[0] for n, p in frozen.named_parameters() if p.requires_grad}
    assert trains == {"encoder.stages.2", "encoder.stages.3"}
    assert not any(p.requires_grad for p in build_resnet_vd("tiny", freeze_at=0).embedder.parameters())
    trainable_bn = build_resnet_vd("tiny", freeze_bn=False)
    assert any(isinstance(m, nn.BatchNorm2d) for m in trainable_bn.modules())
    with pytest.raises(ValueError, match="depth must be one of"):
        ResNetVd(26)
    with pytest.raises(ValueError, match="out_strides"):
        ResNetVd(18, out_strides=(8, 64))


def test_backbone_strides_and_channels():
    bb = ResNetVd(50, out_strides=(4, 8, 16, 32), depths=(1, 1, 1, 1)).eval()
    assert bb.out_channels == [256, 512, 1024, 2048]
    with torch.no_grad():
        outs = bb(torch.randn(1, 3, 96, 160))
    assert [tuple(o.shape[1:]) for o in outs] == [
        (c, 96 // s, 160 // s) for c, s in zip(bb.out_channels, (4, 8, 16, 32))
    ]
