"""Every image-size flag of the three packages is bounded (1..MAX_IMAGE_SIDE): one usage line, no allocation."""

from __future__ import annotations

import pytest

from peg_core.engine import MAX_IMAGE_SIDE

CASES = [
    ("peg_detr", ["eval", "--checkpoint", "x.pth", "--eval-sizes", "100000"], "--eval-sizes"),
    ("peg_detr", ["eval", "--checkpoint", "x.pth", "--val-size", "100000"], "--val-size"),
    ("peg_detr", ["train", "--data-root", "d", "--train-sizes", "480,100000"], "--train-sizes"),
    ("peg_detr", ["train", "--data-root", "d", "--max-size", "100000"], "--max-size"),
    ("peg_detr", ["train", "--data-root", "d", "--crop-resize", "100000"], "--crop-resize"),
    ("peg_detr", ["train", "--data-root", "d", "--crop-size", "384,100000"], "--crop-size"),
    ("peg_detr", ["export", "x.pth", "o.onnx", "--height", "100000"], "--height"),
    ("peg_video", ["train", "--crop", "100000"], "--crop"),
    ("peg_video", ["eval", "--checkpoint", "x.pth", "--test-scale", "100000"], "--test-scale"),
    ("peg_video", ["train", "--scale-jitter", "32,100000"], "--scale-jitter"),
    ("peg_video", ["make-data", "out", "--width", "100000"], "--width"),
    ("peg_video", ["export", "x.pth", "o.onnx", "--width", "100000"], "--width"),
    ("peg_detr", ["predict", "x.png", "--checkpoint", "c.pth", "--size", "100000"], "--size"),
    ("peg_video", ["prepare", "src", "dst", "--short-side", "100000"], "--short-side"),
]


@pytest.mark.parametrize(("package", "argv", "flag"), CASES, ids=[f"{c[0]} {c[1][0]} {c[2]}" for c in CASES])
def test_size_flags_are_bounded(package, argv, flag, capsys):
    main = __import__(f"{package}.__main__", fromlist=["main"]).main
    with pytest.raises(SystemExit) as stop:  # argparse's usage error, before any work
        main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"argument {flag}" in err[0] and f"1..{MAX_IMAGE_SIDE}" in err[0], err
    assert "Traceback" not in err[0]


#: counts that size a step or a clip: (package, argv, flag, the bound the usage line names)
COUNTS = [
    ("peg_video", ["train", "--repeated-aug", "100000"], "--repeated-aug", "a repeat count in 1..16"),
    ("peg_video", ["train", "--num-frames", "100000"], "--num-frames", "a frame count in 1..256"),
    ("peg_video", ["eval", "--checkpoint", "x.pth", "--num-clips", "100000"], "--num-clips", "a clip count in 1..64"),
    ("peg_video", ["predict", "v.mp4", "--checkpoint", "x.pth", "--num-frames", "0"], "--num-frames",
     "a frame count in 1..256"),
    ("peg_video", ["make-data", "out", "--frames", "100000"], "--frames", "a frame count in 1..4096"),
    ("peg_core", ["train", "--patch-size", "100000"], "--patch-size", "a patch side in 1..256"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("package", "argv", "flag", "bound"), COUNTS, ids=[f"{c[0]} {c[1][0]} {c[2]}" for c in COUNTS]
)
def test_count_flags_are_bounded(package, argv, flag, bound, capsys):
    """``--repeated-aug 100000`` used to hang building its first step; now argparse refuses it."""
    main = __import__(f"{package}.__main__", fromlist=["main"]).main
    try:
        code = main(argv)
    except SystemExit as stop:  # argparse's usage error (peg_core's dispatcher returns the code)
        code = stop.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"argument {flag}: expected {bound}, got " in err[0], err
