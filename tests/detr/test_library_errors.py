"""Errors by layer in peg_detr: its data, models and evaluation raise ``InputError`` subclasses.

Only the command line raises :class:`~peg_core.engine.UserError`; it prints a library's
:class:`~peg_core.errors.InputError` as the same one line ``error: <what>: <where>``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from peg_core.engine import EXIT_ERROR, UserError
from peg_core.errors import InputError
from peg_detr.__main__ import main as cli
from peg_detr.data import (
    CocoAnnotationError,
    CocoDataError,
    CocoDetr,
    infer_num_classes,
    load_coco_annotations,
)
from tests.core.test_library_errors import calls_print, names_user_error

PEG_DETR = Path(__file__).resolve().parents[2] / "peg_detr"
#: peg_detr's library (the application: cli, task, model, configs, predict, export, demo, ...)
LIBRARY = [
    *(PEG_DETR / "data").rglob("*.py"),
    *(PEG_DETR / "models").rglob("*.py"),
    *(PEG_DETR / "interop").rglob("*.py"),
    PEG_DETR / "evaluation.py",
    PEG_DETR / "labels.py",
    PEG_DETR / "structures.py",
]


def test_library_modules_print_nothing():
    """Library code warns or returns a report; the command line decides what to print.

    ``evaluation.py`` prints COCO's summary table only when asked (``verbose=True``).
    """
    quiet = [p for p in LIBRARY if p.name != "evaluation.py"]
    assert {str(p.relative_to(PEG_DETR)): calls_print(p) for p in quiet if calls_print(p)} == {}


def test_library_modules_never_name_the_command_lines_error():
    assert all(p.is_file() for p in LIBRARY) and len(LIBRARY) > 15
    assert [str(p.relative_to(PEG_DETR)) for p in LIBRARY if names_user_error(p)] == []


def _bad_json(tmp_path) -> Path:
    path = tmp_path / "instances.json"
    path.write_text('{"images": [], "annotations": [], "categories": []}')
    return path


def test_data_errors_are_input_errors_naming_the_file(tmp_path):
    path = _bad_json(tmp_path)
    with pytest.raises(CocoAnnotationError) as e:
        load_coco_annotations(path)
    assert isinstance(e.value, CocoDataError) and isinstance(e.value, InputError)
    assert not isinstance(e.value, UserError)
    assert str(e.value) == f"annotation file lists no images ('images' is empty): {path}"
    with pytest.raises(CocoDataError, match=r"^image folder not found: .*nope$"):
        CocoDetr(tmp_path / "nope", path)
    with pytest.raises(CocoAnnotationError, match=r"^the annotation file lists no categories; .*: x\.json$"):
        infer_num_classes([], "x.json")


def test_the_command_line_prints_them_as_one_line(tmp_path, capsys):
    root = tmp_path / "coco"
    for folder in ("train2017", "val2017", "annotations"):
        (root / folder).mkdir(parents=True)
    for split in ("train", "val"):
        path = _bad_json(root / "annotations")
        path.rename(root / "annotations" / f"instances_{split}2017.json")
    out = tmp_path / "run"
    capsys.readouterr()
    code = cli(
        ["train", "--data-root", str(root), "--output-dir", str(out), "--workers", "0", "--no-progress"]
    )
    train_json = root / "annotations" / "instances_train2017.json"
    want = f"error: annotation file lists no images ('images' is empty): {train_json}"
    assert (code, capsys.readouterr().err.splitlines()) == (EXIT_ERROR, [want])
    assert not (out / "checkpoint.pth").exists()
