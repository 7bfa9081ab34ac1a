"""User errors of ``python -m peg_detr ...``: one line naming the file/key/value, before any long work.

Exit codes: 1 for a user error (``error: <what>: <where>``), 2 for a bad option value (argparse).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from peg_detr.__main__ import main as cli
from peg_detr.cli import train as train_main

pytestmark = pytest.mark.slow

MODEL = ["--backbone", "tiny", "--hidden-dim", "32", "--num-heads", "2", "--enc-layers", "1", "--dec-layers", "1",
         "--dim-feedforward", "64", "--num-queries", "5"]  # fmt: skip
RUN = ["--train-sizes", "64", "--crop-resize", "", "--val-size", "64", "--total-batch-size", "4", "--workers", "0",
       "--no-progress", "--epochs", "1"]  # fmt: skip


COCO_SET = dict(max_frac=0.45, num_val=2, seed=3)  # the module's ``data`` (tests/conftest.py)


@pytest.fixture(scope="module")
def ckpt(data, tmp_path_factory):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("run")
    train_main(["--data-root", str(data), "--output-dir", str(out), *MODEL, *RUN])
    torch.set_num_threads(before)
    return out / "checkpoint.pth"


def run(argv, capsys):
    """``(exit code, stderr lines)`` of ``python -m peg_detr ARGV`` run in this process."""
    capsys.readouterr()
    try:
        code = cli(argv)
    except SystemExit as e:  # argparse's usage errors
        code = e.code
    return code, capsys.readouterr().err.strip().splitlines()


def _train(data, out, *extra):
    return ["train", "--data-root", str(data), "--output-dir", str(out), *MODEL, *RUN, *extra]


def _edited(data, tmp_path, split, edit):
    """A copy of the data set whose ``split`` annotation json is ``edit(doc)`` (or the text it returns)."""
    root = tmp_path / "edited"
    shutil.copytree(data, root)
    path = root / "annotations" / f"instances_{split}2017.json"
    doc = edit(json.loads(path.read_text()))
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return root, path


def _drop(key):
    def edit(doc):
        del doc[key]
        return doc

    return edit


def _bad_category(doc):
    doc["annotations"][0]["category_id"] = 9
    return doc


def _repeated_annotation_id(doc):
    """COCO's index would keep one of the two: scored against itself, the ground truth gives AP 0.04."""
    doc["annotations"][1]["id"] = doc["annotations"][0]["id"]
    return doc


def _category_id(new):
    def edit(doc):
        doc["categories"][0]["id"] = new
        return doc

    return edit


@pytest.mark.parametrize(
    ("split", "edit", "message"),
    [
        ("train", lambda d: "{not json", "annotation file is not valid JSON (Expecting property name enclosed in "
                                         "double quotes: line 1 column 2 (char 1))"),
        ("train", _drop("images"), "annotation file has no 'images' key"),
        ("val", _drop("categories"), "annotation file has no 'categories' key"),
        ("train", lambda d: {**d, "images": []}, "annotation file lists no images ('images' is empty)"),
        ("val", _bad_category, "annotation 1 (image 1000001) has category_id 9, which is not in 'categories' "
                               "(ids [1, 2, 3])"),
        ("val", _repeated_annotation_id, "annotation id 1 is listed twice in 'annotations'"),
        ("train", _category_id(-1), "category entry 0 has id -1, outside 0..100000 (labels index a classifier by "
                                    "category id)"),
        ("train", _category_id(10**9), "category entry 0 has id 1000000000, outside 0..100000 (labels index a "
                                       "classifier by category id)"),
        ("train", _category_id(2), "category id 2 is listed twice in 'categories'"),
        ("val", lambda d: "[" * 100_000 + "]" * 100_000, "annotation file is nested deeper than 64 levels"),
    ],
)  # fmt: skip
def test_bad_annotation_files_train(data, tmp_path, capsys, split, edit, message):
    root, path = _edited(data, tmp_path, split, edit)
    code, err = run(_train(root, tmp_path / "out"), capsys)
    assert (code, err) == (1, [f"error: {message}: {path}"])
    assert not (tmp_path / "out" / "checkpoint.pth").exists()  # stopped before training


@pytest.mark.parametrize(
    ("edit", "message"),
    [(_drop("categories"), "annotation file has no 'categories' key"),
     (_bad_category, "annotation 1 (image 1000001) has category_id 9, which is not in 'categories' (ids [1, 2, 3])")],
)  # fmt: skip
def test_bad_annotation_files_eval(data, ckpt, tmp_path, capsys, edit, message):
    root, path = _edited(data, tmp_path, "val", edit)
    argv = ["eval", "--checkpoint", str(ckpt), "--data-root", str(root), "--output-dir", str(tmp_path / "ev")]
    assert run(argv, capsys) == (1, [f"error: {message}: {path}"])


def test_missing_paths(data, tmp_path, capsys):
    out = tmp_path / "out"
    assert run(["train", "--data-root", "/no/such/coco", "--output-dir", str(out), *RUN], capsys) == (
        1, ["error: --data-root folder not found: /no/such/coco"],
    )  # fmt: skip
    for flag, message in (
        ("--resume", "checkpoint not found"),
        ("--init", "--init file not found"),
        ("--backbone-weights", "--backbone-weights file not found"),
    ):
        code, err = run(_train(data, out, flag, "/nonexistent/x.pth"), capsys)
        assert (code, err) == (1, [f"error: {message}: /nonexistent/x.pth"])
    missing = data / "annotations" / "nope.json"
    assert run(_train(data, out, "--train-json", "annotations/nope.json"), capsys) == (
        1, [f"error: annotation file not found (--train-json): {missing}"],
    )  # fmt: skip
    assert run(["eval", "--checkpoint", "/nonexistent/c.pth"], capsys) == (
        1, ["error: checkpoint not found: /nonexistent/c.pth"],
    )  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "--data-root", "x", "--backbone", "nosuch"], "argument --backbone: invalid choice: 'nosuch'"),
        (["train", "--data-root", "x", "--pos-enc", "nosuch"], "argument --pos-enc: unknown position encoding 'nosuch'"),
        (["train", "--data-root", "x", "--learned-grid", "0x5"], "argument --learned-grid: expected HxW with positive "
                                                                  "integers, e.g. 24x32; got '0x5'"),
        (["train", "--data-root", "x", "--batch-size", "0"], "argument --batch-size: expected a positive integer, "
                                                              "got '0'"),
        (["train", "--data-root", "x", "--epochs", "0"], "argument --epochs: expected a positive integer, got '0'"),
        (["train", "--data-root", "x", "--eval-sizes", "80,abc"], "argument --eval-sizes: expected comma-separated "
                                                                   "image sides in 1..4096, got '80,abc'"),
        (["train", "--data-root", "x", "--eval-sizes", "0"], "argument --eval-sizes: expected comma-separated "
                                                              "image sides in 1..4096, got '0'"),
        (["train", "--data-root", "x", "--crop-size", "600,384"], "argument --crop-size: expected MIN,MAX with "
                                                                   "MIN <= MAX, e.g. 384,600; got '600,384'"),
        (["train", "--data-root", "x", "--amp", "none"], "argument --amp: invalid choice: 'none'"),
        (["train", "--epochs", "1"], "the following arguments are required: --data-root"),
        (["eval", "--data-root", "x"], "the following arguments are required: --checkpoint"),
        (["make-data", "d", "--num-classes", "9"], "argument --num-classes: expected an integer in 1..4, got '9'"),
        (["make-data", "d", "--size", "8"], "argument --size: expected an integer in 16..4096, got '8'"),
        (["make-data", "d", "--min-objects", "4"], "--min-objects 4 is more than --max-objects 3"),
        (["predict", "a.jpg", "--checkpoint", "c.pth", "--threshold", "2"], "argument --threshold: expected a "
                                                                             "fraction in [0, 1]"),
    ],
)  # fmt: skip
def test_bad_option_values_are_usage_lines(argv, message, capsys):
    code, err = run(argv, capsys)
    prog = f"python -m peg_detr {argv[0]}"
    assert code == 2 and len(err) == 1 and err[0].startswith(f"error: {prog}: {message}"), err
    assert err[0].endswith("(see --help)")


def test_cuda_without_gpu(data, tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert run(_train(data, tmp_path, "--device", "cuda"), capsys) == (
        1, ["error: CUDA is not available on this machine (torch.cuda.is_available() is False): --device cuda"],
    )  # fmt: skip


class Evil:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def _checkpoints(tmp_path, ckpt):
    """Broken and foreign checkpoint files: (path, expected message)."""
    good = ckpt.read_bytes()
    files = {
        "empty.pth": (b"", "checkpoint is empty (0 bytes)"),
        "cut.pth": (
            good[: len(good) // 2],
            "checkpoint is truncated or not a torch file (PytorchStreamReader failed reading zip archive",
        ),
    }
    out = []
    for name, (content, message) in files.items():
        (tmp_path / name).write_bytes(content)
        out.append((tmp_path / name, message))
    video = tmp_path / "video.pth"
    torch.save({"task": "video", "model": {"w": torch.zeros(1)}, "epoch": 0}, video)
    out.append((video, "wrong model: checkpoint is for task 'video', this command needs 'detect'"))
    official = tmp_path / "official.pth"
    torch.save({"model": {"w": torch.zeros(1)}}, official)
    out.append((official, "not a peg training checkpoint (no 'task'/'model' keys; it holds ['model'])"))
    evil = tmp_path / "evil.pth"
    torch.save({"task": "detect", "model": Evil()}, evil)
    out.append((evil, "checkpoint refused: it holds pickled objects other than tensors and plain containers "
                      "(loaded with weights_only=True; nothing in it was executed)"))  # fmt: skip
    return out


def test_bad_checkpoints(data, ckpt, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    image = str(data / "val2017" / "000001000001.jpg")
    for path, message in _checkpoints(tmp_path, ckpt):
        for argv in (
            ["eval", "--checkpoint", str(path), "--output-dir", str(tmp_path / "ev")],
            _train(data, tmp_path / "out", "--resume", str(path)),
            ["predict", image, "--checkpoint", str(path), "--out", str(tmp_path / "p")],
        ):
            code, err = run(argv, capsys)
            assert code == 1 and len(err) == 1, (argv, err)
            assert err[0].startswith(f"error: {message}") and err[0].endswith(f": {path}"), err
    assert not (tmp_path / "pwned").exists()


def test_init_garbage_and_refused(data, tmp_path, capsys):
    garbage = tmp_path / "garbage.pth"
    garbage.write_bytes(b"not a torch file at all")
    code, err = run(_train(data, tmp_path / "out", "--init", str(garbage)), capsys)
    assert code == 1 and len(err) == 1
    assert err[0].startswith("error: --init checkpoint is truncated or not a torch file")
    assert err[0].endswith(f": {garbage}")
    evil = tmp_path / "evil.pth"
    torch.save({"model": {"w": torch.zeros(1)}, "x": Evil()}, evil)
    code, err = run(_train(data, tmp_path / "out", "--pretrained", str(evil)), capsys)
    assert code == 1 and len(err) == 1 and "refused" in err[0] and "--trust-pickle" not in err[0]
    assert "weights_only=False" not in err[0] and err[0].endswith(str(evil))


def test_predict_errors(data, ckpt, tmp_path, capsys):
    text = tmp_path / "notes.jpg"
    text.write_text("not an image")
    out = tmp_path / "p"
    # one file that cannot be read: the one line every predict prints (its report lists it)
    assert run(["predict", str(text), "--checkpoint", str(ckpt), "--out", str(out)], capsys) == (
        1, [f"error: cannot read the image (not an image file (PIL cannot identify it)): {text}"],
    )  # fmt: skip
    assert run(["predict", str(tmp_path / "missing.jpg"), "--checkpoint", str(ckpt), "--out", str(out)], capsys) == (
        1, [f"error: cannot read the image (file not found): {tmp_path / 'missing.jpg'}"],
    )  # fmt: skip
    # Among several images an unreadable one is skipped and reported.
    image = data / "val2017" / "000001000001.jpg"
    code, err = run(["predict", str(image), str(text), "--checkpoint", str(ckpt), "--out", str(out)], capsys)
    assert (code, err) == (0, [])
    report = json.loads((out / "report.json").read_text())
    assert report["images"] == 1 and report["broken"]["predict"]["samples"] == [
        {"path": str(text), "reason": "not an image file (PIL cannot identify it)"}
    ]
    assert list(json.loads((out / "detections.json").read_text())) == [str(image)]


@pytest.mark.parametrize(
    ("argv", "code", "start"),
    [
        (["eval"], 2, "error: python -m peg_detr eval: the following arguments are required: --checkpoint"),
        (
            ["train", "--data-root", "/no/such/coco", "--epochs", "1"],
            1,
            "error: --data-root folder not found: /no/such/coco",
        ),
    ],
)
def test_subprocess_exit_code_and_no_traceback(argv, code, start, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "peg_detr", *argv, *(["--output-dir", str(tmp_path)] if argv[0] == "train" else [])],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == code and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(start)


# ------------------------------------------------ flags that would change nothing, resumes that change the recipe


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--pos-enc", "sine", "--peg-kernel-size", "5"], "has no effect without a PEG (--pos-enc sine): --peg-kernel-size 5"),
        (["--pos-enc", "learned", "--peg-at", "0,1"], "has no effect without a PEG (--pos-enc learned): --peg-at 0,1"),
        (["--pos-enc", "none", "--no-peg-separable"], "has no effect without a PEG (--pos-enc none): --no-peg-separable"),
        (["--peg-num-kernels", "3"], "sizes the kernel bank of --peg-dynamic, which is off: --peg-num-kernels 3"),
        (["--pos-interpolation", "nearest"], "has no effect without a learned table (--pos-enc peg): --pos-interpolation nearest"),
        (["--learned-grid", "5x7"], "has no effect without a learned table (--pos-enc peg): --learned-grid 5x7"),
        (["--arch", "rtdetr", "--peg-kernel-size", "5"], "has no effect without a PEG (--pos-enc sincos): --peg-kernel-size 5"),
        (["--arch", "rtdetr", "--pos-enc", "rope-mixed", "--pos-interpolation", "area"],
         "has no effect without a learned table (--pos-enc rope-mixed): --pos-interpolation area"),
    ],
)  # fmt: skip
def test_flags_without_effect_are_refused_before_any_work(data, tmp_path, capsys, flags, message):
    out = tmp_path / "out"
    assert run(_train(data, out, *flags), capsys) == (1, [f"error: {message}"])
    assert not out.exists()


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--hidden-dim", "32"), ("--backbone", "r18vd"), ("--num-queries", "10"), ("--num-heads", "4"),
     ("--peg-kernel-size", "5"), ("--no-aux-loss", None)],
)  # fmt: skip
def test_rtdetr_init_folder_refuses_the_model_flags_it_overrides(data, tmp_path, capsys, flag, value):
    """The folder's config.json builds the model: a flag for its shape would be recorded, not used."""
    folder = tmp_path / "hf"  # refused from the command line alone: the folder is not read
    folder.mkdir()
    out = tmp_path / "out"
    argv = ["train", "--arch", "rtdetr", "--data-root", str(data), "--output-dir", str(out), "--init", str(folder),
            "--pos-enc", "peg", flag, *([value] if value else [])]  # fmt: skip
    shown = f"{flag} {value}" if value else flag
    why = f"the model comes from the Hugging Face folder --init {folder} (only --pos-enc applies)"
    assert run(argv, capsys) == (1, [f"error: {why}: {shown}"])
    assert not out.exists()


def test_resume_with_other_labels_and_eval_interpolation_without_a_table(data, ckpt, tmp_path, capsys):
    out = tmp_path / "resumed"
    argv = _train(data, out, "--resume", str(ckpt), "--labels", "contiguous", "--epochs", "2")
    assert run(argv, capsys) == (1, [
        "error: --resume continues a run trained with --labels ids; another value would change its recipe "
        "(give the run's value, or start a new run): --labels contiguous"
    ])  # fmt: skip
    assert not (out / "checkpoint.pth").exists()
    argv = ["eval", "--checkpoint", str(ckpt), "--pos-interpolation", "nearest", "--output-dir", str(tmp_path / "e")]  # fmt: skip
    assert run(argv, capsys) == (1, [
        "error: has no effect without a learned table (the checkpoint's pos_enc peg): --pos-interpolation nearest"
    ])  # fmt: skip
