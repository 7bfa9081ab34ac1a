"""The run's one clip (:class:`peg_video.data.clip.ClipSpec`) and the one tubelet rule (``tubelet_misfits``).

The precedence with an ``--init`` Hugging Face folder (flag > recipe > folder > VideoMAE's input for
the sizes, flag > folder > recipe for the normalisation) is tested in ``test_video_init_cli.py``.
"""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from peg_core.errors import InputError
from peg_video.cli import parse_train_args
from peg_video.data.clip import ClipSpec, ClipSpecError
from peg_video.data.loaders import transform_config
from peg_video.model import check_clip_fits, model_config_from_args
from peg_video.models.vit import tubelet_misfits

DATA = ["--train-ann", "train.csv"]


def test_tubelet_misfits_names_every_axis_that_does_not_split():
    assert tubelet_misfits((16, 224, 224), (2, 16, 16)) == []
    assert tubelet_misfits((15, 224, 200), (2, 16, 16)) == [("T", 15, 2), ("W", 200, 16)]


def test_the_spec_is_frozen_and_checks_its_tubelet():
    clip = ClipSpec(num_frames=8, stride=2, crop=32, tubelet=(2, 8, 8))
    with pytest.raises(dataclasses.FrozenInstanceError):
        clip.crop = 64
    assert clip.misfits() == [] and (clip.mean, clip.std) == ((0.45,) * 3, (0.225,) * 3)
    bad = dataclasses.replace(clip, crop=36)
    with pytest.raises(ClipSpecError, match=r"must be a multiple of the model's tubelet \(2, 8, 8\)") as e:
        bad.check()
    assert isinstance(e.value, InputError) and e.value.where == "--crop 36"
    assert ClipSpec(num_frames=5, stride=1, crop=30, tubelet=None).misfits() == []  # an X3D has no tubelet


def test_of_run_reads_parsed_flags_and_stored_args_alike():
    args = parse_train_args(
        [*DATA, "--config", "synthetic_tiny", "--num-frames", "4", "--mean", "0.1,0.2,0.3"]
    )
    clip = ClipSpec.of_run(args)
    assert clip == ClipSpec(4, 2, 32, (2, 8, 8), (0.1, 0.2, 0.3), (0.225,) * 3)
    stored = clip.record()  # what args.json holds
    assert ClipSpec.of_run(stored) == clip and stored["tubelet"] == [2, 8, 8]
    # a run from before --mean / --std reads Kinetics' normalisation
    old = ClipSpec.of_run({k: v for k, v in stored.items() if k not in ("mean", "std")})
    assert old.mean == (0.45,) * 3
    # the data and the model read the same clip
    assert transform_config(args).crop == clip.crop and transform_config(args).mean == clip.mean
    config = model_config_from_args(args, 6)
    assert (config["num_frames"], config["img_size"], config["tubelet"]) == (4, 32, [2, 8, 8])


def test_the_parsed_clip_is_checked_once_against_the_tubelet(capsys):
    with pytest.raises(SystemExit):
        parse_train_args([*DATA, "--config", "synthetic_tiny", "--num-frames", "5"])
    assert "--num-frames 5 and --crop 32 must be multiples of --tubelet 2,8,8" in capsys.readouterr().err
    x3d = parse_train_args([*DATA, "--arch", "x3d_xs", "--pos-enc", "none", "--num-frames", "5"])
    assert x3d.num_frames == 5  # a CNN: no tubelet to split into


def test_check_clip_fits_uses_the_models_tubelet():
    model = argparse.Namespace(tubelet=(2, 8, 8))
    check_clip_fits(model, argparse.Namespace(num_frames=8, stride=2, crop=32))
    with pytest.raises(ClipSpecError) as e:
        check_clip_fits(model, argparse.Namespace(num_frames=5, stride=2, crop=32))
    assert str(e.value) == "must be a multiple of the model's tubelet (2, 8, 8): --num-frames 5"
