"""A package that is not installed is one line naming the extra that brings it (``peg_core.errors.require``).

Each case hides the package (``sys.modules[name] = None`` makes every ``import name`` fail as if
it were not installed) in the test only, then runs the command in process: exit 1, one line
``error: <feature> needs <module>: pip install 'peg-core[<extra>]'``, no traceback.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from peg_core.__main__ import main
from peg_core.engine import run_command
from peg_core.errors import InputError, MissingDependency, require
from tests.core.test_classify_cli import TINY

ROOT = Path(__file__).resolve().parents[2]


def _hide(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """Make ``import name`` fail for each of ``names`` (and their submodules) until the test ends."""
    for name in names:
        for loaded in [m for m in sys.modules if m.startswith(f"{name}.")]:
            monkeypatch.delitem(sys.modules, loaded)
        monkeypatch.setitem(sys.modules, name, None)


def run_module(module: str, args: list[str], hide: str | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m MODULE ARGS`` in a fresh interpreter, with package ``hide`` not importable.

    Task packages import their required packages at load time, so hiding one needs a new process.
    """
    code = "import runpy, sys\n"
    if hide:
        code += f"sys.modules[{hide!r}] = None\n"
    code += f"sys.argv = [{module!r}, *sys.argv[1:]]; runpy.run_module({module!r}, run_name='__main__')"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "default"}
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


def _one_line_error(capsys: pytest.CaptureFixture[str], code: int) -> str:
    err = capsys.readouterr().err
    assert code == 1, err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err.strip()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A tiny classifier trained for one epoch (with every package present)."""
    out = tmp_path_factory.mktemp("run")
    assert main(["train", *TINY, "--epochs", "1", "--output-dir", str(out)]) == 0
    return out / "checkpoint.pth"


def test_require_names_the_module_and_the_extra(monkeypatch):
    _hide(monkeypatch, "onnx", "decord")
    with pytest.raises(MissingDependency) as e:
        require("onnx", "onnx", what="export")
    assert str(e.value) == "export needs onnx: pip install 'peg-core[onnx]'"
    assert isinstance(e.value, InputError) and isinstance(e.value, ImportError) and e.value.name == "onnx"
    with pytest.raises(MissingDependency, match=r"^decord is not installed: pip install decord$"):
        require("decord.bridge", None, "decord")  # a required dependency: the pip name itself
    assert require("json", "none") is importlib.import_module("json")


def test_a_missing_package_of_the_dependency_keeps_its_traceback(tmp_path, monkeypatch):
    """A dependency that is installed but broken (it imports a package that is not there) is a bug."""
    (tmp_path / "half_installed.py").write_text("import not_a_package_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as e:
        require("half_installed", "x", what="feature")
    assert not isinstance(e.value, MissingDependency) and e.value.name == "not_a_package_anywhere"


def test_make_data_without_pillow(tmp_path, monkeypatch, capsys):
    _hide(monkeypatch, "PIL")
    err = _one_line_error(capsys, main(["make-data", str(tmp_path / "shapes")]))
    assert err == "error: make-data needs PIL: pip install 'peg-core[vision]'"


def test_train_on_a_folder_without_torchvision(tmp_path, monkeypatch, capsys):
    _hide(monkeypatch, "torchvision")
    code = main(["train", *TINY, "--data", str(tmp_path), "--output-dir", str(tmp_path / "run")])
    err = _one_line_error(capsys, code)
    assert err == "error: an image folder (--data) needs torchvision: pip install 'peg-core[vision]'"
    assert not (tmp_path / "run").exists()


def test_predict_without_torchvision(checkpoint, tmp_path, monkeypatch, capsys):
    _hide(monkeypatch, "torchvision")
    code = main(["predict", "--checkpoint", str(checkpoint), str(tmp_path / "a.png"), "--device", "cpu"])
    assert _one_line_error(capsys, code) == "error: predict needs torchvision: pip install 'peg-core[vision]'"


def test_quantize_without_torchao(checkpoint, tmp_path, monkeypatch, capsys):
    _hide(monkeypatch, "torchao")
    code = main(["quantize", str(checkpoint), str(tmp_path / "int8.pt2"), "--calib", "8"])
    assert (
        _one_line_error(capsys, code)
        == "error: int8 quantization needs torchao: pip install 'peg-core[quantize]'"
    )
    assert not (tmp_path / "int8.pt2").exists()


def test_safetensors_read_and_write_without_safetensors(tmp_path, monkeypatch, capsys):
    table = {"pos_embed": torch.zeros(1, 5, 4)}
    torch.save(table, tmp_path / "a.pth")
    (tmp_path / "a.safetensors").write_bytes(b"")
    _hide(monkeypatch, "safetensors")
    grid = ["--grid", "3", "--prefix-tokens", "1"]
    src = tmp_path / "a.safetensors"
    err = _one_line_error(capsys, main(["resize-pos-embed", str(src), str(tmp_path / "o.pth"), *grid]))
    assert err == f"error: reading {src} needs safetensors: pip install 'peg-core[safetensors]'"
    dst = tmp_path / "o.safetensors"
    err = _one_line_error(capsys, main(["resize-pos-embed", str(tmp_path / "a.pth"), str(dst), *grid]))
    assert err == f"error: writing {dst} needs safetensors: pip install 'peg-core[safetensors]'"
    assert not dst.exists()


def test_onnx_export_without_onnx_or_onnxruntime(tmp_path, monkeypatch, capsys):
    from peg_core.export.onnx import compare_onnxruntime, export_onnx

    out = tmp_path / "m.onnx"

    def export(_argv: list[str]) -> None:
        export_onnx(nn.Linear(2, 2), torch.zeros(1, 2), out, ({},), "x", ["y"], 18, {})

    for hidden, line in (
        ("onnx", "error: export needs onnx: pip install 'peg-core[onnx]'"),
        ("onnxscript", "error: export needs onnxscript: pip install 'peg-core[onnx]'"),
    ):
        with monkeypatch.context() as m:
            _hide(m, hidden)
            assert _one_line_error(capsys, run_command(export, [])) == line
    assert not out.exists()  # stopped before tracing
    _hide(monkeypatch, "onnxruntime")
    code = run_command(lambda _: compare_onnxruntime(out, {"x": torch.zeros(1, 2)}, [torch.zeros(1, 2)]), [])
    assert (
        _one_line_error(capsys, code)
        == "error: export --check needs onnxruntime: pip install 'peg-core[onnx]'"
    )


def test_viz_without_matplotlib(tmp_path, monkeypatch):
    from peg_core.viz import plot_similarity

    _hide(monkeypatch, "matplotlib")
    with pytest.raises(
        MissingDependency, match=r"^peg_core.viz needs matplotlib: pip install 'peg-core\[viz\]'$"
    ):
        plot_similarity(torch.zeros(2, 2, 2, 2), tmp_path / "sim.png")


def test_timm_registry_without_timm(monkeypatch):
    monkeypatch.delitem(sys.modules, "peg_core.interop.timm", raising=False)
    _hide(monkeypatch, "timm")
    with pytest.raises(MissingDependency) as e:
        importlib.import_module("peg_core.interop.timm")
    assert str(e.value) == "peg_core.interop.timm needs timm: pip install 'peg-core[timm]'"
