"""``python -m peg_core make-data|train|eval|predict`` in process: exact resume, flags, folders, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from peg_core.__main__ import main
from peg_core.classify.cli import CONFIGS, build_eval_parser, build_train_parser
from peg_core.engine import CHECKPOINT_KEYS, read_checkpoint
from tests.core.classify_runs import (
    keep_threads,  # noqa: F401 (autouse: restores torch's threads)
    no_peg,
    one_line_error,
    tiny,
)

#: a tiny CPVT on 16 px shapes: a run of one or two epochs takes a second or two
TINY = tiny(48, 24)


def _train(out: Path, *extra: str) -> int:
    return main(["train", *TINY, "--output-dir", str(out), *extra])


def test_resume_is_exact(tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    assert _train(full, "--epochs", "2") == 0
    assert _train(part, "--epochs", "2", "--stop-after-epoch", "1") == 0
    assert json.loads((part / "report.json").read_text())["status"] == "stopped"
    assert _train(part, "--epochs", "2", "--resume", "auto") == 0
    a, b = (
        read_checkpoint(full / "checkpoint.pth", "classify"),
        read_checkpoint(part / "checkpoint.pth", "classify"),
    )
    assert a["step"] == b["step"] == 12 and a["epoch"] == b["epoch"] == 1
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k
    assert a["metrics"] == b["metrics"]
    for k, v in a["optimizer"]["state"].items():
        assert torch.equal(v["exp_avg"], b["optimizer"]["state"][k]["exp_avg"]), k


def test_train_eval_predict_on_generated_shapes(tmp_path, capsys):
    run = tmp_path / "run"
    learned = ["train", *no_peg(TINY), "--output-dir", str(run), "--pos-enc", "learned", "--mode", "nearest"]
    assert main([*learned, "--epochs", "1"]) == 0
    ckpt = read_checkpoint(run / "checkpoint.pth", "classify")
    assert set(CHECKPOINT_KEYS) <= set(ckpt)
    assert ckpt["model_config"] == {
        "arch": "demo", "pos_enc": "learned", "img_size": 16, "num_classes": 12, "pos_interpolation": "nearest",
        "embed_dim": 16, "depth": 1, "num_heads": 2,
    }  # fmt: skip
    assert ckpt["meta"]["classes"][:2] == ["square_top_left", "square_top_right"]
    trained = json.loads((run / "report.json").read_text())
    assert trained["broken"]["train"] == {"count": 0, "total": 48, "samples": []}

    code = main(["eval", "--checkpoint", str(run / "checkpoint.pth"), "--eval-sizes", "16,24",
                 "--output-dir", str(tmp_path / "ev"), "--no-progress", "--device", "cpu"])  # fmt: skip
    assert code == 0
    ev = json.loads((tmp_path / "ev" / "report.json").read_text())
    assert ev["command"] == "eval" and ev["eval"]["sizes"] == [16, 24] and ev["eval"]["samples"] == 24
    assert list(ev["eval"]["top1_by_size"]) == ["16", "24"] and list(ev["eval"]["top5_by_size"]) == [
        "16",
        "24",
    ]
    # the same weights on the same 24 validation scenes at the training size: the training run's number
    assert ev["eval"]["top1"] == trained["eval"]["top1"] == ev["eval"]["top1_by_size"]["16"]
    assert all(round(v * 24) == pytest.approx(v * 24) for v in ev["eval"]["top1_by_size"].values())
    out = capsys.readouterr().out
    assert "16 px top1" in out
    # one closing line, the report's own keys and numbers, and where the report is
    top1, top5 = ev["eval"]["top1"], ev["eval"]["top5_by_size"]["16"]
    assert out.splitlines()[-1] == (
        f"eval done: top1 {top1:.3f} top5 {top5:.3f} at 16 px ({tmp_path / 'ev' / 'report.json'})"
    )

    shapes = tmp_path / "shapes"
    assert main(["make-data", str(shapes), "--num-train", "12", "--num-val", "12", "--img-size", "16"]) == 0
    images = sorted((shapes / "val").glob("*/*.png"))[:2]
    (tmp_path / "notes.jpg").write_text("not an image")
    capsys.readouterr()
    argv = ["predict", "--checkpoint", str(run / "checkpoint.pth"), "--top-k", "3", "--device", "cpu"]
    assert (
        main([*argv, *map(str, images), str(tmp_path / "notes.jpg"), "--output", str(tmp_path / "p.json")])
        == 0
    )
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4 and lines[0].startswith(f"{images[0]}: ") and lines[0].count(",") == 2
    assert lines[2] == f"{tmp_path / 'notes.jpg'}: skipped (not an image (no image format recognised))"
    assert lines[3] == f"predict done: 2 images, 1 skipped ({tmp_path / 'p.json'})"
    rows = json.loads((tmp_path / "p.json").read_text())["predictions"]  # the --json report
    assert [len(r["top"]) for r in rows] == [3, 3, 0] and rows[2]["skipped"]
    assert all(r["top"][0]["class"] in ckpt["meta"]["classes"] for r in rows[:2])
    probs = [t["p"] for t in rows[0]["top"]]
    assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1.0 + 1e-6
    # nothing readable: one line, exit 1
    code = main(["predict", "--checkpoint", str(run / "checkpoint.pth"), str(tmp_path / "notes.jpg")])
    err = one_line_error(capsys, code)
    assert (
        err
        == f"error: cannot read the image (not an image (no image format recognised)): {tmp_path / 'notes.jpg'}"
    )


def test_image_folder_from_make_data_with_broken_files(tmp_path, capsys):
    data = tmp_path / "shapes"
    assert main(["make-data", str(data), "--num-train", "36", "--num-val", "12", "--img-size", "16"]) == 0
    out = capsys.readouterr().out
    assert f"train on them: python -m peg_core train --config demo --data-root {data}" in out
    classes = sorted(p.name for p in (data / "train").iterdir())
    assert len(classes) == 12 and len(list((data / "train").glob("*/*.png"))) == 36
    good = next((data / "train" / "ring_top_left").glob("*.png"))
    (data / "train" / "ring_top_left" / "cut.png").write_bytes(good.read_bytes()[:70])
    (data / "train" / "plus_top_right" / "text.jpg").write_text("not a jpeg")

    run = tmp_path / "run"
    assert (
        _train(run, "--config", "demo", "--data-root", str(data), "--epochs", "1", "--max-broken", "10%") == 0
    )
    report = json.loads((run / "report.json").read_text())
    broken = report["broken"]["train"]
    assert broken["count"] == 2 and broken["total"] == 38
    assert [s["path"] for s in broken["samples"]] == [
        str(data / "train" / "plus_top_right" / "text.jpg"), str(data / "train" / "ring_top_left" / "cut.png"),
    ]  # fmt: skip
    assert broken["samples"][0]["reason"] == "not an image (no image format recognised)"
    assert broken["samples"][1]["reason"].startswith("cannot decode image (OSError")
    assert report["eval"]["samples"] == 12
    meta = read_checkpoint(run / "checkpoint.pth", "classify")["meta"]
    assert meta["classes"] == classes and meta["data"]["kind"] == "folder" and meta["crop_ratio"] == 1.0

    # eval re-reads the training folder (its path is in the checkpoint) at two sizes
    assert (
        main(["eval", "--checkpoint", str(run / "checkpoint.pth"), "--eval-sizes", "12,16", "--no-progress"])
        == 0
    )
    # by default the eval report goes to eval/ beside the checkpoint: the training report stays
    ev = json.loads((run / "eval" / "report.json").read_text())["eval"]
    assert ev["top1"] == pytest.approx(report["eval"]["top1"]) and list(ev["top1_by_size"]) == ["12", "16"]
    assert json.loads((run / "report.json").read_text()) == report

    # the default --max-broken (1%): 2 of 38 stop the run with one line
    capsys.readouterr()
    err = one_line_error(
        capsys, _train(tmp_path / "run2", "--config", "demo", "--data-root", str(data), "--epochs", "1")
    )
    assert err.startswith(
        "error: too many broken samples in split 'train': 2 of 38 (more than --max-broken 1.0%)"
    )


def test_common_and_task_flags_parse():
    args = build_train_parser().parse_args([
        "--config", "demo", "--output-dir", "o", "--resume", "auto", "--epochs", "3", "--batch-size", "4",
        "--lr", "1e-3", "--workers", "0", "--amp", "bf16", "--clip-max-norm", "0.5", "--device", "cpu",
        "--seed", "7", "--eval-every", "0", "--save-every", "1", "--stop-after-epoch", "1", "--max-broken", "5%",
        "--threads", "1", "--find-unused-parameters", "--no-progress", "--debug", "--data-root", "d",
        "--arch", "cpvt_tiny", "--pos-enc", "sincos", "--peg-at", "0,1", "--global-pool", "avg",
        "--pos-interpolation", "bilinear", "--img-size", "64", "--weight-decay", "0", "--warmup-epochs", "0.5",
        "--augment", "none", "--crop-ratio", "0.9", "--normalize", "imagenet",
    ])  # fmt: skip
    assert (args.epochs, args.batch_size, args.lr, args.amp, args.clip_max_norm, args.seed) == (
        3,
        4,
        1e-3,
        "bf16",
        0.5,
        7,
    )
    assert (args.max_broken, args.peg_at, args.resume, args.progress) == (0.05, [0, 1], "auto", False)
    # --config supplies defaults that explicit flags override; the plain defaults are the demo recipe's
    from peg_core.engine import parse_with_config

    recipe = parse_with_config(build_train_parser(), ["--config", "demo_quick", "--epochs", "5"], CONFIGS)
    assert (recipe.epochs, recipe.num_train, recipe.augment, recipe.normalize) == (5, 512, "none", "half")
    plain = build_train_parser().parse_args([])
    assert (plain.epochs, plain.batch_size, plain.lr, plain.weight_decay, plain.clip_max_norm) == (
        6,
        16,
        2e-3,
        0.05,
        1.0,
    )
    ev = build_eval_parser().parse_args(["--checkpoint", "c.pth", "--eval-sizes", "36,48", "--mode", "nearest",
                                         "--batch-size", "8", "--workers", "0", "--amp", "off", "--threads", "1"])  # fmt: skip
    assert (ev.eval_sizes, ev.pos_interpolation, ev.batch_size) == ([36, 48], "nearest", 8)


def _folder(root: Path, layout: dict[str, list[str]]) -> Path:
    for split, classes in layout.items():
        (root / split).mkdir(parents=True, exist_ok=True)
        for c in classes:
            (root / split / c).mkdir()
    return root


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda t: t / "missing", "data folder not found: {data}"),
        (lambda t: _folder(t / "d", {"val": ["a"]}), "data folder has no train/ folder (expected PATH/train/<class>/*.jpg and PATH/val/<class>/*.jpg): {data}"),
        (lambda t: _folder(t / "d", {"train": [], "val": []}), "no class folders (expected PATH/train/<class>/*.jpg and PATH/val/<class>/*.jpg): {data}/train"),
        (lambda t: _folder(t / "d", {"train": ["cat"], "val": ["cat"]}), "class folder holds no images (.jpg, .jpeg, .png, .ppm, ...): {data}/train/cat"),
    ],
)  # fmt: skip
def test_bad_data_folders_are_one_line_errors(tmp_path, capsys, make, message):
    data = make(tmp_path)
    err = one_line_error(capsys, _train(tmp_path / "run", "--data-root", str(data)))
    assert err == "error: " + message.format(data=data)


def test_usage_and_checkpoint_errors(tmp_path, capsys):
    err = one_line_error(capsys, main(["eval", "--eval-sizes", "48"]), 2)
    assert "the following arguments are required: --checkpoint" in err
    err = one_line_error(capsys, _train(tmp_path / "r", "--epochs", "0"), 2)
    assert (
        err
        == "error: python -m peg_core train: argument --epochs: expected a positive integer, got '0' (see --help)"
    )
    err = one_line_error(capsys, _train(tmp_path / "r", "--peg-at", "3"))
    assert err == (
        "error: cannot build the model (peg_at=[3] has indices [3] outside -1 (before block 0) .. 0 "
        "(1 blocks)): --arch demo"
    )

    detr = tmp_path / "detr.pth"
    torch.save({"format": "peg-checkpoint/1", "task": "detect", "model": {"w": torch.zeros(1)}}, detr)
    err = one_line_error(capsys, main(["eval", "--checkpoint", str(detr), "--no-progress"]))
    assert (
        err == f"error: wrong model: checkpoint is for task 'detect', this command needs 'classify': {detr}"
    )
    err = one_line_error(capsys, main(["predict", "--checkpoint", str(detr), str(detr)]))
    assert "wrong model" in err

    assert _train(tmp_path / "run", "--epochs", "1") == 0
    whole = (tmp_path / "run" / "checkpoint.pth").read_bytes()
    cut = tmp_path / "cut.pth"
    cut.write_bytes(whole[: len(whole) // 2])
    capsys.readouterr()
    err = one_line_error(capsys, main(["eval", "--checkpoint", str(cut), "--no-progress"]))
    assert err.startswith("error: checkpoint is truncated") and err.endswith(str(cut))
    # the checkpoint is read before the images (a missing image is only skipped, as in every predict)
    err = one_line_error(capsys, main(["predict", "--checkpoint", str(cut), str(tmp_path / "nope.png")]))
    assert err.startswith("error: checkpoint is truncated") and err.endswith(str(cut))


def test_make_data_refuses_a_used_folder(tmp_path, capsys):
    (tmp_path / "d" / "val").mkdir(parents=True)
    err = one_line_error(
        capsys, main(["make-data", str(tmp_path / "d"), "--num-train", "1", "--num-val", "1"])
    )
    assert (
        err
        == f"error: output folder already holds val/; remove it or choose another folder: {tmp_path / 'd'}"
    )


def test_eval_never_overwrites_the_training_report(tmp_path, capsys):
    run = tmp_path / "run"
    assert _train(run, "--epochs", "1") == 0
    trained = (run / "report.json").read_text()
    ckpt = str(run / "checkpoint.pth")
    capsys.readouterr()
    err = one_line_error(
        capsys, main(["eval", "--checkpoint", ckpt, "--output-dir", str(run), "--no-progress"])
    )
    assert err == (
        "error: output folder holds a training report (report.json); pass --overwrite to replace it, or choose "
        f"another folder (default: {run / 'eval'}): {run}"
    )
    assert (run / "report.json").read_text() == trained
    assert main(["eval", "--checkpoint", ckpt, "--no-progress"]) == 0
    assert json.loads((run / "eval" / "report.json").read_text())["command"] == "eval"
    assert main(["eval", "--checkpoint", ckpt, "--no-progress"]) == 0  # an eval report may be replaced
    assert (run / "report.json").read_text() == trained


def test_closing_lines_and_json(tmp_path, capsys):
    run = tmp_path / "run"
    capsys.readouterr()
    assert _train(run, "--epochs", "1") == 0
    report = json.loads((run / "report.json").read_text())
    m = report["eval"]
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == f"train done: top1 {m['top1']:.3f} top5 {m['top5']:.3f}, 1 epoch, 0 skipped ({run})"
    # --json: the report is the only stdout line; the epoch lines went to stderr
    assert _train(tmp_path / "j", "--epochs", "1", "--json") == 0
    captured = capsys.readouterr()
    (line,) = captured.out.splitlines()
    assert json.loads(line) == json.loads((tmp_path / "j" / "report.json").read_text())
    assert "epoch 1/1" in captured.err
    ckpt = str(run / "checkpoint.pth")
    assert main(["eval", "--checkpoint", ckpt, "--eval-sizes", "16", "--no-progress", "--json"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert json.loads(line) == json.loads((run / "eval" / "report.json").read_text())
    shapes = tmp_path / "shapes"
    assert (
        main(["make-data", str(shapes), "--num-train", "12", "--num-val", "12", "--img-size", "16", "--json"])
        == 0
    )
    (line,) = capsys.readouterr().out.splitlines()
    assert json.loads(line) == {
        "command": "make-data",
        "train": 12,
        "val": 12,
        "img_size": 16,
        "out": str(shapes),
    }
    image = sorted((shapes / "val").glob("*/*.png"))[0]
    assert (
        main(["predict", "--checkpoint", ckpt, str(image), "--top-k", "2", "--device", "cpu", "--json"]) == 0
    )
    (line,) = capsys.readouterr().out.splitlines()
    (row,) = json.loads(line)["predictions"]
    assert row["path"] == str(image) and len(row["top"]) == 2 and row["skipped"] is None


def test_configs_verb_and_print_config(tmp_path, capsys):
    capsys.readouterr()
    assert main(["configs"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("demo: the `make demo` recipe") and out[1].strip().startswith(
        "--arch demo --pos-enc peg"
    )
    assert out[2].startswith("demo_quick: ") and "--num-train 512" in out[3] and "--epochs 2" in out[3]
    assert main(["configs", "demo_quick"]) == 0
    settings = json.loads(capsys.readouterr().out)
    assert (settings["num_train"], settings["epochs"], settings["lr"], settings["workers"]) == (
        512,
        2,
        2e-3,
        2,
    )
    err = one_line_error(capsys, main(["configs", "nope"]), 2)
    assert (
        err
        == "error: python -m peg_core configs: unknown recipe 'nope'; choose from demo, demo_quick (see --help)"
    )
    # --print-config: the recipe, then the flags; nothing trained, nothing written
    never = tmp_path / "never"
    assert (
        main(
            ["train", "--config", "demo_quick", "--epochs", "3", "--output-dir", str(never), "--print-config"]
        )
        == 0
    )
    resolved = json.loads(capsys.readouterr().out)
    assert (resolved["epochs"], resolved["num_train"], resolved["output_dir"]) == (3, 512, str(never))
    assert not never.exists()


def test_predictor_api(tmp_path):
    from PIL import Image
    from torchvision.transforms.v2.functional import pil_to_tensor

    from peg_core.classify.predict import Prediction, Predictor

    run = tmp_path / "run"
    assert _train(run, "--epochs", "1") == 0
    predictor = Predictor.from_checkpoint(run / "checkpoint.pth", device="cpu", top_k=3)
    shapes = tmp_path / "shapes"
    assert main(["make-data", str(shapes), "--num-train", "12", "--num-val", "12", "--img-size", "16"]) == 0
    image = sorted((shapes / "val").glob("*/*.png"))[0]
    (tmp_path / "bad.png").write_text("no")
    by_path = predictor.predict_files([image, tmp_path / "bad.png"])
    assert [type(p) for p in by_path] == [Prediction, Prediction] and by_path[1].skipped.startswith(
        "not an image"
    )
    assert by_path[0].path == str(image) and len(by_path[0].top) == 3 and by_path[1].top == []
    # the same image as a tensor, and as a PIL image: the same classes and probabilities
    with Image.open(image) as im:
        pil = im.convert("RGB")
    tensor = pil_to_tensor(pil)  # uint8 (3, H, W)
    for p in predictor([tensor, pil]):
        assert p.path is None and [c for c, _ in p.top] == [c for c, _ in by_path[0].top]
        assert [v for _, v in p.top] == pytest.approx([v for _, v in by_path[0].top], abs=1e-5)
    assert by_path[0].line().startswith(f"{image}: {by_path[0].top[0][0]} ")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--pos-enc", "sine", "--peg-kernel-size", "5"], "has no effect without a PEG (--pos-enc sine): --peg-kernel-size 5"),
        (["--pos-enc", "rope-mixed", "--peg-padding", "circular"],
         "has no effect without a PEG (--pos-enc rope-mixed): --peg-padding circular"),
        (["--pos-enc", "learned", "--peg-at", "0,1"], "has no effect without a PEG (--pos-enc learned): --peg-at 0,1"),
        (["--pos-enc", "none", "--peg-dynamic"], "has no effect without a PEG (--pos-enc none): --peg-dynamic"),
        (["--pos-interpolation", "nearest"], "has no effect without a learned table (--pos-enc peg): --pos-interpolation nearest"),
        (["--pos-enc", "peg+rope-axial", "--mode", "area"],
         "has no effect without a learned table (--pos-enc peg+rope-axial): --pos-interpolation area"),
        (["--peg-num-kernels", "2"], "sizes the kernel bank of --peg-dynamic, which is off: --peg-num-kernels 2"),
    ],
)  # fmt: skip
def test_train_refuses_flags_without_effect(tmp_path, capsys, flags, message):
    out = tmp_path / "run"
    code = main(["train", *no_peg(TINY), "--output-dir", str(out), *flags, "--print-config"])
    assert one_line_error(capsys, code) == f"error: {message}"
    assert not out.exists()


def test_flags_without_effect_on_an_init_files_model_and_in_eval(tmp_path, capsys):
    learned, peg = tmp_path / "learned", tmp_path / "peg"
    no_table = [*no_peg(TINY), "--epochs", "1"]
    assert main(["train", *no_table, "--output-dir", str(learned), "--pos-enc", "learned"]) == 0
    assert _train(peg, "--epochs", "1") == 0
    capsys.readouterr()
    # --init FILE naming its model: the file's encoding decides (a learned table: no PEG to size)
    out = tmp_path / "ft"
    init = [*no_table, "--init", str(learned / "checkpoint.pth"), "--output-dir", str(out)]
    err = one_line_error(capsys, main(["train", *init, "--peg-kernel-size", "5"]))
    without_peg = "has no effect without a PEG (pos_enc learned of the --init file's model)"
    assert err == f"error: {without_peg}: --peg-kernel-size 5"
    assert not (out / "checkpoint.pth").exists()
    # ... whose learned table --pos-interpolation does resize (without --pos-enc on the command line)
    assert main(["train", *init, "--pos-interpolation", "nearest", "--lr", "1e-9"]) == 0
    assert (
        read_checkpoint(out / "checkpoint.pth", "classify")["model_config"]["pos_interpolation"] == "nearest"
    )
    capsys.readouterr()
    # eval: only a learned table is resized
    ev = ["eval", "--eval-sizes", "16", "--no-progress", "--device", "cpu", "--pos-interpolation", "nearest"]
    code = main([*ev, "--checkpoint", str(peg / "checkpoint.pth"), "--output-dir", str(tmp_path / "e1")])
    without_table = "has no effect without a learned table (the checkpoint's pos_enc peg)"
    assert one_line_error(capsys, code) == f"error: {without_table}: --pos-interpolation nearest"
    code = main([*ev, "--checkpoint", str(learned / "checkpoint.pth"), "--output-dir", str(tmp_path / "e2")])
    assert code == 0
