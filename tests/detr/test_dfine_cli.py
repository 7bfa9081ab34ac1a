"""``--arch dfine`` end to end: recipes, size presets, train / eval / predict / ONNX export, folders.

The end-to-end run trains ``dfine_demo_tiny`` (tiny backbone, PEG in AIFI, D-FINE's decoder and
losses) for one epoch on a generated shapes set, evaluates at three square sizes, exports ONNX
with dynamic batch, height and width and runs the graph in onnxruntime at two sizes other than
the example's; a Hugging Face D-FINE folder starts a PEG run that resumes; DEIM's loss trains.
"""

from __future__ import annotations

import json

import pytest
import torch

from peg_core.engine import UserError, read_checkpoint
from peg_detr.__main__ import main as cli
from peg_detr.archs import arch_of_model
from peg_detr.cli import parse_train_args
from peg_detr.cli import train as train_main
from peg_detr.configs import CONFIGS, PUBLISHED_AP
from peg_detr.model import build_model, load_model, model_config_from_args
from peg_detr.models.dfine import DFINE, DFINE_SIZES

# ------------------------------------------------------------------------------- recipes and flags


def test_recipes_parse_with_the_published_settings():
    # Peterande/D-FINE configs/dfine/dfine_hgnetv2_{n,s,m,l,x}_coco.yml
    want = {"n": (160, 12, 8e-4, 4e-4), "s": (130, 10, 2.5e-4, 1.25e-4), "m": (130, 10, 2.5e-4, 2.5e-5),
            "l": (80, 8, 2.5e-4, 1.25e-5), "x": (80, 8, 2.5e-4, 2.5e-6)}  # fmt: skip
    for size, (epochs, no_aug, lr, lr_backbone) in want.items():
        a = parse_train_args(["--config", f"dfine_{size}", "--data-root", "x"])
        assert (a.arch, a.model_size, a.epochs, a.no_aug_epochs, a.lr, a.lr_backbone) == (
            "dfine",
            size,
            epochs,
            no_aug,
            lr,
            lr_backbone,
        ), size
        assert (a.val_size, a.num_queries, a.total_batch_size, a.ema_decay, a.pos_enc) == (
            640,
            300,
            64,
            0.9999,
            "sincos",
        )
        kw = model_config_from_args(a, 80)
        assert kw["backbone"] == DFINE_SIZES[size]["backbone"]
        assert {k: kw[k] for k in DFINE_SIZES[size]} == DFINE_SIZES[size]  # the preset, not DETR's defaults
        assert PUBLISHED_AP[f"dfine_{size}"] == {"n": 42.8, "s": 48.5, "m": 52.3, "l": 54.0, "x": 55.8}[size]
        assert parse_train_args(["--config", f"dfine_{size}_peg", "--data-root", "x"]).pos_enc == "peg"
    s = parse_train_args(["--config", "dfine_s", "--data-root", "x"])
    assert s.train_scales.count(640) == 20 and min(s.train_scales) == 480 and max(s.train_scales) == 800
    # --arch dfine without a recipe: D-FINE-L
    bare = parse_train_args(["--arch", "dfine", "--data-root", "x"])
    assert (bare.model_size, bare.backbone, bare.val_size) == ("l", "hgnetv2_b4", 640)
    assert "dfine_demo_tiny" in CONFIGS


def test_size_presets_build_the_published_parameter_counts():
    # D-FINE README: S 10 M, M 19 M parameters (the HGNetv2 from timm's modules, random weights)
    pytest.importorskip("timm")
    for size, millions in (("s", 10.3), ("m", 19.6)):
        a = parse_train_args(["--config", f"dfine_{size}", "--data-root", "x"])
        model, _, _ = build_model(model_config_from_args(a, 80))
        assert isinstance(model, DFINE) and arch_of_model(model).name == "dfine"
        assert sum(p.numel() for p in model.parameters()) / 1e6 == pytest.approx(millions, abs=0.1)


def test_deimv2_recipes_build_their_published_sizes():
    # DEIMv2 README: atto 0.5, femto 1.0, pico 1.5, N 3.6, S 9.7, M 18.1, L 32.2 M parameters
    pytest.importorskip("timm")
    published = {"atto": 0.5, "femto": 1.0, "pico": 1.5, "n": 3.6, "s": 9.7, "m": 18.1, "l": 32.2}
    for size, millions in published.items():
        a = parse_train_args(["--config", f"deimv2_{size}", "--data-root", "x"])
        assert (a.arch, a.model_size, a.epochs, a.lr_schedule) == ("deimv2", size, 132, "flatcosine")
        model, criterion, _ = build_model(model_config_from_args(a, 80))
        assert arch_of_model(model).name == "deimv2" and criterion.losses[0] == "mal"
        assert sum(p.numel() for p in model.parameters()) / 1e6 == pytest.approx(millions, rel=0.06), size


def test_flags_override_the_preset_and_misuse_is_refused():
    a = parse_train_args(["--config", "dfine_demo_tiny", "--data-root", "x", "--dec-layers", "3",
                          "--cls-loss", "mal", "--decoder-act", "silu", "--head-act", "silu"])  # fmt: skip
    kw = model_config_from_args(a, 3)
    assert (kw["dec_layers"], kw["cls_loss"], kw["decoder_activation"], kw["mlp_activation"]) == (
        3,
        "mal",
        "silu",
        "silu",
    )
    model, criterion, _ = build_model(kw)
    assert len(model.decoder.layers) == 3 and criterion.losses[0] == "mal" and criterion.gamma == 1.5
    assert isinstance(model.decoder.pre_bbox_head.activation, torch.nn.SiLU)
    for flags, message in (
        (["--model-size", "s"], "--arch rtdetr has no size presets"),
        (["--cls-loss", "mal"], "applies to --arch dfine only"),
    ):
        with pytest.raises(UserError, match=message):
            parse_train_args(["--config", "rtdetr_demo_tiny", "--data-root", "x", *flags])
    # a --model-size named on the command line wins over the recipe, a flag over both
    pico = parse_train_args(
        ["--arch", "deimv2", "--model-size", "pico", "--num-queries", "20", "--data-root", "x"]
    )
    kw = model_config_from_args(pico, 3)
    assert (kw["backbone"], kw["encoder"], kw["pos_enc"], kw["num_queries"]) == (
        "hgnetv2_pico",
        "lite",
        "none",
        20,
    )


# -------------------------------------------------------------------------------------- end to end


COCO_SET = dict(size=96)  # the module's ``data`` (tests/conftest.py)


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("dfine")
    report = train_main(
        ["--config", "dfine_demo_tiny", "--data-root", str(data), "--output-dir", str(out), "--epochs", "1",
         "--eval-sizes", "64,96,128", "--workers", "0", "--device", "cpu", "--no-progress", "--seed", "3"]
    )  # fmt: skip
    return out, report


def test_train_evaluates_at_several_sizes(trained):
    out, report = trained
    assert report["status"] == "finished" and report["steps"] == 2
    assert set(report["eval"]["sizes"]) == {"64", "96", "128"}
    assert all(0.0 <= s["ap"] <= 1.0 or s["ap"] == -1.0 for s in report["eval"]["sizes"].values())
    ckpt = read_checkpoint(out / "checkpoint.pth", "detect")
    assert ckpt["model_config"]["arch"] == "dfine" and ckpt["model_config"]["pos_enc"] == "peg"
    assert any(k.startswith("ema.module.decoder.bbox_embed") for k in ckpt["model"])
    # the loss terms of D-FINE were trained: FGL and DDF among the logged ones
    assert isinstance(load_model(out / "checkpoint.pth").model, DFINE)


def test_model_runs_at_other_sizes_and_the_eval_and_predict_verbs(trained, data, tmp_path, capsys):
    out, _ = trained
    model = load_model(out / "checkpoint.pth").model
    with torch.no_grad():
        for h, w in ((64, 64), (160, 96), (97, 131)):
            got = model(torch.rand(1, 3, h, w))
            assert got["pred_logits"].shape == (1, 20, 4) and torch.isfinite(got["pred_boxes"]).all()
    assert cli(["eval", "--checkpoint", str(out / "checkpoint.pth"), "--eval-sizes", "80,160", "--workers", "0",
                "--no-progress", "--json"]) == 0  # fmt: skip
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(report["eval"]["sizes"]) == {"80", "160"}
    image = sorted((data / "val2017").iterdir())[0]
    out_dir = tmp_path / "pred"
    argv = [
        "predict",
        str(image),
        "--checkpoint",
        str(out / "checkpoint.pth"),
        "--threshold",
        "0.0",
        "--out",
        str(out_dir),
    ]
    assert cli(argv) == 0
    assert any(out_dir.iterdir())  # the drawn image / detections of the one file
    # a square resize, as RT-DETR's: an image too elongated for DETR's short-side resize still fits
    from PIL import Image

    thin = tmp_path / "thin.png"
    Image.new("RGB", (3000, 4), (120, 30, 200)).save(thin)
    argv = [
        "predict",
        str(thin),
        "--checkpoint",
        str(out / "checkpoint.pth"),
        "--out",
        str(tmp_path / "thin_out"),
    ]
    assert cli(argv) == 0


@pytest.mark.slow  # torch.export capture and the ONNX decompositions
def test_onnx_export_runs_at_other_sizes_like_pytorch(trained, tmp_path, capsys):
    ort = pytest.importorskip("onnxruntime")
    out, _ = trained
    onnx_path = tmp_path / "dfine.onnx"
    argv = [
        "export",
        str(out / "checkpoint.pth"),
        str(onnx_path),
        "--height",
        "96",
        "--width",
        "128",
        "--check",
    ]
    assert cli(argv) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["max_abs_diff"] <= 1e-4 and line.get("fused")  # fused for deployment, as RT-DETR
    model = load_model(out / "checkpoint.pth").model
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    for b, (h, w) in ((1, (64, 64)), (3, (160, 96))):
        x = torch.rand(b, 3, h, w, generator=torch.Generator().manual_seed(h))
        logits, boxes = session.run(None, {"images": x.numpy()})
        with torch.no_grad():
            want = model(x)
        # label 0 (category ids are 1..3) names no category: the graph masks it at float32's lowest
        torch.testing.assert_close(
            torch.from_numpy(logits)[..., 1:], want["pred_logits"][..., 1:], atol=1e-4, rtol=0
        )
        assert (logits[..., 0] == torch.finfo(torch.float32).min).all()
        torch.testing.assert_close(torch.from_numpy(boxes), want["pred_boxes"], atol=1e-4, rtol=0)


def _tiny_dfine_folder(path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("timm")
    backbone = transformers.HGNetV2Config(
        stem_channels=[3, 8, 8], stage_in_channels=[8, 16, 32, 64], stage_mid_channels=[8, 8, 16, 16],
        stage_out_channels=[16, 32, 64, 128], stage_num_blocks=[1, 1, 1, 1], stage_downsample=[False, True, True, True],
        stage_light_block=[False, False, True, True], stage_kernel_size=[3, 3, 5, 5], stage_numb_of_layers=[1, 1, 1, 1],
        hidden_sizes=[16, 32, 64, 128], out_features=["stage2", "stage3", "stage4"], use_learnable_affine_block=True,
    )  # fmt: skip
    config = transformers.DFineConfig(
        backbone_config=backbone, encoder_hidden_dim=32, d_model=32, encoder_in_channels=[32, 64, 128],
        decoder_in_channels=[32, 32, 32], encoder_ffn_dim=64, decoder_ffn_dim=64, decoder_layers=2,
        num_queries=20, num_labels=4, num_denoising=10, max_num_bins=8, decoder_n_points=[2, 2, 2],
        encoder_attention_heads=2, decoder_attention_heads=2, eval_size=None, anchor_image_size=None,
    )  # fmt: skip
    transformers.DFineForObjectDetection(config).save_pretrained(path)
    return path


def test_init_from_a_hugging_face_folder_trains_with_a_peg_and_resumes(data, tmp_path, capsys):
    folder = _tiny_dfine_folder(tmp_path / "hf")
    out = tmp_path / "run"
    argv = ["train", "--config", "dfine_demo_tiny", "--data-root", str(data), "--output-dir", str(out),
            "--init", str(folder), "--cls-loss", "mal", "--epochs", "2", "--stop-after-epoch", "1",
            "--workers", "0", "--no-progress"]  # fmt: skip
    assert cli(argv) == 0
    assert "converted" in capsys.readouterr().out  # the PEG, added at zero
    ckpt = read_checkpoint(out / "checkpoint.pth", "detect")
    config = ckpt["model_config"]
    assert (
        config["hf_config"]["model_type"] == "d_fine" and config["cls_loss"] == "mal" and ckpt["epoch"] == 0
    )
    assert cli([*argv[:-7], "--epochs", "2", "--resume", "auto", "--workers", "0", "--no-progress"]) == 0
    assert read_checkpoint(out / "checkpoint.pth", "detect")["epoch"] == 1
    loaded = load_model(out / "checkpoint.pth")
    assert isinstance(loaded.model, DFINE) and loaded.model.num_classes == 4
    # an RT-DETR run cannot start from a D-FINE folder: one line naming the arch to use
    capsys.readouterr()
    bad = ["train", "--config", "rtdetr_demo_tiny", "--data-root", str(data), "--output-dir", str(tmp_path / "bad"),
           "--init", str(folder), "--workers", "0", "--no-progress"]  # fmt: skip
    assert cli(bad) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds a D-FINE, not a RT-DETR; use --arch dfine" in err[0], err


@pytest.mark.slow  # one epoch, export-hf and the ONNX export
def test_deimv2_trains_evaluates_and_exports(data, tmp_path, capsys):
    """DEIMv2-Pico (HGNetv2 + lite encoder) from its preset: one epoch, eval at two sizes, export-hf, ONNX."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("timm")
    out = tmp_path / "deimv2"
    argv = ["train", "--arch", "deimv2", "--model-size", "pico", "--num-queries", "20", "--num-denoising", "10",
            "--data-root", str(data), "--output-dir", str(out), "--epochs", "1", "--val-size", "96",
            "--eval-sizes", "64,128", "--total-batch-size", "4", "--train-sizes", "64,96", "--workers", "0",
            "--no-progress", "--seed", "1"]  # fmt: skip
    assert cli(argv) == 0
    loaded = load_model(out / "checkpoint.pth")
    assert arch_of_model(loaded.model).name == "deimv2" and loaded.config["encoder"] == "lite"
    folder = tmp_path / "hf"
    capsys.readouterr()
    assert cli(["export-hf", str(out / "checkpoint.pth"), str(folder)]) == 0
    hf = transformers.Deimv2ForObjectDetection.from_pretrained(folder).eval()
    x = torch.rand(1, 3, 96, 96, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got = hf(pixel_values=x), loaded.model(x)
    torch.testing.assert_close(got["pred_logits"], want.logits, atol=1e-4, rtol=0)
    torch.testing.assert_close(got["pred_boxes"], want.pred_boxes, atol=1e-4, rtol=0)
    # ONNX with dynamic sizes, fused, equal to PyTorch in onnxruntime at a size other than the example's
    ort = pytest.importorskip("onnxruntime")
    onnx_path = tmp_path / "deimv2.onnx"
    argv = [
        "export",
        str(out / "checkpoint.pth"),
        str(onnx_path),
        "--height",
        "96",
        "--width",
        "96",
        "--check",
    ]
    assert cli(argv) == 0
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    x = torch.rand(2, 3, 128, 64, generator=torch.Generator().manual_seed(1))
    logits, boxes = session.run(None, {"images": x.numpy()})
    with torch.no_grad():
        want = loaded.model(x)
    torch.testing.assert_close(torch.from_numpy(logits), want["pred_logits"], atol=1e-4, rtol=0)
    torch.testing.assert_close(torch.from_numpy(boxes), want["pred_boxes"], atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    ("flags", "said", "typed"),
    [
        (["--config", "dfine_demo_tiny", "--mosaic-prob", "1"], "makes no mosaic in this run: its epoch window "
         "--mosaic-epochs is empty (0,0)", "--mosaic-prob 1.0"),
        (["--config", "dfine_demo_tiny", "--mixup-prob", "1"], "makes no mixed batch in this run: its epoch window "
         "--mixup-epochs is empty (0,0)", "--mixup-prob 1.0"),
        (["--config", "dfine_demo_tiny", "--mosaic-epochs", "0,1"], "has no effect without --mosaic-prob",
         "--mosaic-epochs 0,1"),
        (["--config", "dfine_demo_tiny", "--mixup-prob", "0", "--mixup-epochs", "3"], "has no effect without "
         "--mixup-prob", "--mixup-epochs 0,3"),
        (["--config", "dfine_demo_tiny", "--epochs", "3", "--mosaic-prob", "0.5", "--mosaic-epochs", "3,9"],
         "its epoch window --mosaic-epochs 3,9 holds none of the run's epochs 0..2", "--mosaic-epochs 3,9"),
        (["--config", "deim_dfine_s", "--epochs", "2", "--mosaic-prob", "0.5"], "holds none of the run's epochs 0..1",
         "--mosaic-prob 0.5"),  # the recipe's window 4,64 in a 2-epoch run
        (["--config", "rtdetr_demo_tiny", "--head-act", "silu"], "applies to --arch dfine only", "--head-act silu"),
        (["--config", "rtdetr_demo_tiny", "--decoder-act", "gelu"], "applies to --arch dfine only",
         "--decoder-act gelu"),
    ],
)  # fmt: skip
def test_deim_flags_that_change_nothing_are_refused_as_typed(flags, said, typed):
    with pytest.raises(UserError) as e:
        parse_train_args(["--data-root", "x", *flags])
    line = e.value.line()
    assert said in line and line.endswith(f": {typed}"), line


def test_deim_flags_that_draw_something_are_taken():
    for flags in (
        ["--config", "dfine_demo_tiny", "--epochs", "2", "--mosaic-prob", "1", "--mosaic-epochs", "1,5"],
        ["--config", "dfine_demo_tiny", "--mixup-prob", "0.5", "--mixup-epochs", "1"],
        ["--config", "deim_dfine_s"],  # the recipe's own window: not the command line's
        ["--config", "deim_dfine_s", "--mosaic-prob", "0"],  # the recipe's mosaic turned off
        ["--config", "deim_dfine_s", "--mixup-epochs", "4,20"],  # the recipe's probability, another window
    ):
        parse_train_args(["--data-root", "x", *flags])


def test_deim_trains_with_dense_one_to_one_matching(data, tmp_path):
    """DEIM's training on D-FINE: mosaic and mixup in the first epoch, MAL, SiLU, the flat-cosine lr."""
    out = tmp_path / "deim"
    report = train_main(
        ["--config", "dfine_demo_tiny", "--data-root", str(data), "--output-dir", str(out), "--epochs", "2",
         "--cls-loss", "mal", "--decoder-act", "silu", "--head-act", "silu", "--mosaic-prob", "1",
         "--mosaic-epochs", "0,1", "--mixup-prob", "1", "--mixup-epochs", "0,1", "--lr-schedule", "flatcosine",
         "--flat-epochs", "1", "--warmup-steps", "1", "--workers", "0", "--device", "cpu", "--no-progress"]
    )  # fmt: skip
    assert report["status"] == "finished" and report["steps"] == 4
    config = read_checkpoint(out / "checkpoint.pth", "detect")["model_config"]
    assert (config["cls_loss"], config["decoder_activation"]) == ("mal", "silu")
    assert "loss_mal" in report["train"] or any(k.startswith("loss_mal") for k in report["train"])


def test_rtdetr_export_refuses_its_successors(tmp_path):
    from peg_detr.interop import export_hf_rtdetr
    from peg_detr.models.dfine import build_dfine

    model, _, _ = build_dfine(
        "tiny", "sincos", num_classes=3, hidden_dim=32, num_heads=2, dec_layers=1, num_queries=5
    )
    with pytest.raises(TypeError, match="takes an RT-DETR, not a DFINE"):
        export_hf_rtdetr(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_hugging_face_export_refuses_deims_head_activation(tmp_path):
    pytest.importorskip("timm")
    from peg_detr.interop import export_hf_dfine
    from peg_detr.models.dfine import build_dfine

    model, _, _ = build_dfine(
        "hgnetv2_b0", "sincos", num_classes=3, dec_layers=1, num_queries=5, mlp_activation="silu"
    )
    with pytest.raises(ValueError, match="fixes its box / position heads to relu"):
        export_hf_dfine(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("pos_enc", ["alibi-2d", "fire", "lookhere", "peg+fire", "rope-axial"])
def test_dfine_aifi_takes_the_bias_and_rotary_kinds(pos_enc):
    """D-FINE's AIFI is RT-DETR's: the registry's bias and rotary kinds train and run at other sizes."""
    from peg_detr.models.dfine import build_dfine

    model, criterion, _ = build_dfine("tiny", pos_enc, num_classes=3, hidden_dim=32, num_heads=2, dec_layers=1,
                                      num_queries=5, num_denoising=4)  # fmt: skip
    targets = [{"labels": torch.tensor([1]), "boxes": torch.tensor([[0.5, 0.5, 0.3, 0.2]])}]
    criterion.total(criterion(model.train()(torch.rand(1, 3, 96, 64), targets), targets)).backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.encoder.aifi.parameters())
    model.eval()
    with torch.no_grad():
        for size in ((64, 64), (96, 160), (97, 131)):
            out = model(torch.rand(1, 3, *size))
            assert out["pred_boxes"].shape == (1, 5, 4) and torch.isfinite(out["pred_logits"]).all()
