"""Errors by layer in peg_video: its data, models and interop raise ``InputError`` subclasses.

Only the command line raises :class:`~peg_core.engine.UserError`; it prints a library's
:class:`~peg_core.errors.InputError` as the same one line ``error: <what>: <where>``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from peg_core.engine import EXIT_ERROR, UserError
from peg_core.errors import InputError
from peg_video.__main__ import main as cli
from peg_video.data.loaders import LoaderOptionError, transform_config
from peg_video.data.synthetic import SyntheticSpec, SyntheticSpecError, make_synthetic_dataset
from tests.core.test_library_errors import calls_print, names_user_error

PEG_VIDEO = Path(__file__).resolve().parents[2] / "peg_video"
#: peg_video's library (the application: cli, task, model, configs, predict, export, demo, ...)
LIBRARY = [
    *(PEG_VIDEO / "data").rglob("*.py"),
    *(PEG_VIDEO / "models").rglob("*.py"),
    *(PEG_VIDEO / "interop").rglob("*.py"),
    PEG_VIDEO / "evaluation.py",
    PEG_VIDEO / "grid3d.py",
    PEG_VIDEO / "mix.py",
]


def test_library_modules_print_nothing():
    """Library code warns or returns a report; the command line decides what to print."""
    assert {str(p.relative_to(PEG_VIDEO)): calls_print(p) for p in LIBRARY if calls_print(p)} == {}


def test_library_modules_never_name_the_command_lines_error():
    assert all(p.is_file() for p in LIBRARY) and len(LIBRARY) > 15
    assert [str(p.relative_to(PEG_VIDEO)) for p in LIBRARY if names_user_error(p)] == []


def test_data_option_errors_are_input_errors_naming_the_options():
    args = argparse.Namespace(hflip=True, dataset="ssv2")
    with pytest.raises(LoaderOptionError) as e:
        transform_config(args)
    assert isinstance(e.value, InputError) and not isinstance(e.value, UserError)
    assert (
        str(e.value) == "horizontal flips contradict SSv2's left / right labels: --hflip with --dataset ssv2"
    )


def test_synthetic_spec_errors_are_input_errors(tmp_path):
    with pytest.raises(SyntheticSpecError) as e:
        make_synthetic_dataset(tmp_path / "ucf", "ucf101", SyntheticSpec(num_train=1, num_val=1))
    assert isinstance(e.value, InputError) and not isinstance(e.value, UserError)
    assert e.value.where == "--num-train 1 --num-val 1"
    assert not (tmp_path / "ucf").exists()  # refused before anything is written


def test_the_command_line_prints_them_as_one_line(tmp_path, capsys):
    capsys.readouterr()
    code = cli(
        ["make-data", str(tmp_path / "ucf"), "--dataset", "ucf101", "--num-train", "1", "--num-val", "1"]
    )
    err = capsys.readouterr().err.strip()
    assert code == EXIT_ERROR
    assert err == "error: three splits need at least 3 videos: --num-train 1 --num-val 1", err
