"""DEIMv2 built by ``build_deimv2``: the D-FINE output contract, D-FINE's criterion, gradients, any input size.

Tiny models (hidden 32, 2 decoder layers, 20 queries): the DINOv3 + STA + hybrid encoder variant,
HGNetv2 + lite encoder (atto / femto / pico layout: shared box head, no gateway) and HGNetv2 +
2-level hybrid encoder (N).  transformers parity is ``test_deimv2_hf.py``'s; the PEG starting as
``none``, the config rebuilding the model and the export with a dynamic batch and size: ``test_archs.py``.
"""

from __future__ import annotations

import pytest
import torch

from peg_core.errors import InputError
from peg_detr.models.deimv2 import DEIMV2_SIZES, DEIMv2, build_deimv2

TINY = dict(
    hidden_dim=32, num_heads=2, dec_heads=2, enc_dim_feedforward=64, dim_feedforward=64, dec_layers=2,
    num_queries=20, num_classes=5, num_denoising=10,
)  # fmt: skip
VIT = dict(vit_options=dict(embed_dim=32, depth=4, num_heads=2, num_reg_tokens=2), vit_out_indices=[0, 1, 2],
           sta_inplanes=8)  # fmt: skip
# a tiny HGNetv2 layout (stem (mid, out); stages (in, mid, out, blocks, downsample, light, kernel, layers))
HGNET = dict(stem_channels=[8, 12], stages=[[12, 8, 16, 1, False, False, 3, 2], [16, 8, 24, 1, True, False, 3, 2],
                                            [24, 12, 32, 1, True, True, 5, 2], [32, 16, 48, 1, True, True, 5, 2]])  # fmt: skip
CONTRACT_TRAIN = {
    "pred_logits", "pred_boxes", "pred_corners", "ref_points", "up", "reg_scale", "aux_outputs", "pre_outputs",
    "enc_aux_outputs", "enc_meta", "dn_outputs", "dn_pre_outputs", "dn_meta",
}  # fmt: skip
LAYER_KEYS = {"pred_logits", "pred_boxes", "pred_corners", "ref_points", "teacher_corners", "teacher_logits"}


def _targets() -> list[dict[str, torch.Tensor]]:
    return [
        {"labels": torch.tensor([1, 3]), "boxes": torch.tensor([[0.5, 0.5, 0.3, 0.2], [0.3, 0.6, 0.2, 0.3]])},
        {"labels": torch.tensor([0]), "boxes": torch.tensor([[0.4, 0.4, 0.2, 0.4]])},
    ]


def _dinov3(**kw):
    torch.manual_seed(0)
    return build_deimv2("vit_tiny", **{**TINY, **VIT, **kw})


def _hgnet(encoder: str, **kw):
    pytest.importorskip("timm.models.hgnet")
    torch.manual_seed(0)
    opts = dict(backbone="hgnetv2_custom", hgnet_options=HGNET, encoder=encoder, trailing_conv=True)
    if encoder == "lite":
        opts.update(
            hgnet_return_idx=[2], num_points=[4, 2], share_bbox_head=True, use_gateway=False, pos_enc="none"
        )
    else:
        opts.update(hgnet_return_idx=[2, 3], num_points=[6, 6])
    return build_deimv2(**{**TINY, **opts, **kw})


@pytest.mark.parametrize("variant", ["dinov3", "lite", "n"])
def test_training_outputs_follow_the_dfine_contract_and_train(variant: str) -> None:
    encoder = "lite" if variant == "lite" else "hybrid"
    model, criterion, _ = _dinov3() if variant == "dinov3" else _hgnet(encoder)
    assert isinstance(model, DEIMv2)
    model.train()
    out = model(torch.randn(2, 3, 64, 96), _targets())
    assert set(out) == CONTRACT_TRAIN
    b, q, c, bins = 2, 20, 5, 4 * (32 + 1)
    assert out["pred_logits"].shape == (b, q, c) and out["pred_boxes"].shape == (b, q, 4)
    assert out["pred_corners"].shape == (b, q, bins) and out["ref_points"].shape == (b, q, 4)
    assert len(out["aux_outputs"]) == 1 and len(out["dn_outputs"]) == 2 and len(out["enc_aux_outputs"]) == 1
    for layer in out["aux_outputs"] + out["dn_outputs"]:
        assert set(layer) == LAYER_KEYS
    assert torch.equal(out["aux_outputs"][0]["teacher_corners"], out["pred_corners"])  # the last layer
    assert out["enc_meta"] == {"class_agnostic": False}
    assert set(out["pre_outputs"]) == {"pred_logits", "pred_boxes"}
    losses = criterion(out, _targets())
    assert "loss_mal" in losses and "loss_fgl" in losses and "loss_ddf_aux_0" in losses
    total = criterion.total(losses)
    assert torch.isfinite(total)
    total.backward()
    named = dict(model.named_parameters())
    fpn = "encoder.fpn_block" if variant == "lite" else "encoder.fpn_blocks.0"
    must = [f"{fpn}.csp_rep2.bottlenecks.0.conv1.conv.weight", "decoder.layers.0.mlp.gate_proj.weight",
            "decoder.layers.1.encoder_attn.sampling_offsets.weight", "decoder.enc_score_head.weight",
            "decoder.pre_bbox_head.layers.2.weight", "decoder.bbox_embed.0.layers.2.weight",
            "decoder.lqe_layers.1.reg_conf.layers.1.weight", "denoising_class_embed.weight"]  # fmt: skip
    # (zero-initialised heads: their last layers get gradients, the layers before them only after a step)
    if variant == "dinov3":
        must += ["backbone.vit.blocks.0.attn.qkv.weight", "backbone.vit.blocks.2.mlp.fc2.weight",
                 "backbone.vit.reg_token", "backbone.spatial_tuning_adapter.conv4.conv.weight",
                 "backbone.fusion_proj.2.conv.weight", "encoder.aifi.0.layers.0.self_attn.q_proj.weight"]  # fmt: skip
    elif variant == "n":
        must += ["encoder.input_proj.0.conv.weight", "backbone.stages.3.blocks.0.aggregation.0.conv.weight"]
    else:
        must += ["encoder.bi_fusion_conv.conv.weight", "decoder.layers.0.encoder_attn_layer_norm.weight"]
    for name in must:
        grad = named[name].grad
        assert grad is not None and grad.abs().sum() > 0, name


def test_eval_runs_at_several_sizes_and_batches_of_different_sizes() -> None:
    model, _, _ = _dinov3()
    model.eval()
    with torch.no_grad():
        for h, w in [(64, 64), (96, 64), (80, 112), (72, 100), (130, 70)]:  # not all multiples of 16 or 32
            out = model(torch.randn(1, 3, h, w))
            assert set(out) == {"pred_logits", "pred_boxes"}
            assert out["pred_boxes"].shape == (1, 20, 4) and torch.isfinite(out["pred_logits"]).all()
        out = model([torch.randn(3, 64, 80), torch.randn(3, 96, 64)])  # padded into one batch
    assert out["pred_logits"].shape == (2, 20, 5)


def test_lite_variant_shares_one_box_head_and_runs_at_other_sizes() -> None:
    model, _, _ = _hgnet("lite")
    heads = model.decoder.bbox_embed
    assert all(h is heads[0] for h in heads)
    assert model.feature_strides == [16, 32]
    model.eval()
    with torch.no_grad():
        for h, w in [(64, 64), (96, 128), (80, 112)]:
            assert model(torch.randn(1, 3, h, w))["pred_boxes"].shape == (1, 20, 4)


def test_published_sizes_and_refusals() -> None:
    assert {"atto", "femto", "pico", "n", "s", "m", "l"} <= set(DEIMV2_SIZES)
    model, _, _ = build_deimv2(**{**DEIMV2_SIZES["s"], "num_denoising": 0})
    assert model.decoder.hidden_dim == 192 and len(model.decoder.layers) == 4
    assert model.backbone.vit.embed_dim == 192 and model.backbone.out_indices == [5, 8, 11]
    with pytest.raises(ValueError, match="unknown DEIMv2 backbone"):
        build_deimv2("resnet50")
    with pytest.raises(ValueError, match="hybrid encoder"):
        build_deimv2("vit_tiny", "none", encoder="lite")
    with pytest.raises(ValueError, match="no position encoding"):
        _hgnet("lite", pos_enc="peg")
    small, _, _ = _dinov3()
    with pytest.raises(InputError, match="too small"):
        small.eval()(torch.randn(1, 3, 16, 16))


#: DEIMv2's published parameter counts (README, millions)
PUBLISHED_PARAMS = {"atto": 0.5, "femto": 1.0, "pico": 1.5, "n": 3.6, "s": 9.7, "m": 18.1, "l": 32.2}


@pytest.mark.parametrize("size", sorted(PUBLISHED_PARAMS))
def test_published_sizes_have_the_published_parameter_counts(size: str) -> None:
    """Within 5 % of DEIMv2's README (the presets' widths, depths and heads are the released configs')."""
    if DEIMV2_SIZES[size]["backbone"].startswith("hgnetv2"):
        pytest.importorskip("timm.models.hgnet")
    model, _, _ = build_deimv2(**DEIMV2_SIZES[size])
    millions = sum(p.numel() for p in model.parameters()) / 1e6
    assert abs(millions / PUBLISHED_PARAMS[size] - 1) < 0.05, millions
