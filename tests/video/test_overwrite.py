"""``python -m peg_video``'s writing verbs overwrite nothing the user owns (``peg_core.engine.outputs``).

The checks run before the checkpoint or any data is read, so the files here only need to exist:
a refusal is one line (exit 1) and leaves them byte for byte as they were.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from peg_video.__main__ import main
from tests.video.runs import TINY


def _one_line(capsys: pytest.CaptureFixture, code: int) -> str:
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err.strip()


@pytest.fixture
def finished(tmp_path: Path) -> Path:
    """A folder as a finished ``train`` leaves it (the files' contents do not matter to the checks)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoint.pth").write_bytes(b"the newest checkpoint")
    (run / "checkpoint_prev.pth").write_bytes(b"the one before")
    (run / "report.json").write_text(json.dumps({"task": "video", "command": "train", "status": "finished"}))
    return run


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_export_refuses_its_own_checkpoint(finished, capsys):
    ckpt = finished / "checkpoint.pth"
    before = _files(finished)
    err = _one_line(capsys, main(["export", str(ckpt), str(ckpt)]))
    assert (
        err
        == f"error: output is one of the inputs (a training checkpoint); pass --overwrite to replace it: {ckpt}"
    )
    assert _files(finished) == before


def test_predict_output_refuses_the_runs_checkpoint(finished, tmp_path, capsys):
    ckpt = finished / "checkpoint.pth"
    before = _files(finished)
    video = tmp_path / "clip.mp4"
    err = _one_line(capsys, main(["predict", "--checkpoint", str(ckpt), str(video), "--output", str(ckpt)]))
    assert (
        err
        == f"error: output is one of the inputs (a training checkpoint); pass --overwrite to replace it: {ckpt}"
    )
    assert _files(finished) == before


def test_export_hf_refuses_an_existing_hugging_face_folder(finished, tmp_path, capsys):
    hf = tmp_path / "videomae-small"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "videomae"}))
    (hf / "model.safetensors").write_bytes(b"someone's weights")
    before = _files(hf)
    err = _one_line(capsys, main(["export-hf", str(finished / "checkpoint.pth"), str(hf)]))
    assert err == (
        "error: output folder holds a Hugging Face model (config.json, model.safetensors); pass --overwrite "
        f"to replace them: {hf}"
    )
    assert _files(hf) == before


def test_a_new_train_refuses_a_finished_runs_folder(finished, tmp_path, capsys):
    before = _files(finished)
    argv = ["train", "--train-ann", str(tmp_path / "train.csv"), "--output-dir", str(finished), *TINY]
    err = _one_line(capsys, main(argv))
    assert err == (
        "error: output folder holds a finished training run (checkpoint.pth, checkpoint_prev.pth); pass "
        f"--resume auto to continue it or --overwrite to start a new run: {finished}"
    )
    assert _files(finished) == before
