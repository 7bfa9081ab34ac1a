"""Video fine-tuning onto another class list: the head keeps the rows of classes shared by name.

From a peg_video checkpoint (``init_weights``, ``train --init CKPT``) and from a Hugging Face
VideoMAE classifier folder (``model_from_hf_folder``), with ``--class-map`` for a synonym; every
other tensor is the start's, the other rows keep their fresh initialisation.
"""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import torch

from peg_core.engine import read_checkpoint
from peg_video.__main__ import main
from peg_video.model import build_model, init_weights, model_from_hf_folder

RUN = ["--epochs", "1", "--batch-size", "2", "--num-clips", "1", "--stride", "2", "--no-progress", "--workers", "0",
       "--device", "cpu", "--eval-every", "0", "--config", "synthetic_tiny", "--num-frames", "4", "--crop", "32"]  # fmt: skip
#: the source's class -> the name the new data gives it (None: that class is not in the new data)
RENAMED = {"move right": "Move Right", "move left": "shift left", "move up": "jump", "move down": "move_down"}


VIDEOS = dict(frames=8)  # the module's ``data`` (tests/video/conftest.py)


@pytest.fixture(scope="module")
def source(data, tmp_path_factory):
    """A checkpoint trained one epoch on the generated classes."""
    out = tmp_path_factory.mktemp("source")
    argv = ["train", "--train-ann", str(data / "train.csv"), "--val-ann", str(data / "val.csv"), "--output-dir",
            str(out), *RUN]  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(argv) == 0
    return out / "checkpoint.pth"


def _relabelled(data, out):
    """The same videos under the names of :data:`RENAMED` (class folders linked under the new names)."""
    out.mkdir()
    for split in ("train", "val"):
        rows = (data / f"{split}.csv").read_text().splitlines()
        for old, new in RENAMED.items():
            rows = [r.replace(f'"{old}"', f'"{new}"') for r in rows]
        (out / f"{split}.csv").write_text("\n".join(rows) + "\n")
        (out / split).mkdir()
        for folder in (data / split).iterdir():
            name = RENAMED.get(folder.name.replace("_", " "), folder.name).replace(" ", "_")
            (out / split / name).symlink_to(folder.resolve(), target_is_directory=True)
    return out


def test_a_video_checkpoint_start_keeps_the_rows_of_shared_names(source, data, tmp_path):
    ckpt = read_checkpoint(source, "video")
    start_classes, start = ckpt["meta"]["classes"], ckpt["model"]
    classes = ["Move Right", "jump", "shift_left", "brand new"]
    model = build_model({**ckpt["model_config"], "num_classes": len(classes)})
    fresh = {k: v.clone() for k, v in model.state_dict().items()}
    report = init_weights(model, source, classes=classes, class_map={"shift left": "move left"})
    kept = dict(report.classes.kept)
    assert kept == {0: start_classes.index("move_right"), 2: start_classes.index("move_left")}
    assert report.classes.fresh == [1, 3]
    state = model.state_dict()
    for key in ("head.weight", "head.bias"):
        for i, s in kept.items():
            assert torch.equal(state[key][i], start[key][s])
        for i in report.classes.fresh:
            assert torch.equal(state[key][i], fresh[key][i])
    for key, value in state.items():
        if not key.startswith("head."):
            assert torch.equal(value, start[key]), key
    assert "kept 2 of 4 classes by name (Move Right, shift_left <- move_left)" in report.line()


def test_train_init_from_a_checkpoint_with_a_class_map_says_what_it_kept(source, data, tmp_path):
    new = _relabelled(data, tmp_path / "new")
    (tmp_path / "map.json").write_text(json.dumps({"shift left": "move left"}))
    out = tmp_path / "run"
    argv = ["train", "--train-ann", str(new / "train.csv"), "--val-ann", str(new / "val.csv"), "--output-dir",
            str(out), "--init", str(source), "--class-map", str(tmp_path / "map.json"), *RUN]  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert main(argv) == 0
    line = next(t for t in printed.getvalue().splitlines() if "classes by name" in t)
    assert (
        "Move_Right" in line and "shift_left <- move_left" in line and "jump" in line.split("start fresh")[1]
    )


def test_a_class_map_entry_naming_no_class_is_one_line(source, data, tmp_path, capsys):
    (tmp_path / "map.json").write_text(json.dumps({"teleport": "move left"}))
    argv = ["train", "--train-ann", str(data / "train.csv"), "--val-ann", str(data / "val.csv"), "--output-dir",
            str(tmp_path / "run"), "--init", str(source), "--class-map", str(tmp_path / "map.json"), *RUN]  # fmt: skip
    assert main(argv) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: class map entry 'teleport': no category of the data has this name: {tmp_path / 'map.json'}"
    ]
    (tmp_path / "bad.json").write_text(json.dumps(["teleport"]))
    assert main([*argv[: -len(RUN) - 2], "--class-map", str(tmp_path / "bad.json"), *RUN]) != 0
    assert "a class map is a JSON object" in capsys.readouterr().err


def test_a_hugging_face_classifier_folder_keeps_its_rows_of_shared_names(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.VideoMAEConfig(
        image_size=32, patch_size=8, num_frames=4, tubelet_size=2, hidden_size=32, num_hidden_layers=1,
        num_attention_heads=2, intermediate_size=64, id2label={0: "air drumming", 1: "Juggling", 2: "yoga"},
    )  # fmt: skip
    torch.manual_seed(0)
    hf = transformers.VideoMAEForVideoClassification(cfg).eval()
    hf.save_pretrained(tmp_path / "hf")
    classes = ["juggling", "air_drumming", "surfing"]
    model, config, report = model_from_hf_folder(tmp_path / "hf", "table", 3, classes=classes)
    assert config["num_classes"] == 3 and report.classes.kept == [(0, 1), (1, 0)]
    head = model.state_dict()
    torch.testing.assert_close(head["head.weight"][:2], hf.classifier.weight[[1, 0]], rtol=0, atol=0)
    torch.testing.assert_close(head["head.bias"][:2], hf.classifier.bias[[1, 0]], rtol=0, atol=0)
    assert not any(torch.equal(head["head.weight"][2], row) for row in hf.classifier.weight)
    rebuilt = build_model(config)  # the run's checkpoint config rebuilds the same shapes
    assert rebuilt.state_dict()["head.weight"].shape == (3, 32)
