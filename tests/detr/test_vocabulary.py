"""The shared flag vocabulary in ``peg_detr``: new spellings, hidden old aliases, the PEG group, old checkpoints."""

from __future__ import annotations

import pytest
import torch

from peg_core.engine import read_checkpoint
from peg_core.interop.io import atomic_save
from peg_detr import build_detr
from peg_detr.cli import build_make_data_parser, evaluate, parse_eval_args, parse_train_args, train
from peg_detr.model import build_model, load_model, model_config_from_args
from peg_detr.task import run_args

SMALL = dict(num_classes=4, num_queries=5, hidden_dim=32, enc_layers=2, dec_layers=1, dim_feedforward=64)
TINY_FLAGS = ["--config", "demo_tiny", "--data-root", "x", "--hidden-dim", "32", "--num-heads", "2",
              "--enc-layers", "2", "--dec-layers", "1", "--dim-feedforward", "64", "--num-queries", "5"]  # fmt: skip


def _model(*flags: str) -> torch.nn.Module:
    """The model ``train`` would build from ``TINY_FLAGS`` plus ``flags``."""
    args = parse_train_args([*TINY_FLAGS, *flags])
    return build_model(model_config_from_args(args, num_classes=4))[0]


def test_old_spellings_parse_to_the_same_namespace():
    old = [
        "--coco-path",
        "d",
        "--nheads",
        "2",
        "--train-scales",
        "56,64",
        "--pretrained",
        "w.pth",
        "--peg-at",
        "0",
    ]
    new = [
        "--data-root",
        "d",
        "--num-heads",
        "2",
        "--train-sizes",
        "56,64",
        "--init",
        "w.pth",
        "--peg-at",
        "0",
    ]
    assert parse_train_args(old) == parse_train_args(new)
    a = parse_train_args(new)
    assert (a.data_root.name, a.num_heads, a.train_scales, a.init.name, a.arch) == (
        "d",
        2,
        [56, 64],
        "w.pth",
        "detr",
    )
    assert parse_eval_args(["--checkpoint", "c", "--coco-path", "d"]) == parse_eval_args(
        ["--checkpoint", "c", "--data-root", "d"]
    )
    p = build_make_data_parser()
    assert p.parse_args(["o", "--train", "3", "--val", "2"]) == p.parse_args(
        ["o", "--num-train", "3", "--num-val", "2"]
    )


def test_old_spellings_hidden_from_help():
    from peg_detr.cli import build_train_parser

    text = build_train_parser().format_help()
    assert "--data-root" in text and "--num-heads" in text and "--train-sizes" in text and "--init" in text
    assert not any(old in text for old in ("--coco-path", "--nheads", "--train-scales", "--pretrained"))


def test_data_root_required(capsys):
    with pytest.raises(SystemExit) as e:
        parse_train_args(["--epochs", "1"])
    assert (
        e.value.code == 2 and "the following arguments are required: --data-root" in capsys.readouterr().err
    )


def test_arch_recorded_in_model_config():
    model = _model()
    assert model.build_config["arch"] == "detr"
    with pytest.raises(SystemExit):
        parse_train_args([*TINY_FLAGS, "--arch", "yolo"])


def test_peg_kernel_size_changes_the_conv():
    assert _model().transformer.encoder.pegs["0"].proj.weight.shape == (32, 1, 3, 3)
    model = _model("--peg-kernel-size", "5")
    assert model.transformer.encoder.pegs["0"].proj.weight.shape == (32, 1, 5, 5)
    assert model.build_config["peg_kernel_size"] == 5
    with pytest.raises(SystemExit):
        parse_train_args([*TINY_FLAGS, "--peg-kernel-size", "4"])


def test_peg_variants_pass_through():
    peg = _model("--peg-separable", "--peg-padding", "circular").transformer.encoder.pegs["0"]
    assert peg._factorized and peg.padding_mode == "circular" and peg.proj.weight.shape == (32, 1, 3, 1)
    dyn = _model("--peg-dynamic", "--peg-num-kernels", "3").transformer.encoder.pegs["0"]
    assert dyn.dynamic and dyn.weight.shape == (3, 32, 1, 3, 3)


def test_peg_at_minus_one_is_before_layer_0():
    model = _model("--peg-at=-1").eval()
    enc = model.transformer.encoder
    assert list(enc.pegs) == ["-1"] and "transformer.encoder.pegs.-1.proj.weight" in model.state_dict()
    torch.manual_seed(0)
    x, mask, size = torch.randn(2, 12, 32), torch.zeros(2, 3, 4, dtype=torch.bool), (3, 4)
    mask[1, :, 3:] = True
    with torch.no_grad():
        out, peg_out = enc(x, size, mask)
        delta = enc.pegs["-1"].position(x, size, mask)
        expected = x + delta
        for layer in enc.layers:
            expected = layer(expected, None, mask.flatten(1))
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(peg_out, delta)  # the first PEG's output (decoder_key_pos=peg-output)
    assert list(_model("--peg-at", "all").transformer.encoder.pegs) == ["0", "1"]
    assert list(_model("--peg-at=-1,1").transformer.encoder.pegs) == ["-1", "1"]
    with pytest.raises(ValueError, match="peg_at"):
        build_detr("tiny", "peg", num_heads=2, peg_at=[2], **SMALL)


def test_pos_interpolation_reaches_the_learned_table():
    model = _model("--pos-enc", "learned", "--learned-grid", "5x7", "--pos-interpolation", "bilinear")
    assert model.transformer.encoder.pos.interpolation == "bilinear"
    assert _model("--pos-enc", "learned").transformer.encoder.pos.interpolation == "bicubic"  # the default


COCO_SET = dict(max_frac=0.45, num_train=4, num_val=2, seed=3)  # the module's ``data`` (tests/conftest.py)


def test_old_checkpoint_names_load(data, tmp_path):
    """A checkpoint written before the vocabulary: model_config ``nheads``, no ``arch``, args ``coco_path``."""
    model, _, _ = build_detr("tiny", "peg", num_heads=2, **SMALL)
    config = {("nheads" if k == "num_heads" else k): v for k, v in model.build_config.items()}
    ckpt_path = tmp_path / "old.pth"
    cats = [{"id": i, "name": n} for i, n in enumerate(("square", "disc", "triangle"), 1)]
    old = {"task": "detect", "model": model.state_dict(), "model_config": config,
           "meta": {"categories": cats, "val_size": 64}, "args": {"coco_path": str(data), "nheads": 2}}  # fmt: skip
    atomic_save(old, ckpt_path)
    ckpt = read_checkpoint(ckpt_path, "detect")
    assert "nheads" in ckpt["model_config"] and "arch" not in ckpt["model_config"]
    restored = load_model(ckpt, ckpt_path).model
    assert restored.transformer.encoder.layers[0].self_attn.num_heads == 2
    assert restored.build_config["arch"] == "detr" and restored.build_config["num_heads"] == 2
    for k, v in model.state_dict().items():
        assert torch.equal(v, restored.state_dict()[k]), k
    assert run_args(ckpt)["data_root"] == str(data)
    # eval finds the data through the old args' coco_path
    report = evaluate(["--checkpoint", str(ckpt_path), "--output-dir", str(tmp_path / "ev"), "--workers", "0",
                       "--no-progress", "--device", "cpu"])  # fmt: skip
    assert report["eval"]["images"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("flag", ["--init", "--pretrained"])
def test_init_starts_from_official_weights(data, tmp_path, flag):
    """``--init`` (and its old spelling) loads an official-layout ``{"model": state}`` file before training."""
    torch.manual_seed(123)
    start, _, _ = build_detr("tiny", "peg", num_heads=2, **SMALL)
    weights = tmp_path / "official.pth"
    torch.save({"model": start.state_dict()}, weights)
    out = tmp_path / "run"
    train([
        "--data-root", str(data), "--output-dir", str(out), "--backbone", "tiny", *TINY_FLAGS[4:],
        "--train-sizes", "64", "--crop-resize", "", "--val-size", "64", "--total-batch-size", "4",
        "--epochs", "1", "--lr", "1e-12", "--lr-backbone", "0", "--weight-decay", "0", "--workers", "0",
        "--no-progress", "--device", "cpu", "--eval-every", "0", flag, str(weights),
    ])  # fmt: skip
    trained = read_checkpoint(out / "checkpoint.pth", "detect")
    assert trained["args"]["init"] == str(weights)
    # one step at lr 1e-12: still the starting weights (the tiny backbone's BatchNorm statistics move)
    for k, v in start.named_parameters():
        torch.testing.assert_close(trained["model"][k], v.detach(), atol=1e-8, rtol=0, msg=k)


def test_rope_mixed_frequencies_are_not_decayed():
    """DETR decays every parameter except the learned rotary frequencies; other encodings keep [main, backbone]."""
    from peg_detr.task import optimizer_groups

    kw = dict(backbone="tiny", num_classes=3, hidden_dim=32, num_heads=2, enc_layers=1, dec_layers=1,
              dim_feedforward=64, num_queries=5)  # fmt: skip
    model = build_model({**kw, "pos_enc": "rope-mixed"})[0]
    groups = optimizer_groups(model, 1e-5, 1e-4)
    assert [g["name"] for g in groups] == ["main", "main_no_decay", "backbone"]
    assert groups[1]["params"] == [model.transformer.encoder.rope.freqs] and groups[1]["weight_decay"] == 0.0
    plain = optimizer_groups(build_model({**kw, "pos_enc": "peg"})[0], 1e-5, 1e-4)
    assert [g["name"] for g in plain] == ["main", "backbone"]
