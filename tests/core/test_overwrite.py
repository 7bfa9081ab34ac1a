"""Nothing the user owns is overwritten (``peg_core.engine.outputs``): the rule, and the classifier's verbs.

Each refusal is one line ``error: <what>; pass --overwrite ...: <path>``, exit 1, with the file
left byte for byte as it was; ``--overwrite`` (``--resume auto`` for ``train``) says otherwise.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from peg_core.__main__ import main
from peg_core.engine import UserError, check_output_file, check_output_folder, file_kind, output_names
from peg_core.engine.outputs import CHECKPOINT, ONNX, WEIGHTS, report_kind
from peg_core.interop import write_state_file
from tests.core.classify_runs import (
    keep_threads,  # noqa: F401 (autouse: restores torch's threads)
    one_line_error,
    tiny,
)

TINY = tiny(16, 8)


def _train(out: Path, *extra: str) -> int:
    return main(["train", *TINY, "--output-dir", str(out), *extra])


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A finished two-epoch run: ``checkpoint.pth``, ``checkpoint_prev.pth`` and a training ``report.json``."""
    out = tmp_path_factory.mktemp("overwrite") / "run"
    threads = torch.get_num_threads()
    try:
        assert _train(out, "--epochs", "2") == 0
    finally:
        torch.set_num_threads(threads)
    return out


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> list[Path]:
    shapes = tmp_path_factory.mktemp("shapes")
    assert main(["make-data", str(shapes), "--num-train", "12", "--num-val", "12", "--img-size", "16"]) == 0
    return sorted((shapes / "val").glob("*/*.png"))[:2]


def _bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


# ------------------------------------------------------------------------------------- the rule


def test_file_kinds_are_told_by_name_suffix_and_report_command(tmp_path):
    (tmp_path / "report.json").write_text(json.dumps({"command": "train"}))
    (tmp_path / "eval.json").write_text(json.dumps({"command": "eval"}))
    (tmp_path / "coco.json").write_text(json.dumps({"images": []}))
    for name in (
        "checkpoint.pth",
        "checkpoint_prev.pth",
        "checkpoint0003.pth",
        "w.safetensors",
        "m.onnx",
        "x.png",
    ):
        (tmp_path / name).write_bytes(b"x")
    kinds = {p.name: file_kind(p) for p in tmp_path.iterdir()}
    assert kinds == {
        "report.json": "a training report", "eval.json": "an eval report", "coco.json": "a JSON file",
        "checkpoint.pth": CHECKPOINT, "checkpoint_prev.pth": CHECKPOINT, "checkpoint0003.pth": CHECKPOINT,
        "w.safetensors": WEIGHTS, "m.onnx": ONNX, "x.png": "an image",
    }  # fmt: skip
    assert file_kind(tmp_path / "nothing") is None and file_kind(tmp_path) == "a folder"


def test_check_output_file_refuses_an_input_and_another_kind_but_replaces_its_own(tmp_path):
    ckpt = tmp_path / "checkpoint.pth"
    ckpt.write_bytes(b"weights")
    with pytest.raises(UserError) as e:
        check_output_file(
            ckpt, ONNX, inputs=[tmp_path / "." / "checkpoint.pth"]
        )  # the same file, spelled otherwise
    assert e.value.line() == (
        f"error: output is one of the inputs (a training checkpoint); pass --overwrite to replace it: {ckpt}"
    )
    with pytest.raises(UserError, match=r"^output would replace a training checkpoint; pass --overwrite"):
        check_output_file(ckpt, ONNX)
    (tmp_path / "old.onnx").write_bytes(b"an earlier export")
    assert check_output_file(tmp_path / "old.onnx", ONNX) == tmp_path / "old.onnx"  # same kind: replaced
    assert check_output_file(ckpt, ONNX, inputs=[ckpt], overwrite=True) == ckpt
    assert ckpt.read_bytes() == b"weights"  # a check writes nothing


def test_check_output_folder_replaces_only_what_the_same_verb_wrote(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "report.json").write_text(json.dumps({"command": "train"}))
    with pytest.raises(UserError) as e:
        check_output_folder(run, ["report.json", "x.png"], command="predict")
    assert e.value.line() == (
        f"error: output folder holds a training report (report.json); pass --overwrite to replace it: {run}"
    )
    preds = tmp_path / "preds"
    preds.mkdir()
    (preds / "report.json").write_text(json.dumps({"command": "predict"}))
    (preds / "x.png").write_bytes(b"an earlier picture")
    assert check_output_folder(preds, ["report.json", "x.png"], command="predict") == preds
    with pytest.raises(UserError, match=r"^an output is one of the inputs \(an image\)"):
        check_output_folder(preds, ["x.png"], command="predict", inputs=[preds / "x.png"])
    assert report_kind("predict") == "a predict report"


def test_same_named_inputs_get_distinct_output_names(tmp_path):
    a, b = tmp_path / "a" / "x.jpg", tmp_path / "b" / "x.jpg"
    assert output_names([a, b, tmp_path / "y.jpg"], ".png") == ["a_x.png", "b_x.png", "y.png"]
    assert output_names([a, a], ".png") == ["x.png", "x.png"]  # the same file twice: one picture
    assert output_names([a, tmp_path / "a" / "x.png"], ".png") == ["x_jpg.png", "x_png.png"]
    deep = [tmp_path / "p" / "a" / "x.jpg", tmp_path / "q" / "a" / "x.jpg"]
    assert output_names(deep, ".png") == ["p_a_x.png", "q_a_x.png"]


# ------------------------------------------------------------------------------- train (case 7)


def test_a_new_train_refuses_a_finished_runs_folder(run, tmp_path, capsys):
    """A new ``train`` without ``--resume`` used to replace checkpoint.pth and checkpoint_prev.pth."""
    before = _bytes(run)
    assert {"checkpoint.pth", "checkpoint_prev.pth", "report.json"} <= set(before)
    capsys.readouterr()
    err = one_line_error(capsys, _train(run, "--epochs", "1"))
    assert err == (
        "error: output folder holds a finished training run (checkpoint.pth, checkpoint_prev.pth); pass "
        f"--resume auto to continue it or --overwrite to start a new run: {run}"
    )
    assert _bytes(run) == before
    # --resume auto continues it (here: nothing left to do), leaving the checkpoints as they were
    assert _train(run, "--epochs", "2", "--resume", "auto") == 0
    assert "nothing to do" in capsys.readouterr().out
    assert (run / "checkpoint.pth").read_bytes() == before["checkpoint.pth"]


def test_train_overwrite_starts_a_new_run_without_the_old_ones_files(run, tmp_path, capsys):
    copy = tmp_path / "copy"
    copy.mkdir()
    for name, data in _bytes(run).items():
        (copy / name).write_bytes(data)
    (copy / "checkpoint0000.pth").write_bytes(b"an old --save-every copy")
    (copy / "notes.txt").write_text("mine")
    assert _train(copy, "--epochs", "1", "--overwrite") == 0
    out = capsys.readouterr().out
    assert "--overwrite: removed the earlier run's checkpoint_prev.pth" in out
    assert not (copy / "checkpoint_prev.pth").exists() and not (copy / "checkpoint0000.pth").exists()
    assert json.loads((copy / "report.json").read_text())["epochs"] == 1
    epochs = [json.loads(r)["step"] for r in (copy / "log.jsonl").read_text().splitlines() if '"train"' in r]
    assert epochs == [0]  # the new run's log only, not appended to the old two-epoch run's
    assert (copy / "notes.txt").read_text() == "mine"


def test_train_refuses_a_folder_with_another_commands_report(tmp_path, capsys):
    ev = tmp_path / "ev"
    ev.mkdir()
    (ev / "report.json").write_text(json.dumps({"command": "eval"}))
    err = one_line_error(capsys, _train(ev, "--epochs", "1"))
    assert (
        err
        == f"error: output folder holds an eval report (report.json); pass --overwrite to replace it: {ev}"
    )


# ---------------------------------------------------------------------------- predict (case 2)


def test_predict_output_refuses_the_runs_checkpoint_report_and_inputs(run, images, tmp_path, capsys):
    """``predict --output`` onto the run's own checkpoint.pth used to replace it with JSON."""
    before = _bytes(run)
    ckpt = run / "checkpoint.pth"
    argv = ["predict", "--checkpoint", str(ckpt), *map(str, images), "--device", "cpu"]
    capsys.readouterr()
    err = one_line_error(capsys, main([*argv, "--output", str(ckpt)]))
    assert (
        err
        == f"error: output is one of the inputs (a training checkpoint); pass --overwrite to replace it: {ckpt}"
    )
    err = one_line_error(capsys, main([*argv, "--output", str(run / "report.json")]))
    assert err == (
        f"error: output would replace a training report; pass --overwrite to replace it: {run / 'report.json'}"
    )
    picture = images[0].read_bytes()
    err = one_line_error(capsys, main([*argv, "--output", str(images[0])]))
    assert (
        err == f"error: output is one of the inputs (an image); pass --overwrite to replace it: {images[0]}"
    )
    assert _bytes(run) == before and images[0].read_bytes() == picture
    # a file of predict's own is replaced
    out = tmp_path / "p.json"
    assert main([*argv, "--output", str(out)]) == 0
    assert main([*argv, "--output", str(out)]) == 0
    assert json.loads(out.read_text())["command"] == "predict"


# --------------------------------------------------------------------- surgery (case 8) and eval


def test_surgery_refuses_its_input_and_a_training_checkpoint(run, tmp_path, capsys):
    """``to-cpvt IN IN`` / ``resize-pos-embed IN OUT`` used to write over their input or a run's checkpoint."""
    from tests.core.test_surgery import deit_like

    src = tmp_path / "deit.safetensors"
    write_state_file(deit_like(grid=4), src)
    before = src.read_bytes()
    err = one_line_error(capsys, main(["to-cpvt", str(src), str(src)]))
    assert (
        err == f"error: output is one of the inputs (a weights file); pass --overwrite to replace it: {src}"
    )
    ckpt = run / "checkpoint.pth"
    held = ckpt.read_bytes()
    err = one_line_error(capsys, main(["resize-pos-embed", str(src), str(ckpt), "--grid", "6"]))
    assert err == f"error: output would replace a training checkpoint; pass --overwrite to replace it: {ckpt}"
    assert src.read_bytes() == before and ckpt.read_bytes() == held
    # another weights file (an earlier output) is replaced; --overwrite allows the input itself
    (tmp_path / "out.pth").write_bytes(b"an earlier output")
    assert main(["resize-pos-embed", str(src), str(tmp_path / "out.pth"), "--grid", "6"]) == 0
    assert main(["to-cpvt", str(src), str(src), "--overwrite"]) == 0
    assert src.read_bytes() != before


def test_eval_overwrite_replaces_another_commands_report_only_when_asked(run, tmp_path, capsys):
    other = tmp_path / "other"
    other.mkdir()
    (other / "report.json").write_text(json.dumps({"command": "predict"}))
    argv = ["eval", "--checkpoint", str(run / "checkpoint.pth"), "--output-dir", str(other), "--no-progress",
            "--device", "cpu"]  # fmt: skip
    capsys.readouterr()
    err = one_line_error(capsys, main(argv))
    assert err == (
        "error: output folder holds a predict report (report.json); pass --overwrite to replace it, or choose "
        f"another folder (default: {run / 'eval'}): {other}"
    )
    assert main([*argv, "--overwrite"]) == 0
    assert json.loads((other / "report.json").read_text())["command"] == "eval"


# ------------------------------------------------------------------- predict's shared behaviour


def test_predict_skips_a_missing_file_lists_it_and_exits_0(run, images, tmp_path, capsys):
    """A missing file among others is skipped and listed (it used to stop the command before any work)."""
    missing = tmp_path / "gone.png"
    out = tmp_path / "p.json"
    argv = ["predict", "--checkpoint", str(run / "checkpoint.pth"), str(missing), *map(str, images),
            "--output", str(out), "--device", "cpu"]  # fmt: skip
    capsys.readouterr()
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{missing}: skipped (file not found)"
    assert lines[-1] == f"predict done: 2 images, 1 skipped ({out})"
    report = json.loads(out.read_text())
    assert report["images"] == 2 and report["broken"]["predict"] == {
        "count": 1, "total": 3, "samples": [{"path": str(missing), "reason": "file not found"}],
    }  # fmt: skip
    assert [r["skipped"] for r in report["predictions"]] == ["file not found", None, None]
    err = one_line_error(capsys, main(["predict", "--checkpoint", str(run / "checkpoint.pth"), str(missing)]))
    assert err == f"error: cannot read the image (file not found): {missing}"
