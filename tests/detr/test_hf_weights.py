"""Hugging Face DETR weights: load a ``save_pretrained`` folder into peg_detr, and ``export-hf`` back.

A randomly initialised ``transformers.DetrForObjectDetection`` (timm ResNet-50 backbone, small
transformer) must give the same logits and boxes as the peg_detr ``sine`` model it is loaded
into, at a square and a non-square size; the exported folder must load in transformers and
give the peg_detr outputs again.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from peg_core.interop import WeightsError
from peg_detr.__main__ import main as cli
from peg_detr.interop import hf_to_official, load_official_checkpoint, official_to_hf, read_hf_state
from peg_detr.models import build_detr

pytestmark = pytest.mark.slow  # ResNet-50 forwards at 320x320 / 256x384 (~30 s CPU for the file)

SMALL = dict(hidden_dim=32, num_heads=2, enc_layers=1, dec_layers=2, dim_feedforward=64)
SIZES = [(320, 320), (256, 384)]


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing may be downloaded


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.DetrConfig(
        use_timm_backbone=True, backbone="resnet50", use_pretrained_backbone=False, d_model=32,
        encoder_layers=1, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
        encoder_ffn_dim=64, decoder_ffn_dim=64, num_queries=5, num_labels=3,
    )  # fmt: skip
    model = transformers.DetrForObjectDetection(config).eval()
    with torch.no_grad():  # non-trivial frozen-BN statistics and affine terms, so a mix-up shows
        for name, buf in model.named_buffers():
            if name.endswith("running_mean"):
                buf.normal_(0.0, 0.1)
            elif name.endswith("running_var"):
                buf.uniform_(0.5, 1.5)
        for name, p in model.named_parameters():
            if p.ndim == 1 and ("backbone" in name or "norm" in name):  # affine terms away from (1, 0)
                p.normal_(0.0 if name.endswith("bias") else 1.0, 0.3)
            elif p.ndim == 2 and "backbone" not in name:  # init_std 0.02 leaves outputs nearly constant
                p.normal_(0.0, 0.25)
    out = tmp_path_factory.mktemp("hf") / "detr"
    model.save_pretrained(out)
    return out, model


def _peg_sine():
    with warnings.catch_warnings():  # "ResNet starts from random weights"
        warnings.simplefilter("ignore", UserWarning)
        model, _, _ = build_detr("resnet50", "sine", num_classes=3, num_queries=5, **SMALL)
    return model.eval()


@torch.no_grad()
def _assert_same_outputs(hf_model, peg_model) -> None:
    gen = torch.Generator().manual_seed(1)
    previous = None
    for h, w in SIZES:
        x = torch.randn(1, 3, h, w, generator=gen)
        ref = hf_model(pixel_values=x)
        out = peg_model(x)
        assert out["pred_logits"].shape == ref.logits.shape == (1, 5, 4)
        torch.testing.assert_close(out["pred_logits"], ref.logits, atol=1e-4, rtol=0)
        torch.testing.assert_close(out["pred_boxes"], ref.pred_boxes, atol=1e-4, rtol=0)
        if previous is not None:  # the outputs depend on the image: the comparison is not vacuous
            assert (out["pred_logits"] - previous).abs().max() > 1e-3
        previous = out["pred_logits"]


def test_hf_folder_loads_with_same_outputs(hf_dir, capsys):
    path, hf_model = hf_dir
    model = _peg_sine()
    report = load_official_checkpoint(model, path)
    assert report.args["model_type"] == "detr" and not report.skipped and not report.converted
    assert len(report.copied) == len(model.state_dict())
    _assert_same_outputs(hf_model, model)


def test_weights_files_and_in_memory_names(hf_dir, tmp_path):
    path, hf_model = hf_dir
    from_folder = _peg_sine()
    load_official_checkpoint(from_folder, path)
    # the safetensors file alone
    direct = _peg_sine()
    load_official_checkpoint(direct, path / "model.safetensors")
    # a pytorch_model.bin in transformers 5's in-memory names (model.backbone.model.*)
    state = hf_model.state_dict()
    assert any(k.startswith("model.backbone.model.") for k in state)
    torch.save(state, tmp_path / "pytorch_model.bin")
    from_bin = _peg_sine()
    load_official_checkpoint(from_bin, tmp_path / "pytorch_model.bin")
    ref = from_folder.state_dict()
    for other in (direct, from_bin):
        for k, v in other.state_dict().items():
            assert torch.equal(v, ref[k]), k
    # the file's names (the hub's layout) and the in-projection concatenation
    disk, _ = read_hf_state(path)
    assert "model.backbone.conv_encoder.model.layer1.0.downsample.1.running_var" in disk
    mapped = hf_to_official(disk)
    q, k, v = (disk[f"model.encoder.layers.0.self_attn.{n}_proj.weight"] for n in "qkv")
    assert torch.equal(mapped["transformer.encoder.layers.0.self_attn.in_proj_weight"], torch.cat([q, k, v]))
    assert torch.equal(mapped["backbone.0.body.layer1.0.downsample.0.weight"],
                       disk["model.backbone.conv_encoder.model.layer1.0.downsample.0.weight"])  # fmt: skip
    assert official_to_hf(mapped).keys() == disk.keys()


def test_export_hf_round_trip(hf_dir, tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    path, _ = hf_dir
    model = _peg_sine()
    load_official_checkpoint(model, path)
    with torch.no_grad():  # move away from the loaded weights, so the export carries peg_detr's own
        model.class_embed.bias.add_(0.5)
        model.transformer.encoder.layers[0].self_attn.in_proj_bias.normal_(0, 0.2)
    ckpt = tmp_path / "checkpoint.pth"
    cats = [{"id": 0, "name": "square"}, {"id": 1, "name": "disc"}, {"id": 2, "name": "triangle"}]
    torch.save({"task": "detect", "model": model.state_dict(), "model_config": model.build_config,
                "meta": {"categories": cats}}, ckpt)  # fmt: skip
    assert model.build_config["aux_loss"]  # exported as auxiliary_loss=False (see peg_detr.interop.hf_detr)
    assert cli(["export-hf", str(ckpt), str(tmp_path / "hf")]) == 0
    assert "model.safetensors" in capsys.readouterr().out
    exported = transformers.DetrForObjectDetection.from_pretrained(tmp_path / "hf").eval()
    assert exported.config.id2label == {0: "square", 1: "disc", 2: "triangle"}
    assert exported.config.auxiliary_loss is False
    _assert_same_outputs(exported, model)


def test_export_hf_refuses_other_encodings(tmp_path, capsys):
    model, _, _ = build_detr("tiny", "peg", num_classes=2, num_queries=3, **SMALL)
    ckpt = tmp_path / "peg.pth"
    torch.save({"task": "detect", "model": model.state_dict(), "model_config": model.build_config}, ckpt)
    assert cli(["export-hf", str(ckpt), str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: cannot export to Hugging Face DETR: pos_enc 'peg'")
    assert not (tmp_path / "out").exists()


def test_bad_hf_folders_are_one_line_errors(tmp_path):
    model = _peg_sine()
    (tmp_path / "empty").mkdir()
    with pytest.raises(WeightsError, match=r"no config\.json"):
        load_official_checkpoint(model, tmp_path / "empty")
    (tmp_path / "empty" / "config.json").write_text("{}")
    with pytest.raises(WeightsError, match=r"neither model\.safetensors nor pytorch_model\.bin"):
        load_official_checkpoint(model, tmp_path / "empty")
    (tmp_path / "empty" / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(WeightsError, match="not a readable safetensors file"):
        load_official_checkpoint(model, tmp_path / "empty")


def test_train_init_from_hf_folder(hf_dir, tmp_path):
    """``train --init FOLDER`` (the old ``--pretrained``) starts from a Hugging Face DETR folder."""
    from peg_core.engine import read_checkpoint
    from peg_detr.cli import train
    from peg_detr.data import SyntheticSpec, make_synthetic_coco

    path, _ = hf_dir
    spec = SyntheticSpec(size=64, num_classes=3, min_objects=1, max_objects=2, min_frac=0.3)
    data = make_synthetic_coco(tmp_path / "data", num_train=4, num_val=2, seed=3, spec=spec)
    train([
        "--data-root", str(data), "--output-dir", str(tmp_path / "run"), "--pos-enc", "sine", "--num-queries", "5",
        "--hidden-dim", "32", "--num-heads", "2", "--enc-layers", "1", "--dec-layers", "2", "--dim-feedforward",
        "64", "--num-classes", "4", "--train-sizes", "64", "--crop-resize", "", "--val-size", "64",
        "--total-batch-size", "4", "--epochs", "1", "--lr", "1e-12", "--lr-backbone", "0", "--weight-decay", "0",
        "--workers", "0", "--no-progress", "--device", "cpu", "--eval-every", "0", "--init", str(path),
    ])  # fmt: skip
    trained = read_checkpoint(tmp_path / "run" / "checkpoint.pth", "detect")["model"]
    reference = _peg_sine()
    load_official_checkpoint(reference, path)
    # one step at lr 1e-12: the folder's weights (the class head, 4 ids here and 3 there, starts anew)
    for k, v in reference.named_parameters():
        if not k.startswith("class_embed."):
            torch.testing.assert_close(trained[k], v.detach(), atol=1e-8, rtol=0, msg=k)
