"""``python -m peg_core train --init FILE``: start from a timm ViT's weights file (rope, DINOv3) or a file
that names its model, keeping the architecture no flag spells (layer scale, registers, rotary base)."""

from __future__ import annotations

import pytest
import torch

timm = pytest.importorskip("timm")
pytest.importorskip("safetensors")

from safetensors.torch import save_file  # noqa: E402

from peg_core import from_timm_file  # noqa: E402
from peg_core.classify import cli  # noqa: E402
from peg_core.classify.model import build_model, init_model_config, load_init_weights, read_init  # noqa: E402
from peg_core.engine import read_checkpoint  # noqa: E402
from peg_core.interop import WeightsError  # noqa: E402

from .classify_runs import one_line_error  # noqa: E402

RUN = ["--img-size", "32", "--num-train", "32", "--num-val", "16", "--batch-size", "16", "--epochs", "1",
       "--workers", "0", "--threads", "1", "--no-progress", "--device", "cpu"]  # fmt: skip


def _timm_file(tmp_path, name: str) -> tuple[torch.nn.Module, object]:
    """A random timm ``name`` (layer scale 1 so attention matters) and its weights in a .safetensors file."""
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, dynamic_img_size=True).eval()
    with torch.no_grad():
        for key, p in model.named_parameters():
            if "gamma" in key:
                p.fill_(1.0)
            elif key.startswith("head."):
                p.normal_(std=0.5)  # timm's head starts near zero: outputs that say something
    path = tmp_path / f"{name}.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return model, path


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    return _timm_file(tmp_path_factory.mktemp("timm"), "vit_small_patch16_rope_mixed_224")


def test_from_timm_file_computes_what_timm_computes(mixed):
    model, path = mixed
    ours = from_timm_file("vit_small_patch16_rope_mixed_224", path)
    cfg = ours.build_config
    assert cfg["arch"] == "cpvt" and cfg["pos_enc"] == "rope-mixed" and cfg["init_values"] == 1.0
    assert cfg["rope_temperature"] == 10.0 and cfg["num_classes"] == 1000
    rebuilt = build_model(cfg)  # the recorded config rebuilds the same network
    rebuilt.load_state_dict(ours.state_dict())
    x = torch.randn(1, 3, 64, 96)
    with torch.no_grad():
        want = model(x)
        assert (ours(x) - want).abs().max() <= 1e-4
        assert (rebuilt.eval()(x) - want).abs().max() <= 1e-4


def test_init_keeps_the_files_model_and_a_flag_adds_a_zero_peg(mixed):
    """The model a run builds from ``--init FILE --init-timm NAME --pos-enc peg+rope-mixed``, before training."""
    model, path = mixed
    args = cli.parse_train_args(
        [
            "--init",
            str(path),
            "--init-timm",
            "vit_small_patch16_rope_mixed_224",
            "--pos-enc",
            "peg+rope-mixed",
        ]
    )
    assert "pos_enc" in args.cli_flags and "arch" not in args.cli_flags
    init = read_init(args.init, args.init_timm)
    flags = {"arch": args.arch, "pos_enc": args.pos_enc, "img_size": 64, "num_classes": 1000}
    config = init_model_config(flags, init.config, args.cli_flags)
    assert config["pos_enc"] == "peg+rope-mixed" and config["depth"] == 12 and config["embed_dim"] == 384
    ours = build_model(config).eval()
    report = load_init_weights(ours, args.init, init)
    assert report.converted and all(k.startswith("pos_blocks.0.") for k in report.converted)
    assert not report.missing and "zero-initialised (a PEG the file lacks)" in report.line()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert (ours(x) - model(x)).abs().max() <= 1e-4  # the zero PEG is the identity
        ours.pos_blocks["0"].proj.weight.add_(0.1)
        assert (ours(x) - model(x)).abs().max() > 1e-3  # and it is in the graph


def test_train_from_a_timm_file_then_eval(mixed, tmp_path):
    _, path = mixed
    out = tmp_path / "run"
    init = [
        "--init",
        str(path),
        "--init-timm",
        "vit_small_patch16_rope_mixed_224",
        "--pos-enc",
        "peg+rope-mixed",
    ]
    report = cli.train([*RUN, *init, "--output-dir", str(out)])
    assert report["status"] == "finished"
    ckpt = read_checkpoint(out / "checkpoint.pth")
    cfg = ckpt["model_config"]
    assert cfg["arch"] == "cpvt" and cfg["pos_enc"] == "peg+rope-mixed" and cfg["init_values"] == 1.0
    # the data's classes, the run's size
    assert cfg["num_classes"] == len(ckpt["meta"]["classes"]) and cfg["img_size"] == 32
    ev = cli.evaluate(["--checkpoint", str(out / "checkpoint.pth"), "--eval-sizes", "32,48",
                       "--device", "cpu", "--threads", "1", "--no-progress"])  # fmt: skip
    assert ev["eval"]["sizes"] == [32, 48]
    assert ev["eval"]["top1_by_size"]["32"] == report["eval"]["top1"]  # the rebuilt model is the trained one


def test_dinov3_registers_and_layer_scale_survive(tmp_path):
    model, path = _timm_file(tmp_path, "vit_small_patch16_dinov3")
    init = read_init(path, "vit_small_patch16_dinov3")
    flags = {"arch": "demo", "pos_enc": "peg", "img_size": 64, "num_classes": 7}
    config = init_model_config(flags, init.config, ["num_train"])  # no model flag given
    assert config["pos_enc"] == "rope-dinov3" and config["num_reg_tokens"] == 4
    assert config["qkv_bias"] is False and config["init_values"] == 1.0 and config["num_classes"] == 7
    ours = build_model(config).eval()
    report = load_init_weights(ours, path, init)
    assert sorted(report.missing) == ["head.bias", "head.weight"]  # 1000 classes in the file: a new head
    x = torch.randn(1, 3, 64, 80)
    with torch.no_grad():
        assert (ours.forward_features(x)[0][:, 5:] - model.forward_features(x)[:, 5:]).abs().max() <= 1e-4


def test_init_from_a_train_checkpoint_keeps_its_shape(tmp_path):
    """A checkpoint names its model too: --depth given once is not needed again."""
    first = tmp_path / "first"
    tiny = [*RUN, "--embed-dim", "16", "--depth", "1", "--num-heads", "2", "--peg-at", "0"]
    cli.train([*tiny, "--output-dir", str(first)])
    second = tmp_path / "second"
    cli.train([*RUN, "--init", str(first / "checkpoint.pth"), "--output-dir", str(second)])
    cfg = read_checkpoint(second / "checkpoint.pth")["model_config"]
    assert (cfg["embed_dim"], cfg["depth"], cfg["num_heads"]) == (16, 1, 2)


def test_bad_timm_inits_are_one_line_errors(mixed, tmp_path, capsys):
    _, path = mixed
    from peg_core.__main__ import main

    out = ["--output-dir", str(tmp_path / "o"), *RUN]
    code = main(["train", *out, "--init", str(path), "--init-timm", "vit_no_such_model"])
    assert "timm has no model 'vit_no_such_model'" in one_line_error(capsys, code)
    code = main(["train", *out, "--init", str(path), "--init-timm", "deit_tiny_patch16_224"])
    assert "weights do not fit timm deit_tiny_patch16_224" in one_line_error(capsys, code)
    assert main(["train", *out, "--init-timm", "deit_tiny_patch16_224"]) == 2  # usage: needs --init
    with pytest.raises(WeightsError, match="not found"):
        from_timm_file("deit_tiny_patch16_224", tmp_path / "missing.safetensors")
