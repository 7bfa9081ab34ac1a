"""``--arch rfdetr`` end to end: recipes, sizes, train / eval / predict / export-hf, the PEG variant.

The end-to-end run trains ``rfdetr_demo_tiny`` (its ``--model-size tiny``: a 4-block windowed ViT,
3 Group DETR groups) for one epoch on the 8-image synthetic set, with RF-DETR's table (the one
encoding transformers' RF-DETR has), evaluates it at three sizes (one no multiple of patch x
windows: padded), predicts a file and writes a Hugging Face folder that transformers'
``AutoModelForObjectDetection`` reads and that computes the same detections.
"""

from __future__ import annotations

import json

import pytest
import torch

from peg_core.engine import read_checkpoint
from peg_detr import from_hf
from peg_detr.__main__ import main as cli
from peg_detr.cli import parse_train_args
from peg_detr.cli import train as train_main
from peg_detr.configs import DESCRIPTIONS, PUBLIC_MODELS, PUBLISHED_AP
from peg_detr.model import load_model, model_config_from_args
from peg_detr.models.rfdetr import RFDETR, RFDETR_SIZES, RFDETRConfig
from tests.detr.tiny import tiny_model

# one intra-op thread for the module's training run and its tests (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("one_thread_module")

COCO_SET = dict(size=96)  # the module's ``data`` (tests/conftest.py)


def test_recipes_name_the_published_sizes_and_their_numbers():
    for size, ap in (("n", 48.4), ("s", 53.0), ("m", 54.7), ("l", 56.5), ("base", 53.3)):
        assert PUBLISHED_AP[f"rfdetr_{size}_coco"] == ap and str(ap) in DESCRIPTIONS[f"rfdetr_{size}_coco"]
    rows = [m for m in PUBLIC_MODELS if m.id.startswith("Roboflow/rf-detr-")]
    assert {m.id: m.accuracy for m in rows}["Roboflow/rf-detr-nano"] == "48.4 COCO AP" and len(rows) == 4
    for size, side in (("n", 384), ("s", 512), ("m", 576), ("l", 704), ("base", 560)):
        args = parse_train_args(["--config", f"rfdetr_{size}_coco", "--data-root", "x"])
        assert (args.arch, args.model_size, args.val_size, args.lr, args.lr_backbone) == (
            "rfdetr",
            size,
            side,
            1e-4,
            1.5e-4,
        )
        assert (args.total_batch_size, args.grad_accum_steps, args.ema_decay) == (16, 4, 0.993)
        preset = RFDETRConfig.preset(size)
        unit = preset.patch_size * preset.num_windows
        sides = [int(s) for s in args.train_scales]
        assert side in sides and all(s % unit == 0 for s in sides), sides  # the windows tile every side
        config = model_config_from_args(args, 91)
        assert config["arch"] == "rfdetr" and config["pos_enc"] == "learned"
        assert config["dropout"] == 0.0  # rf-detr trains its decoder without dropout (main.py's default)
        assert RFDETRConfig.from_dict(config).image_size == RFDETR_SIZES[size]["image_size"]
    peg = parse_train_args(["--config", "rfdetr_s_coco_peg", "--data-root", "x", "--group-detr", "5"])
    assert peg.pos_enc == "peg" and model_config_from_args(peg, 91)["group_detr"] == 5
    # --arch rfdetr without a recipe: RF-DETR base's
    bare = parse_train_args(["--arch", "rfdetr", "--data-root", "x"])
    assert (bare.val_size, bare.model_size, bare.lr_backbone) == (560, "base", 1.5e-4)


@pytest.mark.parametrize(
    "flag",
    [
        ["--num-denoising", "100"],
        ["--label-noise-ratio", "0.5"],
        ["--box-noise-scale", "1.0"],
        ["--enc-layers", "1"],
        ["--encoder-expansion", "0.5"],
        ["--dilation"],
        ["--freeze-backbone-bn"],
        ["--cls-loss", "mal"],
    ],
    ids=lambda f: f[0],
)
def test_other_families_flags_are_refused_in_one_line(flag: list[str], capsys) -> None:
    """RT-DETR's denoising / hybrid-encoder flags, DETR's and D-FINE's have no RF-DETR meaning: one line naming the
    flag as typed, before any data is read (``--data-root`` does not exist)."""
    assert cli(["train", "--config", "rfdetr_demo_tiny", "--data-root", "/nonexistent", *flag]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: applies to --arch "), err
    assert err[0].endswith(
        f"only (not --arch rfdetr): {flag[0]}" + (f" {flag[1]}" if len(flag) > 1 else "")
    ), err


def test_peg_variant_equals_none_before_training_and_runs_where_the_table_never_was():
    """A zero PEG after block 0 computes what ``none`` computes, at any size (padded when the windows do not
    divide it); the table-free model has no grid of its own."""
    peg, _, _ = tiny_model("rfdetr", pos_enc="peg")
    none, _, _ = tiny_model("rfdetr", pos_enc="none")
    state = {k: v for k, v in peg.state_dict().items() if "pos_blocks" not in k}
    none.load_state_dict(state)  # strict: the same model but the PEG
    peg.eval(), none.eval()
    # the table's grid is 12 x 12 (96 px); these are 8 x 20, 24 x 8 and a padded 13 x 9 (100 x 70 px)
    for size in ((96, 96), (64, 160), (192, 64), (100, 70)):
        x = torch.rand(2, 3, *size, generator=torch.Generator().manual_seed(size[0]))
        with torch.no_grad():
            a, b = peg(x), none(x)
        assert torch.equal(a["pred_logits"], b["pred_logits"]) and torch.equal(
            a["pred_boxes"], b["pred_boxes"]
        )
        assert torch.isfinite(a["pred_boxes"]).all()


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("rfdetr")
    report = train_main(
        ["--config", "rfdetr_demo_tiny", "--pos-enc", "learned", "--data-root", str(data), "--output-dir", str(out),
         "--epochs", "1", "--eval-sizes", "64,96,100", "--workers", "0", "--device", "cpu", "--no-progress",
         "--seed", "3"]
    )  # fmt: skip
    return out, report


def test_train_eval_predict_and_export_hf(trained, data, tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("safetensors")
    out, report = trained
    assert report["status"] == "finished" and report["steps"] == 2
    assert set(report["eval"]["sizes"]) == {"64", "96", "100"}  # 100: padded to 112 (patch 8 x 2 windows)
    loaded = load_model(out / "checkpoint.pth")
    assert isinstance(loaded.model, RFDETR) and loaded.config["arch"] == "rfdetr"
    assert cli(["eval", "--checkpoint", str(out / "checkpoint.pth"), "--eval-sizes", "80,130", "--workers", "0",
                "--no-progress", "--json"]) == 0  # fmt: skip
    assert set(json.loads(capsys.readouterr().out.strip().splitlines()[-1])["eval"]["sizes"]) == {"80", "130"}
    image = sorted((data / "val2017").iterdir())[0]
    assert cli(["predict", str(image), "--checkpoint", str(out / "checkpoint.pth"), "--threshold", "0.0",
                "--out", str(tmp_path / "pred")]) == 0  # fmt: skip
    assert any((tmp_path / "pred").iterdir())

    folder = tmp_path / "hf"
    assert cli(["export-hf", str(out / "checkpoint.pth"), str(folder)]) == 0
    pre = json.loads((folder / "preprocessor_config.json").read_text())
    assert pre["image_processor_type"] == "RfDetrImageProcessor" and pre["size"] == {
        "height": 96,
        "width": 96,
    }
    ours, _ = from_hf(folder)
    theirs = transformers.AutoModelForObjectDetection.from_pretrained(folder).eval()
    x = torch.rand(1, 3, 96, 96, generator=torch.Generator().manual_seed(0))
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in (pre["image_mean"], pre["image_std"]))
    with torch.no_grad():
        a, b = ours(x), theirs(pixel_values=(x - mean) / std)
    assert (a["pred_logits"] - b.logits).abs().max() <= 1e-4
    assert (a["pred_boxes"] - b.pred_boxes).abs().max() <= 1e-4


def test_init_from_an_rf_detr_folder_starts_a_run(trained, data, tmp_path, capsys):
    """``--init FOLDER`` of an exported RF-DETR: the classes kept by name, the weights the folder's."""
    out, _ = trained
    folder = tmp_path / "hf"
    assert cli(["export-hf", str(out / "checkpoint.pth"), str(folder)]) == 0
    run = tmp_path / "ft"
    assert cli(["train", "--config", "rfdetr_demo_tiny", "--pos-enc", "learned", "--data-root", str(data),
                "--output-dir", str(run), "--init", str(folder), "--epochs", "1", "--lr", "1e-12",
                "--lr-backbone", "1e-12", "--eval-sizes", "96", "--workers", "0", "--no-progress"]) == 0  # fmt: skip
    assert "kept 3 of 3 classes by name (square, disc, triangle)" in capsys.readouterr().out
    tuned = read_checkpoint(run / "checkpoint.pth", "detect")
    assert tuned["model_config"]["arch"] == "rfdetr"
    # lr 1e-12 for two steps: the folder's weights (export-hf writes the run's EMA), every class row included
    start, _ = from_hf(folder)
    for key, value in start.state_dict().items():
        torch.testing.assert_close(tuned["model"][f"model.{key}"], value, rtol=0, atol=1e-6, msg=key)
