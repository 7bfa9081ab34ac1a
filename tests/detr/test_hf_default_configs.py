"""Read what transformers reads: the default config of every transformers detector class peg_detr reads,
written by ``save_pretrained``, and DETR folders with transformers' own ResNet backbone.

* ``DetrConfig(use_timm_backbone=False)`` (transformers' ResNet-50, every default) and a ResNet-18 one:
  ``peg_detr.from_hf`` gives ``DetrForObjectDetection``'s logits and boxes at a square and a
  non-square size (the ResNet's keys mapped to torchvision's);
* ``DFineConfig()`` / ``Deimv2Config()``: their ``backbone_config.hidden_sizes`` (256 for stage 1)
  differs from the stage widths only where no output is taken (stage 1, 128 wide): read, built and
  equal to transformers' model; a difference at an output stage is refused by name;
* ``DetrConfig()`` (timm ResNet-50) and ``RTDetrConfig()``: ``config.json`` alone (a default model's
  weights are tested elsewhere: ``test_hf_weights``, ``test_rtdetr_hf``), read into the builder's
  keywords.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from peg_core.interop import WeightsError
from peg_detr import from_hf
from peg_detr.interop import detr_build_options
from peg_detr.interop.hf_detr import hf_resnet_to_official
from peg_detr.interop.hf_rtdetr import rtdetr_build_options

transformers = pytest.importorskip("transformers")


@torch.no_grad()
def _randomise(model: torch.nn.Module, seed: int = 0) -> None:
    """Non-trivial frozen-norm statistics, affine terms and linear layers, so a mix-up shows in the outputs."""
    g = torch.Generator().manual_seed(seed)
    for name, buf in model.named_buffers():
        if name.endswith("running_mean"):
            buf.copy_(torch.randn(buf.shape, generator=g) * 0.1)
        elif name.endswith("running_var"):
            buf.copy_(torch.rand(buf.shape, generator=g) + 0.5)
    for name, p in model.named_parameters():
        if name.endswith(("reg_scale", ".up")):
            continue  # D-FINE's fixed constants
        if p.ndim == 1 and ("backbone" in name or "norm" in name):
            p.copy_(torch.randn(p.shape, generator=g) * 0.3 + (0.0 if name.endswith("bias") else 1.0))
        elif p.ndim == 2 and "backbone" not in name:  # init_std 0.02 leaves the outputs nearly constant
            p.copy_(torch.randn(p.shape, generator=g) * 0.25)


def _save(config, folder, seed=0):
    torch.manual_seed(seed)
    model = type_of(config)(config).eval()
    _randomise(model, seed)
    model.save_pretrained(folder)
    return model


def type_of(config):
    return {
        "detr": transformers.DetrForObjectDetection,
        "d_fine": transformers.DFineForObjectDetection,
        "deimv2": getattr(transformers, "Deimv2ForObjectDetection", None),
    }[config.model_type]


@torch.no_grad()
def _same(hf, ours, size, atol=1e-4, seed=1):
    x = torch.rand(1, 3, *size, generator=torch.Generator().manual_seed(seed))
    want, got = hf(pixel_values=x), ours(x)
    torch.testing.assert_close(got["pred_logits"], want.logits, atol=atol, rtol=0)
    torch.testing.assert_close(got["pred_boxes"], want.pred_boxes, atol=atol, rtol=0)
    return got["pred_logits"]


SMALL_TRANSFORMER = dict(
    d_model=32, encoder_layers=1, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
    encoder_ffn_dim=64, decoder_ffn_dim=64, num_queries=5, num_labels=3,
)  # fmt: skip


@pytest.mark.parametrize(
    "backbone, transformer",
    [
        ({}, {}),  # DetrConfig(use_timm_backbone=False): transformers' ResNet-50, every default
        (dict(layer_type="basic", depths=[2, 2, 2, 2], hidden_sizes=[64, 128, 256, 512]), SMALL_TRANSFORMER),
    ],
    ids=["default-resnet50", "resnet18"],
)
def test_detr_with_transformers_resnet_matches(tmp_path, backbone, transformer):
    config = transformers.DetrConfig(use_timm_backbone=False, **transformer)
    if backbone:
        config = transformers.DetrConfig(
            use_timm_backbone=False, backbone_config=transformers.ResNetConfig(out_features=["stage4"], **backbone),
            **transformer,
        )  # fmt: skip
    hf = _save(config, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["backbone_config"]["model_type"] == "resnet"
    with warnings.catch_warnings():  # "ResNet starts from random weights": the folder's follow
        warnings.simplefilter("ignore", UserWarning)
        ours, report = from_hf(tmp_path)
    name = "resnet18" if backbone else "resnet50"
    assert ours.build_config["backbone"] == name and not ours.build_config.get("dilation")
    assert not report.skipped and not report.converted and len(report.copied) == len(ours.state_dict())
    first = _same(hf, ours, (64, 64))
    second = _same(hf, ours, (64, 96))  # non-square
    assert (first.mean(1) - second.mean(1)).abs().max() > 1e-4  # the outputs depend on the input


def test_resnet_key_map():
    assert hf_resnet_to_official("embedder.embedder.convolution.weight") == "conv1.weight"
    assert hf_resnet_to_official("embedder.embedder.normalization.running_var") == "bn1.running_var"
    assert (
        hf_resnet_to_official("encoder.stages.0.layers.1.layer.2.normalization.bias") == "layer1.1.bn3.bias"
    )
    assert hf_resnet_to_official("encoder.stages.3.layers.0.shortcut.convolution.weight") == (
        "layer4.0.downsample.0.weight"
    )
    assert hf_resnet_to_official("encoder.stages.1.layers.0.shortcut.normalization.weight") == (
        "layer2.0.downsample.1.weight"
    )
    assert hf_resnet_to_official("layer1.0.conv1.weight") == "layer1.0.conv1.weight"  # timm's: unchanged


@pytest.mark.parametrize(
    "change, message",
    [
        ({"depths": [3, 4, 6, 4]}, "backbone_config.depths' must be a ResNet peg_detr builds"),
        ({"embedding_size": 32}, "backbone_config.embedding_size' must be 64"),
        ({"downsample_in_bottleneck": True}, "backbone_config.downsample_in_bottleneck' must be false"),
        ({"out_features": ["stage3"], "out_indices": [3]}, "a list ending with 'stage4'"),
        ({"hidden_act": "gelu"}, "backbone_config.hidden_act' must be one of 'relu'"),
    ],
)
def test_detr_resnet_configs_peg_detr_cannot_build_are_named(change, message):
    config = json.loads(transformers.DetrConfig(use_timm_backbone=False).to_json_string())
    config["backbone_config"].update(change)
    with pytest.raises(WeightsError, match=message):
        detr_build_options(config)


def test_default_detr_and_rtdetr_configs_are_read(tmp_path):
    """``DetrConfig()`` (timm ResNet-50) and ``RTDetrConfig()``: ``config.json`` as save_pretrained writes it."""
    transformers.DetrConfig().save_pretrained(tmp_path / "detr")
    options = detr_build_options(json.loads((tmp_path / "detr" / "config.json").read_text()))
    assert (options["backbone"], options["hidden_dim"], options["enc_layers"], options["num_queries"]) == (
        "resnet50", 256, 6, 100,
    )  # fmt: skip
    transformers.DetrConfig(use_timm_backbone=False, dilation=True).save_pretrained(tmp_path / "resnet")
    options = detr_build_options(json.loads((tmp_path / "resnet" / "config.json").read_text()))
    assert options["backbone"] == "resnet50" and options["dilation"] is False  # transformers ignores it there
    transformers.RTDetrConfig().save_pretrained(tmp_path / "rtdetr")
    options = rtdetr_build_options(json.loads((tmp_path / "rtdetr" / "config.json").read_text()))
    assert options["backbone"]["layer_type"] == "bottleneck" and options["backbone"]["depths"] == [3, 4, 6, 3]


@pytest.mark.slow  # two 30M-parameter models built and saved: ~10 s each on a CPU
@pytest.mark.parametrize("kind", ["d_fine", "deimv2"])
def test_default_dfine_and_deimv2_configs_load(tmp_path, kind):
    """The default ``DFineConfig()`` / ``Deimv2Config()`` (HGNetv2, ``hidden_sizes`` 256 at the unused stage 1)."""
    if kind == "deimv2" and not hasattr(transformers, "Deimv2Config"):
        pytest.skip("this transformers has no DEIMv2")
    config = transformers.DFineConfig() if kind == "d_fine" else transformers.Deimv2Config()
    assert config.backbone_config.hidden_sizes[0] != config.backbone_config.stage_out_channels[0]
    hf = _save(config, tmp_path)
    ours, report = from_hf(tmp_path)
    assert not report.skipped and not report.missing
    _same(hf, ours, (160, 160), atol=2e-4)  # 300 queries need 300 anchors: 20x20 + 10x10 + 5x5 cells
    saved = json.loads((tmp_path / "config.json").read_text())
    saved["backbone_config"]["hidden_sizes"][3] = 1024  # an output stage: the encoder would be misshapen
    (tmp_path / "config.json").write_text(json.dumps(saved))
    with pytest.raises(
        WeightsError, match=r"hidden_sizes' must be the widths of the output stages .* index 3"
    ):
        from_hf(tmp_path)
