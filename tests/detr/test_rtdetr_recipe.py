"""RT-DETR's recipe details: the AdamW groups of lyuwenyu/RT-DETR's 6x configs."""

from __future__ import annotations

import pytest
from torch import nn

from peg_detr.configs import CONFIGS
from peg_detr.models.rtdetr.build import build_rtdetr
from peg_detr.task import rtdetr_optimizer_groups

_SMALL = {"hidden_dim": 32, "num_heads": 2, "dim_feedforward": 64, "dec_layers": 1, "num_queries": 10,
          "num_denoising": 5, "encoder_expansion": 0.5}  # fmt: skip


def _groups_by_name(model: nn.Module) -> dict[str, tuple[str, float, float | None]]:
    groups = rtdetr_optimizer_groups(model, lr_backbone=1e-5, weight_decay=1e-4)
    ids = {id(p): n for n, p in model.named_parameters()}
    return {ids[id(p)]: (g["name"], g["weight_decay"], g.get("lr")) for g in groups for p in g["params"]}


@pytest.mark.parametrize("backbone", ["r18vd", "tiny"])
def test_groups_follow_rtdetr_r18vd_trainable_backbone_norms(backbone):
    model, _, _ = build_rtdetr(backbone, "peg", **_SMALL)  # R18vd: trainable backbone BN
    got = _groups_by_name(model)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert set(got) == trainable  # each trainable parameter once
    backbone_bn = "backbone.embedder.embedder.0.normalization"
    assert got["backbone.embedder.embedder.0.convolution.weight"] == ("backbone", 1e-4, 1e-5)
    assert got[f"{backbone_bn}.weight"] == got[f"{backbone_bn}.bias"] == ("backbone_no_decay", 0.0, 1e-5)
    # encoder / decoder: weights decayed at the main lr; biases and every norm's parameters not,
    # the BatchNorm / LayerNorm inside Sequentials (``input_proj.0.1``, ``enc_output.1``) included
    for name in (
        "encoder.input_proj.0.0.weight",
        "decoder.enc_output.0.weight",
        "denoising_class_embed.weight",
    ):
        assert got[name] == ("main", 1e-4, None), name
    for name in ("encoder.input_proj.0.1.weight", "encoder.input_proj.0.1.bias", "decoder.enc_output.0.bias",
                 "decoder.enc_output.1.weight", "decoder.enc_output.1.bias"):  # fmt: skip
        assert got[name] == ("main_no_decay", 0.0, None), name
    pegs = [n for n in got if ".pegs." in n]
    assert pegs and all(got[n][1] == (0.0 if n.endswith("bias") else 1e-4) for n in pegs)
    assert all(got[n][1] == 0.0 for n in got if "norm" in n)


def test_groups_of_r50vd_frozen_backbone_norms():
    model, _, _ = build_rtdetr("r50vd", "sincos", **_SMALL)
    got = _groups_by_name(model)
    backbone = {n: g for n, g in got.items() if n.startswith("backbone.")}
    assert backbone and all(g == ("backbone", 1e-4, 1e-5) for g in backbone.values())  # BN: buffers
    assert not any("normalization" in n for n in backbone)


def test_recipes_train_the_backbone_at_the_published_lr():
    for name in ("rtdetr_r18vd_6x", "rtdetr_r50vd_6x", "rtdetr_r18vd_6x_peg", "rtdetr_r50vd_6x_peg"):
        assert (CONFIGS[name]["lr"], CONFIGS[name]["lr_backbone"], CONFIGS[name]["weight_decay"]) == (
            1e-4,
            1e-5,
            1e-4,
        )
