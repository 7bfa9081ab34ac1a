"""DEIMv2 from transformers' ``Deimv2ForObjectDetection`` folders: the same logits and boxes.

Three randomly initialised tiny models (every parameter and batch-norm statistic perturbed, so no
zero-initialised head hides a mismatch), written with ``save_pretrained`` and read back by
:func:`peg_detr.interop.hf_deimv2.deimv2_from_hf`:

* the DINOv3 variant (a 3-block DINOv3 ViT with registers and layer scale, the STA, the hybrid
  encoder with sum fusion and no trailing CSP conv, the gated decoder);
* HGNetv2 + the lite encoder (atto / femto / pico: shared box head, no gateway, 2 levels);
* HGNetv2 + the 2-level hybrid encoder (N: the trailing CSP conv, AIFI with the sin-cos table).

Each is compared at a square and a non-square size: the backbone maps, the encoder maps and the
encoder's pre-top-k class scores (which decide the query selection), then the final logits and
boxes.  On random weights two cells could tie in the top-k and make the two implementations pick
different queries; the pre-top-k scores are compared first so a tie would show up as equal
scores with different outputs rather than as a silent mismatch (none occurs at these seeds).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from peg_core.interop.io import WeightsError
from peg_detr.interop.hf_deimv2 import (
    deimv2_build_options,
    deimv2_from_hf,
    deimv2_from_hf_config,
    export_hf_deimv2,
)
from peg_detr.models.deimv2 import build_deimv2
from peg_detr.models.deimv2.backbone import IMAGENET_MEAN, IMAGENET_STD

transformers = pytest.importorskip("transformers")
pytest.importorskip("timm.models.hgnet")

TOL = 1e-4
SIZES = [(64, 64), (64, 96)]  # square; non-square


def _hf_pixels(x: torch.Tensor, kind: str = "dinov3") -> torch.Tensor:
    """What transformers' model takes for our ``x``: the DINOv3 sizes standardise their input inside
    peg_detr's backbone (pixels in [0, 1] in), in transformers' image processor (normalised in)."""
    if kind not in ("dinov3", "built"):
        return x
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in (IMAGENET_MEAN, IMAGENET_STD))
    return (x - mean) / std


HGNET = dict(
    stem_channels=[3, 8, 12], stage_in_channels=[12, 16, 24, 32], stage_mid_channels=[8, 8, 12, 16],
    stage_out_channels=[16, 24, 32, 48], hidden_sizes=[16, 24, 32, 48], stage_num_blocks=[1, 2, 2, 1],
    stage_downsample=[False, True, True, True], stage_light_block=[False, False, True, True],
    stage_kernel_size=[3, 3, 5, 5], stage_numb_of_layers=[2, 2, 2, 2],
)  # fmt: skip
COMMON = dict(
    encoder_hidden_dim=32, d_model=32, decoder_ffn_dim=64, decoder_attention_heads=2, decoder_layers=2,
    num_queries=20, num_labels=5,
)  # fmt: skip


def _config(kind: str):
    if kind == "dinov3":
        vit = transformers.DINOv3ViTConfig(
            hidden_size=32, num_hidden_layers=3, num_attention_heads=2, intermediate_size=64, patch_size=16,
            num_register_tokens=2, out_indices=[1, 2, 3], apply_layernorm=False, layerscale_value=0.5,
        )  # fmt: skip
        return transformers.Deimv2Config(
            backbone_config=vit, encoder_in_channels=[32] * 3, decoder_in_channels=[32] * 3, encoder_ffn_dim=64,
            encoder_attention_heads=2, spatial_tuning_adapter_inplanes=8, encoder_has_trailing_conv=False,
            depth_mult=0.34, **COMMON,
        )  # fmt: skip
    if kind == "lite":
        hg = transformers.HGNetV2Config(out_indices=[3], use_learnable_affine_block=True, **HGNET)
        return transformers.Deimv2Config(
            backbone_config=hg, encoder_type="lite", encoder_in_channels=[32], feat_strides=[16],
            decoder_in_channels=[32, 32], num_feature_levels=2, decoder_n_points=[4, 2], share_bbox_head=True,
            use_gateway=False, hidden_expansion=0.34, depth_mult=0.5, **COMMON,
        )  # fmt: skip
    hg = transformers.HGNetV2Config(out_indices=[3, 4], **HGNET)
    return transformers.Deimv2Config(
        backbone_config=hg, encoder_in_channels=[32, 48], feat_strides=[16, 32], encode_proj_layers=[1],
        decoder_in_channels=[32, 32], num_feature_levels=2, decoder_n_points=[6, 6], encoder_ffn_dim=64,
        encoder_attention_heads=2, hidden_expansion=0.34, depth_mult=0.5, **COMMON,
    )  # fmt: skip


@torch.no_grad()
def _randomise(model: torch.nn.Module, seed: int) -> None:
    """Perturb every parameter (zero-initialised heads included) and every batch-norm statistic."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith(("reg_scale", ".up")):
            continue  # FDR's fixed constants
        p.add_(torch.randn(p.shape, generator=g) * 0.1)
    for name, b in model.named_buffers():
        if name.endswith("running_var"):
            b.copy_(torch.rand(b.shape, generator=g) + 0.5)
        elif name.endswith("running_mean"):
            b.copy_(torch.randn(b.shape, generator=g) * 0.1)


def _max(a, b) -> float:
    assert [x.shape for x in a] == [x.shape for x in b]
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


@pytest.mark.parametrize("kind", ["dinov3", "lite", "n"])
def test_deimv2_from_hf_matches_transformers(kind: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    hf = transformers.Deimv2ForObjectDetection(_config(kind)).eval()
    _randomise(hf, 1)
    hf.save_pretrained(tmp_path)
    ours, report = deimv2_from_hf(tmp_path)
    assert not ours.training
    # DINOv3's pretraining mask token has no use in a detector
    assert set(report.skipped) <= {"model.conv_encoder.backbone.embeddings.mask_token"}
    assert not report.converted
    g = torch.Generator().manual_seed(2)
    for size in SIZES:
        x = torch.randn(2, 3, *size, generator=g)
        with torch.no_grad():
            # transformers' backbone output includes the input projections (ours: the encoder's)
            feats_hf = hf.model.conv_encoder(_hf_pixels(x, kind))
            feats = ours.backbone(x)
            projected = [proj(f) for proj, f in zip(ours.encoder.input_proj, feats)] if kind == "n" else feats
            assert _max(feats_hf, projected) <= TOL, "backbone maps"
            enc_hf = hf.model.encoder([f.clone() for f in feats_hf]).feature_maps
            enc = ours.encoder(feats)
            assert _max(enc_hf, enc) <= TOL, "encoder maps"
            # the query selection's input: the class scores of every cell before top-k
            out_hf = hf(pixel_values=_hf_pixels(x, kind))
            memory, shapes = ours.decoder.flatten_features(enc)
            _, cell_logits, _ = ours.decoder.score_cells(memory, shapes)
            assert _max([out_hf.enc_outputs_class], [cell_logits]) <= TOL, "pre-top-k scores"
            out = ours(x)
        assert out["pred_logits"].std() > 1e-2 and out["pred_boxes"].std() > 1e-3  # not a degenerate output
        assert _max([out_hf.logits], [out["pred_logits"]]) <= TOL, f"logits at {size}"
        assert _max([out_hf.pred_boxes], [out["pred_boxes"]]) <= TOL, f"boxes at {size}"


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("decoder_method", "discrete", "decoder_method"),
        ("d_model", 64, "d_model"),
        ("eval_idx", 0, "eval_idx"),
        ("encoder_fuse_op", "max", "encoder_fuse_op"),
    ],
)
def test_config_fields_peg_detr_lacks_are_refused_by_name(field: str, value, named: str) -> None:
    config = _config("dinov3").to_dict()
    config[field] = value
    with pytest.raises(WeightsError, match=named):
        deimv2_build_options(config, where="config.json")


def test_gated_dinov3_mlp_is_refused_and_config_rebuilds() -> None:
    config = json.loads(json.dumps(_config("dinov3").to_dict()))  # as read from config.json
    model = deimv2_from_hf_config(config, "peg", peg_kernel_size=5)
    assert json.loads(json.dumps(model.build_config)) == model.build_config
    assert model.build_config["hf_config"] == config
    assert model.encoder.aifi[0].pegs["-1"].proj.kernel_size == (5, 5)
    config["backbone_config"]["use_gated_mlp"] = True
    with pytest.raises(WeightsError, match="use_gated_mlp"):
        deimv2_build_options(config)


@pytest.mark.parametrize("kind", ["dinov3", "lite", "n"])
def test_export_hf_round_trip_through_transformers(kind: str, tmp_path: Path) -> None:
    """A DEIMv2 read from a folder, perturbed (so nothing stays at its initial value), written back by
    :func:`export_hf_deimv2` and loaded by transformers' ``from_pretrained``: the same logits and boxes."""
    torch.manual_seed(0)
    hf = transformers.Deimv2ForObjectDetection(_config(kind)).eval()
    _randomise(hf, 4)
    hf.save_pretrained(tmp_path / "in")
    ours, _ = deimv2_from_hf(tmp_path / "in")
    ours.build_config = {}  # export from the modules, not from the folder's config
    _randomise(ours, 5)
    export_hf_deimv2(ours, tmp_path / "out", {0: "cat"})
    back = transformers.Deimv2ForObjectDetection.from_pretrained(tmp_path / "out").eval()
    assert back.config.id2label[0] == "cat"
    x = torch.randn(1, 3, 64, 96, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        a, b = ours(x), back(pixel_values=_hf_pixels(x, kind))
    assert _max([a["pred_logits"]], [b.logits]) <= TOL and _max([a["pred_boxes"]], [b.pred_boxes]) <= TOL


def test_export_hf_of_a_model_built_here(tmp_path: Path) -> None:
    """``build_deimv2``'s DINOv3 variant (DEIMv2's distilled-ViT layout: no registers, no layer scale, a
    trained key bias) written by :func:`export_hf_deimv2` and read by transformers: the same outputs."""
    torch.manual_seed(0)
    vit = dict(embed_dim=32, depth=4, num_heads=2)
    model, _, _ = build_deimv2(
        "vit_tiny", hidden_dim=32, num_heads=2, dec_heads=2, enc_dim_feedforward=64, dim_feedforward=64,
        dec_layers=2, num_queries=20, num_classes=5, vit_options=vit, vit_out_indices=[0, 1, 2], sta_inplanes=8,
    )  # fmt: skip
    _randomise(model, 7)
    model.eval()
    export_hf_deimv2(model, tmp_path)
    back = transformers.Deimv2ForObjectDetection.from_pretrained(tmp_path).eval()
    assert back.config.backbone_config.key_bias  # the perturbed key bias is written, not dropped
    x = torch.randn(1, 3, 96, 64, generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        a, b = model(x), back(pixel_values=_hf_pixels(x, "built"))
    assert _max([a["pred_logits"]], [b.logits]) <= TOL and _max([a["pred_boxes"]], [b.pred_boxes]) <= TOL
