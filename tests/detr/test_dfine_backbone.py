"""HGNetv2 (D-FINE / DEIM / DEIMv2 backbone) from timm's modules against transformers' HGNetV2Backbone.

Random weights and random batch-norm statistics, mapped by :mod:`peg_detr.interop.hf_hgnetv2`:
the returned feature maps equal transformers' at a non-square and an odd size; every key maps
both ways; frozen norms and frozen stages freeze what they should; channels-last inputs give the
same maps; the presets are timm's layouts.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn
from torchvision.ops import FrozenBatchNorm2d

from peg_core.errors import MissingDependency
from peg_detr.interop.hf_hgnetv2 import (
    HF_BACKBONE_PREFIX,
    hgnetv2_hf_config,
    hgnetv2_hf_to_ours,
    hgnetv2_options_from_hf,
    hgnetv2_ours_to_hf,
)
from peg_detr.models.dfine.backbone import HGNETV2_BACKBONES, HGNetv2Backbone, build_hgnetv2

timm_hgnet = pytest.importorskip("timm.models.hgnet")
transformers = pytest.importorskip("transformers")

SIZES = [(96, 160), (97, 131)]  # non-square; odd (the stem's pad-and-pool and the strided convs)

# A tiny layout with every part HGNetv2 has: residual blocks (2 per stage), plain and light layers,
# kernels 3 and 5, a stage without downsampling; ~60 k parameters.
TINY = {
    "stem_channels": [3, 8, 12],
    "stage_in_channels": [12, 16, 24, 32],
    "stage_mid_channels": [8, 8, 12, 16],
    "stage_out_channels": [16, 24, 32, 48],
    "stage_num_blocks": [1, 2, 2, 1],
    "stage_downsample": [False, True, True, True],
    "stage_light_block": [False, False, True, True],
    "stage_kernel_size": [3, 3, 5, 5],
    "stage_numb_of_layers": [2, 2, 2, 2],
}


def _randomise(model: nn.Module, seed: int) -> None:
    """Random norm affines and statistics and LAB scalars (HF's init makes them identities)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if not t.is_floating_point():
                continue
            leaf = name.rsplit(".", 1)[-1]
            if "normalization" in name and leaf in ("weight", "running_var"):
                t.copy_(torch.rand(t.shape, generator=g) + 0.5)
            elif "normalization" in name or leaf == "bias":
                t.copy_(0.2 * torch.randn(t.shape, generator=g))
            elif leaf == "scale":
                t.copy_(torch.rand(t.shape, generator=g) + 0.5)


def _hf_backbone(seed: int, **fields) -> nn.Module:
    torch.manual_seed(seed)
    config = transformers.HGNetV2Config(out_indices=[2, 3, 4], **fields)
    model = transformers.HGNetV2Backbone(config).eval()
    _randomise(model, seed + 1)
    return model


def _ours_from_hf(hf: nn.Module, **overrides) -> HGNetv2Backbone:
    name, options = hgnetv2_options_from_hf(hf.config.to_dict())
    ours = build_hgnetv2(name, **{**options, **overrides}).eval()
    state = {hgnetv2_hf_to_ours(k): v for k, v in hf.state_dict().items()}
    assert None not in state
    ours.load_state_dict(state, strict=True)
    return ours


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    assert [x.shape for x in a] == [x.shape for x in b]
    return max((x - y).abs().max().item() for x, y in zip(a, b))


@pytest.mark.parametrize("use_lab", [True, False])
@pytest.mark.parametrize("freeze_bn", [False, True])
def test_tiny_equals_transformers(use_lab: bool, freeze_bn: bool) -> None:
    hf = _hf_backbone(0, **TINY, use_learnable_affine_block=use_lab)
    ours = _ours_from_hf(hf, freeze_bn=freeze_bn)
    assert ours.out_channels == [24, 32, 48] and ours.strides == [8, 16, 32]
    for i, (h, w) in enumerate(SIZES):
        x = torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(i))
        with torch.no_grad():
            ref = list(hf(x).feature_maps)
            got = ours(x)
        assert [r.shape[-2:] for r in ref] == [g.shape[-2:] for g in got]
        # measured: 0 with BatchNorm2d (the same kernels), <= 4e-7 with the frozen norm (maps ~1)
        assert _max_diff(ref, got) <= 1e-5


def test_b0_equals_transformers() -> None:
    # transformers' HGNetV2Config for D-FINE N / S (B0), ~1.8 M parameters.
    fields = {
        "stem_channels": [3, 16, 16],
        "stage_in_channels": [16, 64, 256, 512],
        "stage_mid_channels": [16, 32, 64, 128],
        "stage_out_channels": [64, 256, 512, 1024],
        "stage_num_blocks": [1, 1, 2, 1],
        "stage_numb_of_layers": [3, 3, 3, 3],
        "use_learnable_affine_block": True,
    }
    hf = _hf_backbone(3, **fields)
    name, _ = hgnetv2_options_from_hf(hf.config.to_dict())
    assert name == "hgnetv2_b0"
    ours = _ours_from_hf(hf)
    for h, w in SIZES:
        x = torch.randn(1, 3, h, w)
        with torch.no_grad():
            assert _max_diff(list(hf(x).feature_maps), ours(x)) <= 1e-5


def test_every_key_maps_both_ways() -> None:
    hf = _hf_backbone(0, **TINY, use_learnable_affine_block=True)
    ours = _ours_from_hf(hf, freeze_bn=False)  # trainable norms: num_batches_tracked as well
    hf_keys, our_keys = set(hf.state_dict()), set(ours.state_dict())
    assert {hgnetv2_hf_to_ours(k) for k in hf_keys} == our_keys
    assert {hgnetv2_ours_to_hf(k, prefix="") for k in our_keys} == hf_keys
    for k in hf_keys:
        assert hgnetv2_hf_to_ours(HF_BACKBONE_PREFIX + k) == hgnetv2_hf_to_ours(k)
        assert hgnetv2_ours_to_hf(hgnetv2_hf_to_ours(k)) == HF_BACKBONE_PREFIX + k
    # The rest of a detector is not the backbone's.
    for other in ("model.encoder.lateral_convs.0.conv.weight", "model.decoder.layers.0.fc1.weight",
                  "model.backbone.model.embedder.stem1.convolution.extra", "backbone.stem.stem1.conv.weight"):  # fmt: skip
        assert hgnetv2_hf_to_ours(other) is None
    assert hgnetv2_ours_to_hf("encoder.aifi.0.x.weight") is None


def test_keys_inside_dfine() -> None:
    """The backbone's keys inside ``DFineForObjectDetection`` sit under ``model.backbone.model.``."""
    backbone = transformers.HGNetV2Config(out_indices=[2, 3, 4], **TINY)
    config = transformers.DFineConfig(
        backbone_config=backbone, encoder_in_channels=[24, 32, 48], encoder_hidden_dim=32,
        encoder_ffn_dim=64, d_model=32, decoder_ffn_dim=64, decoder_layers=2, num_queries=10,
        num_labels=3, encoder_attention_heads=2, decoder_attention_heads=2,
    )  # fmt: skip
    keys = [k for k in transformers.DFineForObjectDetection(config).state_dict() if "backbone" in k]
    assert keys and all(k.startswith(HF_BACKBONE_PREFIX) for k in keys)
    ours = build_hgnetv2(None, **hgnetv2_options_from_hf(config.backbone_config.to_dict())[1], freeze_bn=True)
    assert {hgnetv2_hf_to_ours(k) for k in keys} == set(ours.state_dict())


def test_config_round_trip_and_refusals() -> None:
    hf = transformers.HGNetV2Config(out_indices=[3, 4], **TINY, use_learnable_affine_block=True)
    name, options = hgnetv2_options_from_hf(hf.to_dict())
    assert name is None and options["return_idx"] == [2, 3] and options["stem_channels"] == [8, 12]
    ours = build_hgnetv2(name, **options)
    back = hgnetv2_hf_config(ours.build_options)
    assert hgnetv2_options_from_hf(back) == (name, options)
    rebuilt = transformers.HGNetV2Config(**{k: v for k, v in back.items() if k != "model_type"})
    assert transformers.HGNetV2Backbone(rebuilt).channels == ours.out_channels
    assert build_hgnetv2(**ours.build_options).build_options == ours.build_options
    for bad in ({"hidden_act": "silu"}, {"stem_strides": [2, 1, 1, 1, 1]},
                {"stage_downsample_strides": [2, 3, 2, 2]}, {"out_indices": [0, 1]}):  # fmt: skip
        with pytest.raises(ValueError):
            hgnetv2_options_from_hf({**hf.to_dict(), **bad})


def test_presets_are_timms() -> None:
    in_timm = [n for n in HGNETV2_BACKBONES if n in timm_hgnet.model_cfgs]
    assert in_timm == [f"hgnetv2_b{i}" for i in range(6)]  # DEIMv2's atto / femto / pico are not timm's
    for name in in_timm:
        preset, cfg = HGNETV2_BACKBONES[name], timm_hgnet.model_cfgs[name]
        assert tuple(preset["stem_channels"]) == tuple(cfg["stem_chs"])
        assert [list(s) for s in preset["stages"]] == [cfg[f"stage{i}"] for i in range(1, 5)]
    # Our keys are timm's HighPerfGpuNet's without the classifier head.
    timm_keys = {k for k in timm_hgnet.HighPerfGpuNet(timm_hgnet.model_cfgs["hgnetv2_b0"], use_lab=True)
                 .state_dict() if not k.startswith("head.")}  # fmt: skip
    assert set(build_hgnetv2("hgnetv2_b0", freeze_bn=False).state_dict()) == timm_keys
    pico = build_hgnetv2("hgnetv2_pico", return_idx=(2,))
    assert pico.out_channels == [512] and pico.strides == [16]
    with pytest.raises(ValueError, match="unknown HGNetv2"):
        build_hgnetv2("hgnetv2_b9")


def _tiny_ours(**options) -> HGNetv2Backbone:
    _, spec = hgnetv2_options_from_hf({**TINY, "use_learnable_affine_block": True})
    return build_hgnetv2(None, **{**spec, **options})


def test_frozen_norms_and_stages() -> None:
    ours = _tiny_ours(freeze_bn=True, freeze_at=-1)
    assert not any(isinstance(m, nn.BatchNorm2d) for m in ours.modules())
    assert all(p.requires_grad for p in ours.parameters())
    before = {k: v.clone() for k, v in ours.state_dict().items()}
    x = torch.randn(2, 3, 64, 64)
    ours.train()
    out_train = ours(x)
    ours.eval()
    assert _max_diff(out_train, ours(x)) == 0  # the statistics are the stored ones in training too
    assert all(torch.equal(before[k], v) for k, v in ours.state_dict().items())

    for freeze_at in (0, 2):
        ours = _tiny_ours(freeze_bn=False, freeze_at=freeze_at)
        frozen = [ours.stem, *ours.stages[:freeze_at]]
        trained = list(ours.stages[freeze_at:])
        assert all(not p.requires_grad for m in frozen for p in m.parameters())
        assert all(p.requires_grad for m in trained for p in m.parameters())
        assert not any(isinstance(n, nn.BatchNorm2d) for m in frozen for n in m.modules())
        assert all(not isinstance(n, FrozenBatchNorm2d) for m in trained for n in m.modules())
        ours.train()
        stem_stats = {k: v.clone() for k, v in ours.stem.state_dict().items()}
        ours(x)[-1].sum().backward()
        assert all(torch.equal(stem_stats[k], v) for k, v in ours.stem.state_dict().items())
        assert all(p.grad is None for m in frozen for p in m.parameters())
    with pytest.raises(ValueError, match="freeze_at"):
        _tiny_ours(freeze_at=5)


def test_activation_option() -> None:
    """DEIMv2's ``act``: every activated layer (the ReLUs timm builds) takes the other activation."""
    relu, silu = _tiny_ours(), _tiny_ours(act="silu")
    n_relu = sum(isinstance(m, nn.ReLU) for m in relu.modules())
    assert n_relu > 0 and not any(isinstance(m, nn.ReLU) for m in silu.modules())
    assert sum(isinstance(m, nn.SiLU) for m in silu.modules()) == n_relu
    assert set(silu.state_dict()) == set(relu.state_dict())
    with pytest.raises(ValueError, match="no transformers config"):
        hgnetv2_hf_config(silu.build_options)
    with pytest.raises(ValueError, match="activation"):
        _tiny_ours(act="tanh")


def test_channels_last_and_return_idx() -> None:
    ours = _tiny_ours(return_idx=(2, 3)).eval()
    assert ours.out_channels == [32, 48] and ours.strides == [16, 32]
    x = torch.randn(2, 3, 97, 131)
    with torch.no_grad():
        ref = ours(x)
        got = ours(x.contiguous(memory_format=torch.channels_last))
    assert _max_diff(ref, got) <= 1e-5


def test_timm_is_optional(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "timm.models.hgnet", None)
    with pytest.raises(MissingDependency, match=r"peg-detr\[timm\]"):
        build_hgnetv2("hgnetv2_b0")
    code = (
        "import sys, peg_detr, peg_detr.models.dfine.backbone, peg_detr.interop.hf_hgnetv2; "
        "print('timm' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
