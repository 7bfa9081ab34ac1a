"""``python -m peg_detr``'s writing verbs overwrite nothing the user owns (``peg_core.engine.outputs``).

``export`` onto its checkpoint, ``predict --output-dir`` into a training folder or onto an input
image, same-named inputs, ``export-hf`` into a Hugging Face folder: each used to replace a file
without a word; now each is one line (exit 1) with the file untouched, or distinct outputs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from peg_detr.__main__ import main
from peg_detr.cli import train as train_main
from peg_detr.data import SyntheticSpec, make_synthetic_coco


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, Path]:
    """A one-epoch tiny DETR run on 64 px shapes: ``(data root, run folder)``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("overwrite")
    spec = SyntheticSpec(size=64, num_classes=3, min_objects=1, max_objects=2, min_frac=0.3)
    data = make_synthetic_coco(root / "data", num_train=4, num_val=2, seed=4, spec=spec)
    train_main(
        [
            "--data-root", str(data), "--output-dir", str(root / "run"), "--epochs", "1", "--backbone", "tiny",
            "--hidden-dim", "32", "--num-heads", "2", "--enc-layers", "1", "--dec-layers", "1",
            "--dim-feedforward", "64", "--num-queries", "5", "--train-sizes", "64", "--crop-resize", "",
            "--val-size", "64", "--total-batch-size", "2", "--workers", "0", "--no-progress",
        ]
    )  # fmt: skip
    yield data, root / "run"
    torch.set_num_threads(before)


def _one_line(capsys: pytest.CaptureFixture, code: int) -> str:
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err.strip()


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_export_refuses_its_own_checkpoint(run, capsys):
    """Case 1: ``export CKPT CKPT`` used to replace the checkpoint with the ONNX graph."""
    _, folder = run
    ckpt = folder / "checkpoint.pth"
    before = ckpt.read_bytes()
    capsys.readouterr()
    err = _one_line(capsys, main(["export", str(ckpt), str(ckpt)]))
    assert (
        err
        == f"error: output is one of the inputs (a training checkpoint); pass --overwrite to replace it: {ckpt}"
    )
    err = _one_line(capsys, main(["export", str(ckpt), str(folder / "report.json")]))
    assert err == (
        f"error: output would replace a training report; pass --overwrite to replace it: {folder / 'report.json'}"
    )
    assert ckpt.read_bytes() == before


def test_predict_refuses_a_training_folder(run, capsys):
    """Case 3: ``predict --output-dir RUN`` used to replace the training run's report.json."""
    data, folder = run
    before = _files(folder)
    image = data / "val2017" / "000001000001.jpg"
    capsys.readouterr()
    err = _one_line(capsys, main(["predict", str(image), "--checkpoint", str(folder / "checkpoint.pth"),
                                  "--output-dir", str(folder)]))  # fmt: skip
    assert err == (
        f"error: output folder holds a training report (report.json); pass --overwrite to replace it: {folder}"
    )
    assert _files(folder) == before and json.loads((folder / "report.json").read_text())["command"] == "train"


def test_predict_refuses_to_draw_over_an_input_image(run, tmp_path, capsys):
    """Case 4: an input inside the output folder used to be replaced by its annotated copy."""
    data, folder = run
    out = tmp_path / "preds"
    out.mkdir()
    mine = out / "photo.png"
    Image.open(data / "val2017" / "000001000001.jpg").save(mine)
    before = mine.read_bytes()
    capsys.readouterr()
    err = _one_line(capsys, main(["predict", str(mine), "--checkpoint", str(folder / "checkpoint.pth"),
                                  "--output-dir", str(out), "--threshold", "0"]))  # fmt: skip
    assert err == f"error: an output is one of the inputs (an image); pass --overwrite to replace it: {mine}"
    assert mine.read_bytes() == before and sorted(p.name for p in out.iterdir()) == ["photo.png"]


def test_same_named_inputs_get_distinct_pictures(run, tmp_path, capsys):
    """Case 5: ``a/x.jpg`` and ``b/x.jpg`` used to give one ``x.png`` (the second over the first)."""
    data, folder = run
    sources = sorted((data / "val2017").glob("*.jpg"))
    inputs = []
    for sub, src in zip("ab", sources, strict=True):
        (tmp_path / sub).mkdir()
        inputs.append(tmp_path / sub / "x.jpg")
        inputs[-1].write_bytes(src.read_bytes())
    out = tmp_path / "preds"
    argv = ["predict", *map(str, inputs), "--checkpoint", str(folder / "checkpoint.pth"), "--output-dir",
            str(out), "--threshold", "0"]  # fmt: skip
    assert main(argv) == 0
    assert sorted(p.name for p in out.glob("*.png")) == ["a_x.png", "b_x.png"]
    report = json.loads((out / "report.json").read_text())
    assert report["pictures"] == {str(inputs[0]): str(out / "a_x.png"), str(inputs[1]): str(out / "b_x.png")}
    with Image.open(out / "a_x.png") as a, Image.open(out / "b_x.png") as b:
        assert a.tobytes() != b.tobytes()  # two pictures of two images
    # a second run into its own folder replaces its own files
    capsys.readouterr()
    assert main(argv) == 0
    assert (
        capsys.readouterr().out.splitlines()[-1]
        == f"predict done: 2 images, 0 skipped, 10 detections ({out})"
    )


def test_export_hf_refuses_an_existing_hugging_face_folder(run, tmp_path, capsys):
    """Case 6: ``export-hf`` into a Hugging Face folder used to replace its model.safetensors and config.json."""
    _, folder = run
    hf = tmp_path / "detr-resnet-50"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "detr"}))
    (hf / "model.safetensors").write_bytes(b"someone's weights")
    before = _files(hf)
    capsys.readouterr()
    err = _one_line(capsys, main(["export-hf", str(folder / "checkpoint.pth"), str(hf)]))
    assert err == (
        "error: output folder holds a Hugging Face model (config.json, model.safetensors); pass --overwrite "
        f"to replace them: {hf}"
    )
    assert _files(hf) == before


def test_predict_missing_and_unreadable_files_are_skipped_and_listed(run, tmp_path, capsys):
    """One behaviour for the three ``predict`` verbs: skipped, counted, listed; none read is one line."""
    data, folder = run
    image = data / "val2017" / "000001000001.jpg"
    missing, text = tmp_path / "gone.jpg", tmp_path / "notes.jpg"
    text.write_text("not an image")
    out, preds = tmp_path / "p.json", tmp_path / "preds"
    argv = ["predict", str(missing), str(image), str(text), "--checkpoint", str(folder / "checkpoint.pth"),
            "--output-dir", str(preds), "--output", str(out), "--threshold", "1"]  # fmt: skip
    capsys.readouterr()
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{missing}: skipped (file not found)"
    assert lines[-1] == f"predict done: 1 image, 2 skipped, 0 detections ({out})"
    report = json.loads(out.read_text())
    assert report == json.loads((preds / "report.json").read_text())
    assert report["images"] == 1 and report["broken"]["predict"]["count"] == 2
    assert [r["path"] for r in report["predictions"]] == [str(missing), str(image), str(text)]
    err = _one_line(capsys, main(["predict", str(missing), str(text), "--checkpoint", str(folder / "checkpoint.pth"),
                                  "--output-dir", str(tmp_path / "none")]))  # fmt: skip
    assert err == f"error: no image could be read (2 skipped; first: file not found): {missing}"
