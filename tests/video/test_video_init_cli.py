"""``python -m peg_video train --init FOLDER`` from Hugging Face folders, the VideoMAE recipes, ``export-hf``.

The folders are tiny random VideoMAE / TimeSformer classifiers written with ``save_pretrained``
(nothing is downloaded); the data is ``make-data``'s moving shapes.
"""

import contextlib
import io
import json

import pytest
import torch

from peg_core.engine import EXIT_ERROR, EXIT_USAGE, read_checkpoint
from peg_video.__main__ import main
from peg_video.cli import parse_train_args
from peg_video.configs import CONFIGS, FINETUNE_CONFIGS, VIDEOMAE_MEAN, VIDEOMAE_STD
from peg_video.model import load_model

transformers = pytest.importorskip("transformers")

#: the tiny folders' clip: 4 frames of 32 px in tubelets 2x8x8 (VideoMAE) / 1x8x8 (TimeSformer)
SIZES = {"image_size": 32, "patch_size": 8, "num_frames": 4, "hidden_size": 32, "num_hidden_layers": 1,
         "num_attention_heads": 2, "intermediate_size": 64, "num_labels": 3}  # fmt: skip
#: a normalisation unlike both defaults, so the tests see where it came from
FOLDER_MEAN, FOLDER_STD = [0.5, 0.4, 0.3], [0.2, 0.25, 0.3]
RUN = ["--epochs", "1", "--batch-size", "4", "--num-clips", "1", "--stride", "2", "--no-progress",
       "--workers", "0", "--device", "cpu", "--eval-every", "0"]  # fmt: skip


def _videomae(folder, seed=0, preprocessor=True, **sizes):
    torch.manual_seed(seed)
    cfg = transformers.VideoMAEConfig(**{**SIZES, "tubelet_size": 2, **sizes})
    transformers.VideoMAEForVideoClassification(cfg).eval().save_pretrained(folder)
    if preprocessor:  # the keys of VideoMAEImageProcessor's preprocessor_config.json
        pre = {
            "image_processor_type": "VideoMAEImageProcessor",
            "image_mean": FOLDER_MEAN,
            "image_std": FOLDER_STD,
        }
        (folder / "preprocessor_config.json").write_text(json.dumps(pre))
    return folder


VIDEOS = dict(num_train=4, num_val=2, frames=8)  # the module's ``data`` (tests/video/conftest.py)


@pytest.fixture(scope="module")
def videomae(tmp_path_factory):
    return _videomae(tmp_path_factory.mktemp("videomae"))


def _train(data, out, *extra):
    argv = ["train", "--train-ann", str(data / "train.csv"), "--val-ann", str(data / "val.csv")]
    return [*argv, "--output-dir", str(out), *RUN, *extra]


@pytest.fixture(scope="module")
def peg_run(data, videomae, tmp_path_factory):
    """One epoch from the VideoMAE folder with a PEG3d instead of its table (lr 1e-6: weights ~ the folder's).

    Returns the run folder and what the command printed.
    """
    out = tmp_path_factory.mktemp("peg_run")
    argv = _train(
        data, out, "--init", str(videomae), "--pos-enc", "peg3d", "--lr", "1e-6", "--min-lr", "1e-8"
    )
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert main(argv) == 0
    return out, printed.getvalue()


@pytest.fixture(scope="module")
def table_run(data, videomae, tmp_path_factory):
    """One epoch from the VideoMAE folder with its own table (the default)."""
    out = tmp_path_factory.mktemp("table_run")
    assert main(_train(data, out, "--init", str(videomae))) == 0
    return out


def _fails(capsys, argv, code=EXIT_ERROR) -> str:
    """Run ``argv``; the exit code, one line on stderr without a traceback; returns that line."""
    capsys.readouterr()
    try:
        assert main(argv) == code
    except SystemExit as e:  # argparse's usage error
        assert e.code == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err.strip()


def test_peg3d_run_starts_from_the_folder_and_records_its_input(peg_run, videomae):
    from peg_video.interop.hf import from_hf

    peg_run = peg_run[0]
    ckpt = read_checkpoint(peg_run / "checkpoint.pth", "video")
    config, args, meta = ckpt["model_config"], ckpt["args"], ckpt["meta"]
    classes = len(meta["classes"])  # the data's classes (4 of 6 drawn), not the folder's 3
    assert config["pos_enc"] == "peg3d" and config["num_classes"] == classes == 4
    # the folder's clip and normalisation, the VideoMAE recipe's stride (the flag given: 2) and test side
    assert (args["num_frames"], args["crop"], args["test_scale"], args["stride"]) == (4, 32, 32, 2)
    assert args["mean"] == FOLDER_MEAN and args["std"] == FOLDER_STD
    assert meta["input"]["mean"] == FOLDER_MEAN and meta["init"]["kind"] == "hugging-face folder"
    assert args["arch"] == "videomae" and args["pos_enc"] == "peg3d"
    # the weights are the folder's (one step at lr 1e-6 moves them by ~1e-6)
    ref, _ = from_hf(videomae, "peg3d", num_classes=classes)
    for key in ("patch_embed.proj.weight", "blocks.0.attn.qkv.weight", "blocks.0.mlp.fc2.weight"):
        diff = (ckpt["model"][key] - ref.state_dict()[key]).abs().max().item()
        assert 0 < diff < 1e-4, (key, diff)
    # the checkpoint alone rebuilds the model (eval / predict / export do not need the folder)
    loaded = load_model(peg_run / "checkpoint.pth")
    assert set(loaded.model.state_dict()) == set(ref.state_dict())


def test_peg3d_run_evaluates_and_predicts_with_the_folders_normalisation(peg_run, data, tmp_path, capsys):
    peg_run = peg_run[0]
    from peg_video.data.loaders import transform_config
    from peg_video.predict import Predictor

    argv = ["eval", "--checkpoint", str(peg_run / "checkpoint.pth"), "--no-progress", "--workers", "0"]
    assert main([*argv, "--device", "cpu", "--output-dir", str(tmp_path / "ev"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["eval"]["num_videos"] == 2 and (report["eval"]["num_frames"], report["eval"]["crop"]) == (
        4,
        32,
    )
    cfg = transform_config(Predictor.from_checkpoint(peg_run / "checkpoint.pth").run_args)
    assert (list(cfg.mean), list(cfg.std)) == (FOLDER_MEAN, FOLDER_STD)


def test_the_load_report_is_printed(peg_run, videomae):
    out = peg_run[1]
    assert f"Hugging Face init from {videomae}: " in out and "copied" in out and "left at init" in out
    assert "training videomae/peg3d on 4 videos" in out


def test_input_defaults_flags_and_recipes(videomae, data):
    base = ["--train-ann", str(data / "train.csv"), "--init", str(videomae)]
    args = parse_train_args(base)
    assert (args.pos_enc, args.arch, args.tubelet) == ("table", "videomae", [2, 8, 8])
    # the folder's clip at the VideoMAE recipe's stride; the scale jitter 256..320 scaled to the crop
    assert (args.num_frames, args.stride, args.crop, args.test_scale) == (4, 4, 32, 32)
    assert args.scale_jitter == [37, 46] and (args.mean, args.std) == (FOLDER_MEAN, FOLDER_STD)
    args = parse_train_args([*base, "--num-frames", "8", "--crop", "48", "--mean", "0.1,0.2,0.3"])
    assert (args.num_frames, args.crop, args.mean, args.std) == (8, 48, [0.1, 0.2, 0.3], FOLDER_STD)
    # a recipe's clip wins over the folder's; the folder's normalisation over the recipe's
    args = parse_train_args([*base, "--config", "k400_videomae_s_ft_peg3d"])
    assert (args.num_frames, args.stride, args.crop, args.num_clips, args.pos_enc) == (16, 4, 224, 5, "peg3d")
    assert args.mean == FOLDER_MEAN and args.model_opts == {"drop_path_rate": 0.1} and args.num_heads is None
    # without a preprocessor config: the VideoMAE recipe's ImageNet normalisation
    bare = _videomae(videomae.parent / "bare", preprocessor=False)
    args = parse_train_args(["--train-ann", str(data / "train.csv"), "--init", str(bare)])
    assert (args.mean, args.std) == (list(VIDEOMAE_MEAN), list(VIDEOMAE_STD))
    # no folder: Kinetics' normalisation, recorded
    args = parse_train_args(["--train-ann", str(data / "train.csv")])
    assert (args.mean, args.std) == ([0.45] * 3, [0.225] * 3)


def test_videomae_recipes_parse(videomae, data):
    assert set(FINETUNE_CONFIGS) == {"k400_videomae_s_ft", "k400_videomae_s_ft_peg3d", "ssv2_videomae_s_ft",
                                     "ssv2_videomae_s_ft_peg3d"}  # fmt: skip
    assert CONFIGS["k400_videomae_s_ft"]["lr"] == pytest.approx(5e-4 * 384 / 256)
    for name in FINETUNE_CONFIGS:
        ssv2 = name.startswith("ssv2")
        where = ["--data-root", str(data)] if ssv2 else ["--train-ann", str(data / "train.csv")]
        args = parse_train_args(["--config", name, "--init", str(videomae), *where])
        assert args.pos_enc == ("peg3d" if name.endswith("peg3d") else "table")
        assert (args.dataset, args.sampling, args.hflip) == (
            ("ssv2", "segment", False) if ssv2 else ("kinetics", "stride", True)
        )
        assert (args.epochs, args.num_clips, args.num_crops) == ((40, 2, 3) if ssv2 else (150, 5, 3))
        # every other recipe value is the parser's default; the model's come from the folder
        folder_keys = ("arch", "tubelet", "pos_enc", "mean", "std")
        assert {k: getattr(args, k) for k in CONFIGS[name] if k not in folder_keys} == {
            k: v for k, v in CONFIGS[name].items() if k not in folder_keys
        }
        assert (args.arch, args.tubelet, args.mean) == ("videomae", [2, 8, 8], FOLDER_MEAN)


def test_bad_init_folders_are_one_line_errors(data, videomae, tmp_path, capsys):
    missing = tmp_path / "no_such_folder"
    err = _fails(capsys, _train(data, tmp_path / "o", "--init", str(missing)))
    assert err.startswith("error: --init checkpoint not found") and err.endswith(str(missing))
    empty = tmp_path / "empty"
    empty.mkdir()
    err = _fails(capsys, _train(data, tmp_path / "o", "--init", str(empty)))
    assert "config.json" in err and str(empty) in err, err
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 32}))
    err = _fails(capsys, _train(data, tmp_path / "o", "--init", str(bert)))
    assert "'bert'" in err and str(bert) in err, err
    # weights of another width under this config.json
    other = _videomae(tmp_path / "wide", hidden_size=48)
    (other / "config.json").write_text((videomae / "config.json").read_text())
    err = _fails(capsys, _train(data, tmp_path / "o", "--init", str(other), "--pos-enc", "peg3d"))
    assert str(other) in err and "shape" in err, err
    assert not (tmp_path / "o" / "checkpoint.pth").exists()


@pytest.mark.parametrize(
    ("name", "change", "message"),
    [
        ("config.json", {"tubelet_size": 0}, "config.json key 'tubelet_size' must be a positive int; got 0"),
        ("config.json", {"patch_size": [8]}, "config.json key 'patch_size' must be a positive int or a list "
                                             "[height, width] of two, each up to 32; got [8]"),
        ("preprocessor_config.json", {"image_std": 0}, "preprocessor_config.json key 'image_std' must be a number "
                                                       "or a list of 3 numbers, each > 0; got 0"),
    ],
)  # fmt: skip
def test_bad_folder_fields_are_one_line_before_any_video(
    data, videomae, tmp_path, capsys, name, change, message
):
    """``image_std: 0`` is named here, not met later as a training that reports ``loss is nan``."""
    folder = tmp_path / "folder"
    folder.mkdir()
    for file in ("config.json", "preprocessor_config.json", "model.safetensors"):
        (folder / file).write_bytes((videomae / file).read_bytes())
    (folder / name).write_text(json.dumps({**json.loads((videomae / name).read_text()), **change}))
    err = _fails(capsys, _train(data, tmp_path / "o", "--init", str(folder)))
    assert err == f"error: {message}: {folder / name}"
    assert not (tmp_path / "o").exists()


def test_shape_flags_are_refused_with_a_folder(data, videomae, tmp_path, capsys):
    base = _train(data, tmp_path / "o", "--init", str(videomae))
    for extra, message in (
        (["--arch", "vit_small"], "argument --arch: the model comes from the Hugging Face folder"),
        (["--num-heads", "4"], "argument --num-heads: the model comes from the Hugging Face folder"),
        (["--tubelet", "2,16,16"], "argument --tubelet: the model comes from the Hugging Face folder"),
        (["--model-opt", "depth=2"], "argument --model-opt: depth would change the shapes"),
        (
            ["--peg-at", "0"],
            "argument --peg-at: has no effect without a PEG (--pos-enc table: the folder's sinusoid-1d)",
        ),
    ):
        assert _fails(capsys, [*base, *extra], EXIT_USAGE).startswith(
            f"error: python -m peg_video train: {message}"
        )
    no_folder = _train(data, tmp_path / "o")
    err = _fails(capsys, [*no_folder, "--config", "k400_videomae_s_ft"], EXIT_USAGE)
    assert "k400_videomae_s_ft fine-tunes pre-trained weights; give --init FOLDER" in err
    assert "table keeps the position encoding" in _fails(
        capsys, [*no_folder, "--pos-enc", "table"], EXIT_USAGE
    )


def test_export_hf_round_trip(table_run, peg_run, tmp_path, capsys):
    peg_run = peg_run[0]
    out = tmp_path / "exported"
    assert main(["export-hf", str(table_run / "checkpoint.pth"), str(out)]) == 0
    hf = transformers.VideoMAEForVideoClassification.from_pretrained(out).eval()
    ours = load_model(table_run / "checkpoint.pth").model.eval()
    clip = torch.randn(2, 3, 4, 32, 32)  # peg_video: (B, 3, T, H, W); transformers: (B, T, 3, H, W)
    with torch.no_grad():
        want, got = ours(clip), hf(pixel_values=clip.transpose(1, 2)).logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert hf.config.num_labels == 4
    err = _fails(capsys, ["export-hf", str(peg_run / "checkpoint.pth"), str(tmp_path / "x")])
    assert "has no table" in err and err.endswith(str(peg_run / "checkpoint.pth")), err


def test_timesformer_folder_fine_tunes(data, tmp_path):
    torch.manual_seed(0)
    folder = tmp_path / "timesformer"
    transformers.TimesformerForVideoClassification(transformers.TimesformerConfig(**SIZES)).save_pretrained(
        folder
    )
    out = tmp_path / "run"
    assert main(_train(data, out, "--init", str(folder), "--pos-enc", "peg3d")) == 0
    ckpt = read_checkpoint(out / "checkpoint.pth", "video")
    assert ckpt["model_config"]["attention"] == "divided" and ckpt["args"]["arch"] == "timesformer"
    assert ckpt["args"]["mean"] == list(VIDEOMAE_MEAN)  # no preprocessor config: the recipe's
