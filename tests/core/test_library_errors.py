"""Errors by layer: peg_core's library raises ``InputError`` subclasses, only the command line ``UserError``.

``docs/architecture.md`` ("Error policy by layer"): library code names the file, key or value
in an :class:`~peg_core.errors.InputError`; :func:`peg_core.engine.run_command` prints it as the
one line ``error: <what>: <where>``, exactly like a :class:`~peg_core.engine.UserError`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torch import nn

from peg_core.__main__ import main as peg_core_main
from peg_core.classify.data import ImageFolderError, check_layout, open_image_folder
from peg_core.engine import EXIT_ERROR, UserError, run_command
from peg_core.errors import InputError
from peg_core.export.onnx import MAX_OPSET, ExportError, OnnxCheckError, export_onnx

PEG_CORE = Path(__file__).resolve().parents[2] / "peg_core"
#: peg_core's library: the top level and these sub-packages / modules (``__main__``, the engine,
#: the classify application and ``export/cli.py`` are the command line's layer)
LIBRARY = [
    *(p for p in PEG_CORE.glob("*.py") if p.name != "__main__.py"),
    *(PEG_CORE / "interop").rglob("*.py"),
    *(PEG_CORE / "models").rglob("*.py"),
    *(p for p in (PEG_CORE / "export").rglob("*.py") if p.name != "cli.py"),
    PEG_CORE / "classify" / "data.py",
]


def names_user_error(path: Path) -> bool:
    """Whether the module imports or refers to ``UserError`` (in any function too)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and any(a.name == "UserError" for a in node.names):
            return True
        if isinstance(node, ast.Name) and node.id == "UserError":
            return True
        if isinstance(node, ast.Attribute) and node.attr == "UserError":
            return True
    return False


def calls_print(path: Path) -> list[int]:
    """The lines of ``path`` that call ``print`` (library code warns or returns a report instead)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"
    ]


def test_library_modules_never_name_the_command_lines_error():
    assert len(LIBRARY) > 20
    assert [str(p.relative_to(PEG_CORE)) for p in LIBRARY if names_user_error(p)] == []


def _export(out, opset: int = MAX_OPSET - 3) -> None:
    export_onnx(nn.Linear(2, 2), torch.zeros(2, 2), out, ({},), "x", ["y"], opset, {})


def test_export_refuses_a_folder_and_an_opset_with_an_export_error(tmp_path):
    with pytest.raises(ExportError) as e:
        _export(tmp_path)
    assert isinstance(e.value, InputError) and not isinstance(e.value, UserError)
    assert (e.value.what, e.value.where) == ("output is a folder, expected an .onnx file path", str(tmp_path))
    with pytest.raises(ExportError, match=r"^opset must be an integer in 18\.\.23: opset=99$"):
        _export(tmp_path / "m.onnx", opset=99)
    assert not (tmp_path / "m.onnx").exists()  # refused before any tracing
    assert issubclass(OnnxCheckError, ExportError)


def test_image_folder_errors_are_input_errors_naming_the_folder(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(ImageFolderError) as e:
        open_image_folder(missing)
    assert isinstance(e.value, InputError) and not isinstance(e.value, UserError)
    assert str(e.value) == f"data folder not found: {missing}"
    (tmp_path / "train").mkdir()
    with pytest.raises(ImageFolderError, match=r"^data folder has no val/ folder .*: " + str(tmp_path) + "$"):
        check_layout(tmp_path)


def test_the_command_line_prints_a_library_error_as_one_line(tmp_path, capsys):
    capsys.readouterr()
    assert run_command(lambda _: _export(tmp_path), []) == EXIT_ERROR
    assert capsys.readouterr().err.splitlines() == [
        f"error: output is a folder, expected an .onnx file path: {tmp_path}"
    ]


def test_classify_train_on_a_missing_folder_is_one_line(tmp_path, capsys):
    pytest.importorskip("torchvision")
    missing, out = tmp_path / "nope", tmp_path / "run"
    capsys.readouterr()
    code = peg_core_main(["train", "--data-root", str(missing), "--output-dir", str(out)])
    assert (code, capsys.readouterr().err.splitlines()) == (
        EXIT_ERROR,
        [f"error: data folder not found: {missing}"],
    )
    assert not out.exists()  # refused before the output folder is made
