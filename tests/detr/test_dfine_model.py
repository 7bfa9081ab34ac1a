"""peg_detr's D-FINE with RT-DETR's ``tiny`` ResNet-vd: the training outputs' contract, gradients,
any input size (anchors built per call), the builder's presets, the deployment fusion.  (What every
arch must do, the PEG starting as ``none``, the config rebuilding the model, the export with a dynamic
height and width: ``test_archs.py``.)"""

from __future__ import annotations

import pytest
import torch

from peg_core.errors import InputError
from peg_detr.models.dfine import DFINE_SIZES, build_dfine
from peg_detr.models.dfine.criterion import DFineCriterion

Q, C, BINS, LAYERS = 10, 3, 8, 3


def _build(pos_enc: str = "sincos", **overrides):
    torch.manual_seed(0)
    options = dict(
        num_classes=C, hidden_dim=32, num_heads=4, dec_layers=LAYERS, dim_feedforward=64, num_queries=Q,
        max_num_bins=BINS, num_denoising=8, encoder_expansion=0.5, depth_mult=0.34, num_points=[2, 3, 1],
        lqe_hidden_dim=16,
    )  # fmt: skip
    return build_dfine("tiny", pos_enc, **{**options, **overrides})


def _targets():
    return [
        {"labels": torch.tensor([0, 2]), "boxes": torch.tensor([[0.3, 0.3, 0.2, 0.2], [0.6, 0.5, 0.3, 0.4]])},
        {"labels": torch.tensor([1]), "boxes": torch.tensor([[0.5, 0.5, 0.5, 0.5]])},
    ]


def _randomise_heads(model):
    """Non-zero box heads, LQE and gates (their init is zero), so every output depends on its inputs."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(k in name for k in ("bbox_embed", "bbox_head", "reg_conf", "gateway")):
                p.normal_(0, 0.1)


def test_training_outputs_follow_the_contract():
    model, criterion, _ = _build()
    assert isinstance(criterion, DFineCriterion)
    _randomise_heads(model)
    model.train()
    out = model(torch.randn(2, 3, 96, 128), _targets())
    corners = 4 * (BINS + 1)
    assert out["pred_logits"].shape == (2, Q, C) and out["pred_boxes"].shape == (2, Q, 4)
    assert out["pred_corners"].shape == (2, Q, corners) and out["ref_points"].shape == (2, Q, 4)
    assert not out["ref_points"].requires_grad  # the detached reference of the corners
    assert out["up"].shape == (1,) and out["reg_scale"].shape == (1,)
    assert len(out["aux_outputs"]) == LAYERS - 1
    for aux in out["aux_outputs"]:
        assert aux["pred_corners"].shape == (2, Q, corners) and aux["ref_points"].shape == (2, Q, 4)
        assert aux["teacher_corners"] is out["pred_corners"] and aux["teacher_logits"] is out["pred_logits"]
    assert out["pre_outputs"]["pred_logits"].shape == (2, Q, C)
    assert out["pre_outputs"]["pred_boxes"].shape == (2, Q, 4)
    (enc,) = out["enc_aux_outputs"]
    assert enc["pred_logits"].shape == (2, Q, C) and enc["pred_boxes"].shape == (2, Q, 4)
    assert out["enc_meta"] == {"class_agnostic": False}
    meta = out["dn_meta"]
    n_dn = meta["dn_num_split"][0]
    assert meta["dn_num_split"] == [n_dn, Q] and meta["dn_num_group"] == n_dn // 4
    assert len(out["dn_outputs"]) == LAYERS
    for dn in out["dn_outputs"]:
        assert dn["pred_logits"].shape == (2, n_dn, C) and dn["pred_corners"].shape == (2, n_dn, corners)
        assert dn["teacher_corners"] is out["dn_outputs"][-1]["pred_corners"]
    assert out["dn_pre_outputs"]["pred_boxes"].shape == (2, n_dn, 4)
    # every layer's boxes are ref_points moved by the integral of its corners: finite, in cxcywh
    assert torch.isfinite(out["pred_boxes"]).all() and (out["pred_boxes"][..., 2:] > 0).all()

    losses = criterion(out, _targets())
    assert {"loss_vfl", "loss_bbox", "loss_giou", "loss_fgl", "loss_ddf_aux_0", "loss_vfl_pre",
            "loss_vfl_enc_0", "loss_fgl_dn_0"} <= set(losses)  # fmt: skip
    criterion.total(losses).backward()
    for name in ("backbone.embedder.embedder.0.convolution.weight", "encoder.input_proj.0.0.weight",
                 "encoder.fpn_blocks.0.conv4.conv.weight", "encoder.downsample_convs.0.conv2.conv.weight",
                 "decoder.enc_score_head.weight", "decoder.layers.0.encoder_attn.sampling_offsets.weight",
                 "decoder.layers.1.gateway.gate.weight", "decoder.pre_bbox_head.layers.0.weight",
                 "decoder.bbox_embed.0.layers.2.weight", "decoder.lqe_layers.2.reg_conf.layers.0.weight",
                 "denoising_class_embed.weight"):  # fmt: skip
        grad = dict(model.named_parameters())[name].grad
        assert grad is not None and grad.abs().sum() > 0, name
    assert not model.decoder.up.requires_grad and not model.decoder.reg_scale.requires_grad


@pytest.mark.parametrize("size", [(64, 64), (96, 160), (97, 71), (33, 200)])
def test_eval_at_any_size(size):
    model, _, _ = _build()
    _randomise_heads(model)
    model.eval()
    with torch.no_grad():
        out = model(torch.randn(2, 3, *size))
    assert set(out) == {"pred_logits", "pred_boxes"}
    assert out["pred_logits"].shape == (2, Q, C) and torch.isfinite(out["pred_boxes"]).all()


def test_anchors_follow_the_input_size():
    """With the encoder box head at its zero init the proposals ARE the anchors: on this call's grid."""
    model, _, _ = _build(num_denoising=0)
    assert not any("anchor" in k or "valid_mask" in k for k in model.state_dict())
    model.train()
    for h, w in [(64, 64), (96, 160), (64, 64), (70, 130)]:
        with torch.no_grad():
            boxes = model(torch.randn(1, 3, h, w))["enc_aux_outputs"][0]["pred_boxes"][0]
        for cx, cy, bw, _ in boxes.tolist():
            level = round(torch.log2(torch.tensor(bw / 0.05)).item())
            stride = 8 * 2**level
            gw, gh = -(-w // stride), -(-h // stride)  # ceil: the backbone's map sizes
            assert abs(cx * gw - 0.5 - round(cx * gw - 0.5)) < 1e-4, (h, w, cx)
            assert abs(cy * gh - 0.5 - round(cy * gh - 0.5)) < 1e-4, (h, w, cy)


def test_input_too_small_names_the_minimum():
    model, _, _ = _build(num_queries=300)
    side = model.min_input_side()
    with pytest.raises(InputError, match=f"at least {side} x {side}"):
        model.eval()(torch.randn(1, 3, side - 8, side - 8))


def test_presets_are_config_overrides():
    from dataclasses import fields

    from peg_detr.models.dfine import DFineConfig

    assert set(DFINE_SIZES) == {"n", "s", "m", "l", "x"}
    names = {f.name for f in fields(DFineConfig)}
    for size, preset in DFINE_SIZES.items():
        assert set(preset) <= names
        assert DFineConfig.preset(size).backbone == preset["backbone"]  # validated as a config


def test_fuse_for_deploy_folds_every_norm():
    """RT-DETR's deployment fusion takes D-FINE too: every conv + BN (SCDown's depthwise one included)."""
    from peg_detr.models.rtdetr import fuse_for_deploy

    model, _, _ = _build()
    _randomise_heads(model)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.normal_(0, 0.1)
                module.running_var.uniform_(0.5, 1.5)
                module.weight.uniform_(0.5, 1.5)
    model.eval()
    fused = fuse_for_deploy(model)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in fused.modules())
    x = torch.randn(1, 3, 96, 128)
    with torch.no_grad():
        a, b = model(x), fused(x)
    assert (a["pred_logits"] - b["pred_logits"]).abs().max() <= 1e-4
    assert (a["pred_boxes"] - b["pred_boxes"]).abs().max() <= 1e-4
