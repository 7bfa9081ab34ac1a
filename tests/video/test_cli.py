"""The shared flag vocabulary of ``python -m peg_video``: new spellings, hidden old ones, what reaches the model.

Also the checkpoint side of it: ``peg_at: "all"`` of checkpoints written when it meant "before
every block", old argument names, and ``train --init`` with a video or a 2-D checkpoint.
"""

import argparse

import pytest
import torch

from peg_core.engine import UserError
from peg_core.models import CPVT
from peg_video import build_video_model
from peg_video.__main__ import COMMANDS
from peg_video.cli import build_eval_parser, build_make_data_parser, parse_train_args
from peg_video.model import (
    build_model,
    checkpoint_run,
    init_line,
    init_weights,
    load_model,
    model_config_from_args,
)

DATA = ["--train-ann", "a.csv"]
TINY_VIT = {"name": "vit_tiny", "num_classes": 3, "num_frames": 4, "img_size": 16, "tubelet": [2, 8, 8],
            "embed_dim": 16, "depth": 3, "num_heads": 2}  # fmt: skip


def _args(*flags: str) -> argparse.Namespace:
    return parse_train_args([*DATA, *flags])


def test_the_verb_table():
    assert list(COMMANDS) == [
        "make-data",
        "train",
        "eval",
        "predict",
        "configs",
        "models",
        "prepare",
        "export",
        "export-hf",
    ]


def test_configs_verb_lists_every_recipe_with_its_flags(capsys):
    from peg_video.__main__ import main
    from peg_video.configs import CONFIGS, DESCRIPTIONS

    assert set(DESCRIPTIONS) == set(CONFIGS)
    capsys.readouterr()
    assert main(["configs"]) == 0
    out = capsys.readouterr().out.splitlines()
    i = out.index(f"synthetic_tiny: {DESCRIPTIONS['synthetic_tiny']}")
    assert (
        "--arch vit_tiny" in out[i + 1]
        and "--peg-at -1,0" in out[i + 1]
        and "--scale-jitter 32,36" in out[i + 1]
    )
    assert main(["configs", "k400_x3d_xs"]) == 0
    full = __import__("json").loads(capsys.readouterr().out)
    assert (full["arch"], full["num_frames"], full["crop"], full["dataset"]) == ("x3d_xs", 4, 160, "kinetics")


def test_print_config_shows_what_the_checks_resolved(tmp_path, capsys):
    """--print-config runs after the package's checks: a recipe's model keys leave with its --arch."""
    import json

    from peg_video.__main__ import main

    capsys.readouterr()
    argv = [*DATA, "--config", "synthetic_tiny", "--arch", "x3d_xs", "--pos-enc", "none", "--print-config"]
    assert main(["train", *argv, "--output-dir", str(tmp_path / "never")]) == 0
    resolved = json.loads(capsys.readouterr().out)
    assert (resolved["arch"], resolved["peg_at"], resolved["num_heads"], resolved["model_opts"]) == (
        "x3d_xs", None, None, {},
    )  # fmt: skip
    assert resolved["sampling"] == "stride" and not (tmp_path / "never").exists()


@pytest.mark.parametrize(
    ("new", "old"),
    [
        (["--arch", "vit_small"], ["--model", "vit_small"]),
        (["--scale-jitter", "36,40"], ["--train-scale", "36,40"]),
        (["--init", "w.pth"], ["--init-2d", "w.pth"]),
        (["--init", "w.pth", "--init-source", "deit"], ["--init-2d", "w.pth", "--init-2d-source", "deit"]),
        (["--num-heads", "4"], ["--model-opt", "num_heads=4"]),
        (["--peg-at", "0"], ["--model-opt", "peg_at=[0]"]),
        (["--peg-kernel-size", "5"], ["--model-opt", "peg_kernel_size=5"]),
    ],
)
def test_old_spellings_parse_to_the_same_namespace(new, old):
    assert vars(_args("--config", "synthetic_tiny", *new)) == vars(_args("--config", "synthetic_tiny", *old))


def test_make_data_counts_and_eval_interpolation():
    a = build_make_data_parser().parse_args(["out", "--num-train", "7", "--num-val", "3"])
    assert (a.num_train, a.num_val) == (7, 3)
    assert (
        build_eval_parser().parse_args(["--checkpoint", "c", "--pos-interpolation", "area"]).pos_interpolation
        == "area"
    )


def test_peg_flags_reach_the_built_model():
    args = _args("--config", "synthetic_tiny", "--peg-at", "0,1", "--peg-kernel-size", "5", "--peg-padding",
                 "circular", "--peg-dynamic", "--peg-num-kernels", "2", "--num-heads", "4")  # fmt: skip
    config = model_config_from_args(args, 6)
    assert config["peg_at"] == [0, 1] and config["num_heads"] == 4
    model = build_model(config)
    assert tuple(model.pos_blocks) == ("0", "1") and model.blocks[0].attn.num_heads == 4
    peg = model.pos_blocks["0"]
    assert (
        peg.kernel_size == (5, 5, 5)
        and peg.padding_mode == "circular"
        and peg.dynamic
        and peg.num_kernels == 2
    )
    # --peg-separable is the factorized PEG3d (spatial kxk, then temporal k)
    sep = _args("--config", "synthetic_tiny", "--peg-separable")
    assert (
        sep.pos_enc == "peg3d-factorized"
        and build_model(model_config_from_args(sep, 6)).pos_blocks["0"].factorized
    )
    both = _args("--config", "synthetic_tiny", "--pos-enc", "peg3d+rope-3d", "--peg-separable")
    assert both.pos_enc == "peg3d-factorized+rope-3d"
    # a recipe's PEG options are dropped for an encoding without a PEG; --peg-at none asks for none
    table = _args("--config", "synthetic_tiny", "--pos-enc", "sincos")
    assert table.peg_at is None and build_model(model_config_from_args(table, 6)).pos_blocks.keys() == set()
    learned = _args("--pos-enc", "learned", "--pos-interpolation", "nearest")
    assert build_model(model_config_from_args(learned, 6)).pos_enc.interpolation == "nearest"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--pos-enc", "learned", "--peg-kernel-size", "5"],
            "argument --peg-kernel-size: has no effect without a PEG (--pos-enc learned)",
        ),
        (
            ["--pos-enc", "rope-3d", "--peg-padding", "circular"],
            "argument --peg-padding: has no effect without a PEG (--pos-enc rope-3d)",
        ),
        (
            ["--arch", "x3d_xs", "--pos-enc", "none", "--peg-at", "0"],
            "argument --peg-at: has no effect without a PEG (--arch x3d_xs: a CNN without position encoding)",
        ),
        (
            ["--arch", "x3d_xs", "--pos-enc", "none", "--num-heads", "2"],
            "x3d_xs is a CNN without attention heads",
        ),
        (
            ["--pos-interpolation", "nearest"],
            "argument --pos-interpolation: has no effect without a learned table (--pos-enc peg3d)",
        ),
        (
            ["--pos-enc", "learned+peg3d"],
            "argument --pos-enc: the video ViT takes no table+conditional combination",
        ),
        (["--pos-enc", "rope-axial"], "argument --pos-enc: the video ViT has a 3-D token grid"),
        (
            ["--pos-enc", "peg3d-factorized+rope-3d", "--no-peg-separable"],
            "contradicts --pos-enc peg3d-factorized+rope-3d",
        ),
        (["--peg-num-kernels", "3"], "argument --peg-num-kernels: sizes the kernel bank of --peg-dynamic"),
        (["--pos-enc", "peg3d-factorized", "--no-peg-separable"], "contradicts --pos-enc peg3d-factorized"),
        (
            ["--pos-enc", "peg3d-factorized", "--peg-dynamic"],
            "argument --peg-dynamic: not with the factorized",
        ),
        (["--peg-kernel-size", "4"], "argument --peg-kernel-size: expected an odd integer"),
    ],
)
def test_flags_the_model_cannot_honour_are_refused(flags, message, capsys):
    with pytest.raises(SystemExit) as e:
        _args("--config", "synthetic_tiny", *flags)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and message in err, err


def test_recipe_model_options_stay_with_the_recipe_arch():
    # synthetic_tiny's PEG placement and heads describe its own 2-block model, not an X3D / a vit_small
    x3d = _args("--config", "synthetic_tiny", "--arch", "x3d_xs", "--pos-enc", "none")
    assert (x3d.peg_at, x3d.num_heads, x3d.model_opts) == (None, None, {})
    small = _args("--config", "synthetic_tiny", "--arch", "vit_small", "--peg-at", "all")
    assert (small.peg_at, small.num_heads) == ("all", None)
    # a recipe's PEG placement is dropped quietly when the flags pick another encoding
    assert _args("--config", "synthetic_tiny", "--pos-enc", "learned").peg_at is None


def _old_all_checkpoint(depth: int = 3) -> dict:
    """A checkpoint as written when the video ViT's ``peg_at="all"`` meant ``-1 .. depth-2``."""
    config = {**TINY_VIT, "depth": depth, "pos_enc": "peg3d", "peg_at": "all"}
    model = build_video_model(**{**config, "peg_at": list(range(-1, depth - 1))})
    old_args = {"model": "vit_tiny", "train_scale": [16, 20], "init_2d": None, "crop": 16}
    return {"format": "peg-checkpoint/1", "task": "video", "model": model.state_dict(), "model_config": config,
            "meta": {"classes": ["a", "b", "c"]}, "args": old_args}  # fmt: skip


def test_old_all_checkpoint_loads_with_its_weights(tmp_path):
    ckpt = _old_all_checkpoint()
    path = tmp_path / "old.pth"
    torch.save(ckpt, path)
    loaded = load_model(path)
    assert loaded.config["peg_at"] == [-1, 0, 1] and tuple(loaded.model.pos_blocks) == ("-1", "0", "1")
    for key, value in ckpt["model"].items():
        assert torch.equal(loaded.model.state_dict()[key], value), key
    # old argument names come back under today's
    assert (
        loaded.args["arch"] == "vit_tiny"
        and loaded.args["scale_jitter"] == [16, 20]
        and "model" not in loaded.args
    )
    # "all" today: after every block; a checkpoint with those keys keeps that meaning
    today = build_video_model(**{**TINY_VIT, "peg_at": "all"})
    assert tuple(today.pos_blocks) == ("0", "1", "2")
    new = {
        **ckpt,
        "model": today.state_dict(),
        "model_config": {**TINY_VIT, "pos_enc": "peg3d", "peg_at": "all"},
    }
    assert checkpoint_run(new, None)[0]["peg_at"] == "all"


def test_init_takes_a_video_checkpoint(tmp_path):
    ckpt = _old_all_checkpoint()
    path = tmp_path / "video.pth"
    torch.save(ckpt, path)
    model = build_video_model(**{**TINY_VIT, "num_classes": 5, "peg_at": [-1, 0, 1]})
    report = init_weights(model, path)
    assert report.source == str(path) and len(report.copied) == len(ckpt["model"]) - 2
    assert report.missing == ["head.weight", "head.bias"] and "left at init" in report.skipped["head.weight"]
    said = init_line(report)
    assert said.startswith(
        f"--init {path}: {len(ckpt['model']) - 2} copied, 0 converted, 2 source keys skipped"
    )
    assert torch.equal(model.blocks[2].mlp.fc1.weight, ckpt["model"]["blocks.2.mlp.fc1.weight"])
    assert torch.equal(model.pos_blocks["-1"].proj.weight, ckpt["model"]["pos_blocks.-1.proj.weight"])
    with pytest.raises(UserError, match="checkpoint does not fit the model: 2 missing"):
        init_weights(build_video_model(**{**TINY_VIT, "peg_at": [-1, 0, 1, 2]}), path)


def test_init_takes_a_2d_checkpoint(tmp_path):
    torch.manual_seed(0)
    image = CPVT(embed_dim=16, depth=3, num_heads=2, patch_size=8, num_classes=3, img_size=16, pos_enc="peg",
                 peg_at=(0,), global_pool="avg")  # fmt: skip
    path = tmp_path / "image.pth"
    torch.save({"model": image.state_dict()}, path)
    model = build_video_model(**TINY_VIT, peg_at=[0])
    report = init_weights(model, path)
    assert report.source == str(path) and "patch_embed.proj.weight" in report.converted
    assert init_line(report).startswith(f"--init {path}: ")
    assert torch.equal(model.blocks[1].attn.qkv.weight, image.blocks[1].attn.qkv.weight)
    assert model.pos_blocks["0"].proj.weight.shape == (16, 1, 3, 3, 3)


@pytest.fixture
def video_predictor(tmp_path):
    """A Predictor on an untrained tiny ViT saved as a checkpoint (4-frame clips of 32 px, tubelet 2x8x8)."""
    from peg_core.engine import CHECKPOINT_FORMAT, json_safe
    from peg_video.predict import Predictor
    from tests.video.runs import TINY

    args = _args(*TINY)
    config = model_config_from_args(args, 3)
    path = tmp_path / "checkpoint.pth"
    torch.save({"format": CHECKPOINT_FORMAT, "task": "video", "model": build_model(config).state_dict(),
                "model_config": config, "meta": {"classes": ["a", "b", "c"]}, "args": json_safe(args),
                "epoch": 0}, path)  # fmt: skip
    return Predictor, path


def test_predictor_takes_clips_and_refuses_what_is_not_one(video_predictor, tmp_path, monkeypatch):
    import numpy as np

    Predictor, path = video_predictor
    predictor = Predictor.from_checkpoint(path, top_k=2)
    clip = torch.rand(3, 4, 32, 32) * 4 - 2  # normalised pixels: (x - 0.45) / 0.225 lies in [-2, 2.44]
    (want,) = predictor(clip)
    assert want.path is None and len(want.top) == 2
    for same in (clip[None], clip[None].repeat(2, 1, 1, 1, 1), clip.numpy(), clip.double()):
        assert predictor(same)[0].top == want.top
    assert len(predictor([clip, clip])) == 2
    for item, error, message in (
        (clip * 100, ValueError, "clip values span"),
        (clip * float("nan"), ValueError, "clip values are not all finite (NaN or inf): inputs"),
        ((clip * 50).to(torch.uint8), TypeError, "inputs: a tensor of dtype torch.uint8: clips are floats"),
        (clip[:2], ValueError, "has 2 channels at dim -4; the model takes 3: inputs"),
        (clip[:, :0], ValueError, "an empty clip (shape (3, 0, 32, 32)): it has no pixels: inputs"),
        (clip[:, :3], ValueError, "a clip of (T, H, W) = (3, 32, 32) does not split into the model's tubelets (2, 8, 8): inputs"),
        (clip[0], ValueError, "a tensor of shape (4, 32, 32): expected a clip (C, T, H, W) or views (V, C, T, H, W)"),
        ([clip, b"a.mp4"], TypeError, "inputs[1]: a bytes path"),
        ([clip, np.zeros((3, 4, 32, 32), np.int64)], TypeError, "inputs[1]: a numpy array of dtype int64"),
        (object(), TypeError, "inputs: expected a video path"),
    ):  # fmt: skip
        with pytest.raises(error) as e:
            predictor(item)
        assert message in str(e.value), item
    for options, error, message in (
        ({"top_k": "2"}, TypeError, "top_k must be an int, got str '2'"),
        ({"num_crops": 2}, ValueError, "num_crops must be 1 or 3, got 2"),
        ({"num_frames": 0}, ValueError, "num_frames must be an int >= 1, got 0"),
        ({"num_clips": 1.5}, TypeError, "num_clips must be an int, got float 1.5"),
    ):
        with pytest.raises(error) as e:
            Predictor.from_checkpoint("never_read.pth", **options)
        assert str(e.value) == message
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"^CUDA is not available on this machine: device='cuda'$"):
        Predictor.from_checkpoint(path, device="cuda")
