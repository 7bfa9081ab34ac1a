"""``--arch rtdetr`` end to end: recipes, RT-DETR's data pipeline, EMA, train / eval.

The end-to-end run trains ``rtdetr_demo_tiny`` (tiny backbone, PEG in AIFI) for one epoch on a
generated shapes set and evaluates at three square sizes.  Its ONNX export is tested once, in
``test_rtdetr_fuse.py`` (the command's fused graph in onnxruntime at two sizes other than the
example's, label 0 of category ids 1..3 masked); README's quick start exports a trained
``rtdetr_demo_tiny`` with ``--check`` (``tests/docs/test_doc_commands.py``).
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from peg_core.engine import read_checkpoint
from peg_detr.__main__ import main as cli
from peg_detr.cli import parse_train_args
from peg_detr.cli import train as train_main
from peg_detr.configs import CONFIGS, PUBLISHED_AP
from peg_detr.data import (
    MultiScaleCollate,
    make_rtdetr_train_transforms,
    make_rtdetr_val_transforms,
)
from peg_detr.data.transforms import make_boxes
from peg_detr.model import EMA_PREFIX, load_model
from peg_detr.task import EmaModel, warmup_ema_decay, warmup_step_lr
from tests.detr.rtdetr_checks import tiny_rtdetr_config

RTDETR_RECIPES = ("rtdetr_r18vd_6x", "rtdetr_r50vd_6x", "rtdetr_r18vd_6x_peg", "rtdetr_r50vd_6x_peg")


# ------------------------------------------------------------------------------- recipes and flags


def test_recipes_parse_with_the_published_settings(capsys):
    for name in RTDETR_RECIPES:
        a = parse_train_args(["--config", name, "--data-root", "x"])
        got = (
            a.arch,
            a.epochs,
            a.lr,
            a.lr_backbone,
            a.weight_decay,
            a.total_batch_size,
            a.ema_decay,
            a.val_size,
        )
        assert got == ("rtdetr", 72, 1e-4, 1e-5, 1e-4, 16, 0.9999, 640), name
        assert a.train_scales == list(range(480, 801, 32)) and a.pos_enc == (
            "peg" if "peg" in name else "sincos"
        )
    assert parse_train_args(["--config", "rtdetr_r18vd_6x", "--data-root", "x"]).dec_layers == 3
    assert (PUBLISHED_AP["rtdetr_r18vd_6x"], PUBLISHED_AP["rtdetr_r50vd_6x"]) == (46.5, 53.1)
    # --arch rtdetr without a recipe: RT-DETR's defaults, not DETR's resnet50 / 800 px
    bare = parse_train_args(["--arch", "rtdetr", "--data-root", "x"])
    assert (bare.backbone, bare.pos_enc, bare.val_size, bare.num_queries) == ("r50vd", "sincos", 640, 300)
    assert parse_train_args(["--data-root", "x"]).backbone == "resnet50"  # DETR's unchanged
    assert cli(["configs"]) == 0
    listed = [line.split(":")[0] for line in capsys.readouterr().out.splitlines()]
    assert set(RTDETR_RECIPES) | {"rtdetr_demo_tiny"} <= set(listed) and set(CONFIGS) <= set(listed)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--backbone", "resnet50"], "error: invalid model settings (unknown RT-DETR backbone 'resnet50'"),
        (["--decoder-key-pos", "none"], "error: applies to --arch detr only"),
        (
            ["--hidden-dim", "30", "--num-heads", "4"],
            "error: --hidden-dim 30 is not divisible by --num-heads 4",
        ),
    ],
)
def test_bad_model_settings_are_one_line_errors(data, tmp_path, capsys, flags, message):
    argv = ["train", "--config", "rtdetr_demo_tiny", "--data-root", str(data), "--output-dir", str(tmp_path),
            "--workers", "0", "--no-progress", *flags]  # fmt: skip
    assert cli(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(message), err


def test_bad_flag_values_are_usage_errors(capsys):
    for flags in (
        ["--ema-decay", "1.5"],
        ["--num-denoising", "-1"],
        ["--backbone", "r200vd"],
        ["--pos-enc", "sine"],
    ):
        with pytest.raises(SystemExit) as e:
            parse_train_args(["--config", "rtdetr_demo_tiny", "--data-root", "x", *flags])
        assert e.value.code == 2
    err = capsys.readouterr().err
    assert (
        "--ema-decay" in err
        and "argument --pos-enc: RT-DETR's AIFI encoder has no table encoding 'sine'" in err
    )


# ------------------------------------------------------------------------------ data pipeline, EMA


def test_train_transforms_give_a_square_unit_range_image_with_its_boxes():
    from PIL import Image

    image = Image.new("RGB", (120, 90), (200, 100, 50))
    target = {
        "boxes": make_boxes(torch.tensor([[10.0, 10.0, 50.0, 60.0]]), (90, 120)),
        "labels": torch.tensor([2]),
    }
    for seed in range(6):
        torch.manual_seed(seed)
        x, t = make_rtdetr_train_transforms(64)(image, dict(target))
        assert x.shape == (3, 64, 64) and x.min() >= 0.0 and x.max() <= 1.0
        assert len(t["boxes"]) == len(t["labels"]) <= 1
        assert ((t["boxes"] >= 0) & (t["boxes"] <= 64)).all()
    x, t = make_rtdetr_val_transforms(32)(image, dict(target))
    # 120x90 -> 32x32: x scales by 32/120, y by 32/90; pixels not normalised (200/255 in red)
    torch.testing.assert_close(
        t["boxes"], torch.tensor([[10 * 32 / 120, 10 * 32 / 90, 50 * 32 / 120, 60 * 32 / 90]])
    )
    assert math.isclose(float(x[0].mean()), 200 / 255, abs_tol=1e-6)


def test_collate_gives_one_size_per_batch_from_the_sizes():
    images = [torch.rand(3, 64, 64), torch.rand(3, 40, 72)]  # mixed sizes in: one size out
    targets = [{"boxes": torch.tensor([[0.5, 0.5, 0.2, 0.2]]), "labels": torch.tensor([1])} for _ in images]
    collate = MultiScaleCollate([32, 48, 96])
    seen = set()
    for seed in range(12):
        torch.manual_seed(seed)
        batch, out = collate(list(zip(images, targets)))
        side = batch.tensors.shape[-1]
        assert batch.tensors.shape == (2, 3, side, side) and not batch.mask.any()
        assert all(t["size"].tolist() == [side, side] for t in out)
        torch.testing.assert_close(out[0]["boxes"], targets[0]["boxes"])  # normalised: unchanged
        seen.add(side)
    assert seen == {32, 48, 96}
    batch, _ = MultiScaleCollate(())(list(zip(images, targets)))  # no sizes: padded as for DETR
    assert (
        batch.tensors.shape == (2, 3, 64, 72) and batch.mask[1, 40:].all() and not batch.mask[0, :, :64].any()
    )


def test_ema_follows_rtdetr_warmup_decay():
    model = nn.Linear(1, 1, bias=False)
    ema = EmaModel(model, decay=0.9, warmups=4)
    values = [1.0, 3.0, 5.0]
    expected = None
    for n, v in enumerate(values):
        with torch.no_grad():
            model.weight.fill_(v)
        ema.update()
        if expected is None:
            expected = v  # the first update copies the weights
        else:
            d = 0.9 * (1 - math.exp(-(n + 1) / 4))  # RT-DETR counts this update too
            expected = d * expected + (1 - d) * v
        assert math.isclose(float(ema.averaged.weight), expected, rel_tol=1e-6)
    assert set(ema.state_dict()) == {"model.weight", "ema.n_averaged", "ema.module.weight"}
    resumed = EmaModel(nn.Linear(1, 1, bias=False), decay=0.9, warmups=4)
    resumed.load_state_dict(ema.state_dict())  # a resumed run: the count comes from the checkpoint
    for m in (ema, resumed):
        with torch.no_grad():
            m.model.weight.fill_(7.0)
        m.update()
    d = 0.9 * (1 - math.exp(-4 / 4))
    assert math.isclose(float(resumed.averaged.weight), d * expected + (1 - d) * 7.0, rel_tol=1e-6)
    assert float(resumed.averaged.weight) == float(ema.averaged.weight)
    assert not any(p.requires_grad for p in ema.ema.parameters())
    factor = warmup_step_lr(4, 10)
    assert [factor(s) for s in (0, 3, 9, 10, 25)] == [0.25, 1.0, 1.0, 0.1, pytest.approx(0.01)]


def test_ema_decays_once_per_update_with_buffers_of_two_dtypes():
    # BatchNorm's float running stats and int64 num_batches_tracked are two (device, dtype) groups,
    # so AveragedModel calls the averaging function twice per update: the decay must step once.
    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    ema = EmaModel(model, decay=0.9, warmups=4)
    expected = None
    for n in range(4):
        with torch.no_grad():
            model[0].weight.fill_(float(2 * n + 1))
        ema.update()
        d = warmup_ema_decay(0.9, 4, n + 1)
        expected = 2 * n + 1.0 if expected is None else d * expected + (1 - d) * (2 * n + 1)
        torch.testing.assert_close(ema.averaged[0].weight, torch.full((2, 2), expected))
    assert math.isclose(warmup_ema_decay(0.9, 4, 4), 0.9 * (1 - math.exp(-1)), rel_tol=1e-12)


# -------------------------------------------------------------------------------------- end to end


COCO_SET = dict(size=96)  # the module's ``data`` (tests/conftest.py)


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("rtdetr")
    report = train_main(
        ["--config", "rtdetr_demo_tiny", "--data-root", str(data), "--output-dir", str(out), "--epochs", "1",
         "--eval-sizes", "64,96,128", "--workers", "0", "--device", "cpu", "--no-progress", "--seed", "3"]
    )  # fmt: skip
    return out, report


def test_train_evaluates_at_several_sizes_and_checkpoints_the_ema(trained):
    out, report = trained
    assert report["status"] == "finished" and report["steps"] == 2  # 8 images, batch 4
    assert set(report["eval"]["sizes"]) == {"64", "96", "128"} and report["eval"]["size"] == 96
    assert all(0.0 <= s["ap"] <= 1.0 or s["ap"] == -1.0 for s in report["eval"]["sizes"].values())
    ckpt = read_checkpoint(out / "checkpoint.pth", "detect")
    assert ckpt["model_config"]["arch"] == "rtdetr" and ckpt["model_config"]["pos_enc"] == "peg"
    ema = {k for k in ckpt["model"] if k.startswith(EMA_PREFIX)}
    live = {k for k in ckpt["model"] if k.startswith("model.")}
    assert ema and {k[len(EMA_PREFIX) :] for k in ema} == {k[len("model.") :] for k in live}
    assert int(ckpt["model"]["ema.n_averaged"]) == 2
    # load_model evaluates the average, not the live weights
    loaded = load_model(out / "checkpoint.pth").model
    name = next(k for k in loaded.state_dict() if k.endswith("weight") and "backbone" not in k)
    torch.testing.assert_close(loaded.state_dict()[name], ckpt["model"][EMA_PREFIX + name])


def test_peg_model_runs_on_mixed_sizes_and_the_eval_verb(trained, data, capsys):
    out, _ = trained
    model = load_model(out / "checkpoint.pth").model
    with torch.no_grad():
        mixed = model([torch.rand(3, 64, 96), torch.rand(3, 128, 80)])  # padded to one batch
        alone = model(torch.rand(1, 3, 160, 96))
    assert mixed["pred_logits"].shape == (2, 20, 4) and alone["pred_boxes"].shape == (1, 20, 4)
    assert cli(["eval", "--checkpoint", str(out / "checkpoint.pth"), "--eval-sizes", "80,160", "--workers", "0",
                "--no-progress", "--json"]) == 0  # fmt: skip
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(report["eval"]["sizes"]) == {"80", "160"}


def test_init_from_a_hugging_face_folder_trains_with_a_peg_and_resumes(data, tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    config = tiny_rtdetr_config(transformers)
    folder = tmp_path / "hf"
    transformers.RTDetrForObjectDetection(config).save_pretrained(folder)
    out = tmp_path / "run"
    argv = ["train", "--config", "rtdetr_demo_tiny", "--data-root", str(data), "--output-dir", str(out),
            "--init", str(folder), "--epochs", "2", "--stop-after-epoch", "1", "--workers", "0", "--no-progress"]  # fmt: skip
    assert cli(argv) == 0
    assert "converted" in capsys.readouterr().out  # the PEG, added at zero
    ckpt = read_checkpoint(out / "checkpoint.pth", "detect")
    assert ckpt["model_config"]["hf_config"]["model_type"] == "rt_detr" and ckpt["epoch"] == 0
    assert cli([*argv[:-5], "--epochs", "2", "--resume", "auto", "--workers", "0", "--no-progress"]) == 0
    assert read_checkpoint(out / "checkpoint.pth", "detect")["epoch"] == 1
    assert load_model(out / "checkpoint.pth").model.num_classes == 4


def test_export_hf_of_a_trained_sincos_checkpoint_loads_in_transformers(data, tmp_path, trained, capsys):
    """A run built by build_rtdetr (no folder behind it) goes back as an RTDetrForObjectDetection folder."""
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "sincos"
    train_main(
        ["--config", "rtdetr_demo_tiny", "--pos-enc", "sincos", "--data-root", str(data), "--output-dir", str(out),
         "--epochs", "1", "--workers", "0", "--device", "cpu", "--no-progress", "--seed", "3"]
    )  # fmt: skip
    folder = tmp_path / "hf"
    assert cli(["export-hf", str(out / "checkpoint.pth"), str(folder)]) == 0
    hf = transformers.RTDetrForObjectDetection.from_pretrained(folder).eval()
    ours = load_model(out / "checkpoint.pth").model  # the EMA weights, as eval reads them
    names = load_model(out / "checkpoint.pth").classes
    # the folder holds the labels that name a category (ids 1..3): label 0, no category, is left out
    named = [i for i, n in enumerate(names) if n]
    assert named == [1, 2, 3] and [hf.config.id2label[k] for k in range(3)] == [names[i] for i in named]
    for size in ((96, 96), (64, 128)):
        x = torch.rand(2, 3, *size, generator=torch.Generator().manual_seed(sum(size)))
        with torch.no_grad():
            want, got = hf(pixel_values=x), ours(x)
        torch.testing.assert_close(got["pred_logits"][..., named], want.logits, atol=1e-4, rtol=0)
        torch.testing.assert_close(got["pred_boxes"], want.pred_boxes, atol=1e-4, rtol=0)
    capsys.readouterr()
    peg_run, _ = trained  # a PEG has no place in transformers' RT-DETR: one line, nothing written
    assert cli(["export-hf", str(peg_run / "checkpoint.pth"), str(tmp_path / "refused")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot export to Hugging Face RT-DETR: ") and err.count("\n") == 1, err
    assert "'peg'" in err and not (tmp_path / "refused").exists()
