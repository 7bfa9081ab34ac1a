"""``peg_detr.interop``: one home for the outside formats, one RT-DETR config mapping, exports that take a model."""

from __future__ import annotations

import pytest
import torch

import peg_detr.models
import peg_detr.models.rtdetr
from peg_detr.interop import (
    FROM_HF,
    export_hf_detr,
    export_hf_rtdetr,
    rtdetr_build_options,
    rtdetr_from_hf_config,
    rtdetr_hf_config,
)
from peg_detr.models import build_detr
from peg_detr.models.rtdetr.build import build_rtdetr

SMALL = dict(hidden_dim=32, num_heads=2, enc_layers=1, dec_layers=1, dim_feedforward=64)


def test_models_reexport_no_loader():
    """Loaders and key maps live in peg_detr.interop only; the models package names none of them."""
    for name in ("load_official_checkpoint", "read_official_checkpoint", "LoadReport"):
        assert not hasattr(peg_detr.models, name), name
    for name in (
        "encoder_hf_keys",
        "decoder_key_from_hf",
        "backbone_kwargs_from_hf",
        "encoder_kwargs_from_hf",
    ):
        assert not hasattr(peg_detr.models.rtdetr, name), name
    assert {"detr", "rt_detr", "d_fine"} <= set(FROM_HF)


def test_rtdetr_config_written_is_the_config_read():
    """:func:`rtdetr_hf_config` writes what :func:`rtdetr_build_options` reads: the same model comes back."""
    torch.manual_seed(0)
    model, _, _ = build_rtdetr(
        "r18vd", "sincos", num_classes=3, hidden_dim=64, num_heads=2, dec_layers=1, dim_feedforward=64,
        num_queries=10,
    )  # fmt: skip
    config = rtdetr_hf_config(model, {0: "square"})
    assert config["backbone_config"]["out_indices"] == [2, 3, 4]
    assert config["backbone_config"]["out_features"] == ["stage2", "stage3", "stage4"]
    options = rtdetr_build_options(config)
    assert options["backbone"]["out_strides"] == list(model.backbone.out_strides)
    assert options["encoder"]["in_channels"] == list(model.encoder.hparams["in_channels"])
    assert options["decoder"]["num_classes"] == 3 and options["model"]["num_queries"] == 10
    back = rtdetr_from_hf_config(config)
    assert {k: v.shape for k, v in back.state_dict().items()} == {
        k: v.shape for k, v in model.state_dict().items()
    }


def test_exports_take_a_model_and_refuse_before_writing(tmp_path):
    with pytest.raises(TypeError, match="takes an RT-DETR"):
        export_hf_rtdetr(tmp_path / "checkpoint.pth", tmp_path / "out")
    peg, _, _ = build_detr("tiny", "peg", num_classes=2, num_queries=3, **SMALL)
    with pytest.raises(ValueError, match=r"^pos_enc 'peg' .*; backbone 'tiny'"):
        export_hf_detr(peg, tmp_path / "out")
    assert not (tmp_path / "out").exists()
