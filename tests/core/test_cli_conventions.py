"""The conventions every ``python -m peg_*`` command shares: ``--version``, bounded size flags, ``-h`` defaults."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from peg_core.__main__ import main as core_main
from peg_core.engine import MAX_IMAGE_SIDE, image_side, image_side_list
from peg_core.engine.cli import new_parser

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"peg_core": "peg-core", "peg_detr": "peg-detr", "peg_video": "peg-video"}


def _run(module: str, args: list[str]) -> tuple[int, str]:
    """``main(args)`` of ``module``'s ``__main__`` in process: ``(exit code, stdout)``."""
    main = importlib.import_module(f"{module}.__main__").main
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            code = main(args)
        except SystemExit as e:  # argparse's -h in the packages whose main does not catch it
            code = e.code
    return code, out.getvalue()


# ------------------------------------------------------------------------------------------ --version
@pytest.mark.parametrize("module", sorted(PACKAGES))
def test_version_as_python_m(module):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", module, "--version"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, f"{PACKAGES[module]} 0.1.0\n", "")


@pytest.mark.parametrize("module", sorted(PACKAGES))
def test_version_as_console_script_matches_the_wheel(module, monkeypatch, capsys):
    """A console script runs ``sys.exit(main())`` with ``sys.argv``: main returns the int exit code."""
    main = importlib.import_module(f"{module}.__main__").main
    monkeypatch.setattr(sys, "argv", [PACKAGES[module], "--version"])
    with pytest.raises(SystemExit) as e:
        sys.exit(main())
    assert e.value.code == 0
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "packages" / PACKAGES[module] / "pyproject.toml").read_text())["project"]
    assert capsys.readouterr().out == f"{project['name']} {project['version']}\n"
    assert importlib.import_module(module).__version__ == project["version"]


# ------------------------------------------------------------------------------------ bounded sizes
def test_image_side_types_bound_the_value():
    assert image_side("4096") == MAX_IMAGE_SIDE == 4096 and image_side("1") == 1
    assert image_side_list("36,48, 72") == [36, 48, 72]
    for text, message in (
        ("100000", "expected an image side in 1..4096, got '100000'"),
        ("0", "expected an image side in 1..4096, got '0'"),
        ("4.5", "expected an image side in 1..4096, got '4.5'"),
    ):
        with pytest.raises(argparse.ArgumentTypeError) as e:
            image_side(text)
        assert str(e.value) == message
    with pytest.raises(argparse.ArgumentTypeError) as e:
        image_side_list("48,100000")
    assert str(e.value) == "expected comma-separated image sides in 1..4096, got '48,100000'"


@pytest.mark.parametrize(
    "argv,flag",
    [
        (["eval", "--checkpoint", "c.pth", "--eval-sizes", "48,100000"], "--eval-sizes"),
        (["train", "--img-size", "100000"], "--img-size"),
        (["train", "--train-sizes", "32,100000"], "--train-sizes"),
        (["train", "--progressive-sizes", "100000"], "--progressive-sizes"),
        (["predict", "--checkpoint", "c.pth", "a.png", "--img-size", "5000"], "--img-size"),
        (["make-data", "out", "--img-size", "5000"], "--img-size"),
        (["quantize", "c.pth", "o.pt2", "--img-size", "5000"], "--img-size"),
    ],
)
def test_classifier_size_flags_are_bounded(argv, flag, capsys):
    """A huge size is a usage error (exit 2) naming the flag and the bound, before any allocation."""
    assert core_main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"argument {flag}: expected " in err and "in 1..4096, got '" in err, err


# ------------------------------------------------------------------------------------- -h defaults
def test_train_help_shows_defaults_but_not_none(capsys):
    code, out = _run("peg_core", ["train", "-h"])
    assert code == 0
    text = " ".join(out.split())  # argparse wraps lines
    assert "DataLoader worker processes (default: 2)" in text
    assert "--device DEVICE auto | cpu | cuda | cuda:N (default: auto)" in text
    assert "default: None" not in text and "(default: False)" not in text and "(default: True)" not in text


@pytest.mark.parametrize("module", sorted(PACKAGES))
def test_every_verb_help_renders_without_none_defaults(module):
    """Every verb's -h of every package (their parsers come from new_parser) prints, with no None default."""
    commands = importlib.import_module(f"{module}.__main__").COMMANDS
    for verb in commands:
        code, out = _run(module, [verb, "-h"])
        assert code == 0, verb
        assert "usage:" in out and "default: None" not in out and "(default: False)" not in out, verb


def test_help_formatter_lists_and_existing_mentions():
    p = new_parser("prog")
    p.add_argument("--peg-at", default=[0, 1], help="blocks")
    p.add_argument("--kernel", default=3, help="kernel side (default 3)")
    p.add_argument("--rate", default=0.01, help="fraction (1%%)")
    p.add_argument("--flag", action="store_true", help="a switch")
    p.add_argument("--hidden", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    text = " ".join(p.format_help().split())
    assert "blocks (default: 0,1)" in text and "kernel side (default 3)" in text
    assert "fraction (1%) (default: 0.01)" in text and "a switch" in text and "--hidden" not in text
    assert text.count("default") == 3
