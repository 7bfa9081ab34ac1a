"""peg_video without one of its packages, and without pytorchvideo's import-time FutureWarning.

A missing package is hidden in a fresh interpreter (``sys.modules[name] = None``: ``import name``
fails as if it were not installed), since peg_video imports decord / av / pytorchvideo at load time:
``python -m peg_video`` says which package to install in one line, exit 1.
"""

from __future__ import annotations

import subprocess
import warnings

import pytest

from tests.core.test_optional_deps import run_module

TINY_SET = ["--num-train", "2", "--num-val", "1", "--width", "64", "--height", "48", "--frames", "4"]


def _peg_video(args: list[str], hide: str | None = None) -> subprocess.CompletedProcess[str]:
    return run_module("peg_video", args, hide)


@pytest.mark.parametrize(
    "hidden,line",
    [
        ("decord", "error: peg_video needs decord: pip install decord"),
        ("av", "error: peg_video needs av: pip install av"),
        ("pytorchvideo", "error: peg_video needs pytorchvideo: pip install pytorchvideo==0.1.5"),
    ],
)
def test_make_data_without_a_video_package(tmp_path, hidden, line):
    done = _peg_video(["make-data", str(tmp_path / "set"), *TINY_SET], hide=hidden)
    assert done.returncode == 1, done.stderr
    assert done.stderr == line + "\n"
    assert not (tmp_path / "set").exists()


def test_no_pytorchvideo_future_warning(tmp_path):
    """torch's ``torch.jit.script_method`` deprecation, raised inside pytorchvideo's import, is not shown."""
    done = _peg_video(["--help"])
    assert done.returncode == 0 and "make-data" in done.stdout and done.stderr == "", done.stderr
    done = _peg_video(["make-data", str(tmp_path / "set"), *TINY_SET])
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr, done.stderr
    assert (tmp_path / "set" / "train.csv").is_file()


def test_only_that_warning_is_silenced(tmp_path, monkeypatch):
    """Another FutureWarning raised while a pytorchvideo module is imported still shows."""
    from peg_video.compat import import_pytorchvideo

    (tmp_path / "warning_probe.py").write_text(
        "import warnings\n"
        "warnings.warn('`torch.jit.script_method` is deprecated. Please switch', FutureWarning)\n"
        "warnings.warn('`torch.jit.script_method` is deprecated, but a UserWarning')\n"
        "warnings.warn('something else', FutureWarning)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        import_pytorchvideo("warning_probe")
    assert sorted((w.category.__name__, str(w.message)) for w in seen) == [
        ("FutureWarning", "something else"),
        ("UserWarning", "`torch.jit.script_method` is deprecated, but a UserWarning"),
    ]
