"""Broken images (missing, truncated, not an image, malformed annotation): skipped, listed, not evaluated."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from peg_detr.__main__ import main as cli
from peg_detr.cli import train as train_main
from peg_detr.data import SyntheticSpec, load_coco_annotations, make_synthetic_coco

pytestmark = pytest.mark.slow

RUN = ["--backbone", "tiny", "--hidden-dim", "32", "--num-heads", "2", "--enc-layers", "1", "--dec-layers", "1",
       "--dim-feedforward", "64", "--num-queries", "5", "--train-sizes", "64", "--crop-resize", "", "--val-size",
       "64", "--total-batch-size", "4", "--workers", "0", "--no-progress", "--epochs", "1"]  # fmt: skip


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    """16 train images (3 broken: truncated, missing, malformed bbox), 6 val (2 broken: text file, no bbox)."""
    spec = SyntheticSpec(size=64, num_classes=3, min_objects=1, max_objects=2, min_frac=0.3)
    root = make_synthetic_coco(tmp_path_factory.mktemp("broken"), num_train=16, num_val=6, seed=5, spec=spec)
    train, val = root / "train2017", root / "val2017"
    jpg = (train / "000000000002.jpg").read_bytes()
    (train / "000000000002.jpg").write_bytes(jpg[: len(jpg) // 2])
    (train / "000000000003.jpg").unlink()
    (val / "000001000001.jpg").write_text("this is not a picture\n")
    for split, image_id, edit in (("train", 4, [1.0, 2.0, 3.0]), ("val", 1000002, None)):
        path = root / "annotations" / f"instances_{split}2017.json"
        doc = json.loads(path.read_text())
        ann = next(a for a in doc["annotations"] if a["image_id"] == image_id)
        if edit is None:
            del ann["bbox"]
        else:
            ann["bbox"] = edit
        path.write_text(json.dumps(doc))
    return root


def _reasons(report, split):
    return {s["path"].rsplit("/", 1)[-1]: s["reason"] for s in report["broken"][split]["samples"]}


def test_annotations_with_malformed_bbox_mark_the_image(broken):
    ann = load_coco_annotations(broken / "annotations" / "instances_val2017.json")
    assert set(ann.broken) == {1000002} and "has no 'bbox'" in ann.broken[1000002]
    assert ann.coco.getAnnIds(imgIds=[1000002]) == []  # left out of the ground truth pycocotools sees
    assert len(ann.coco.imgs) == 6


def test_broken_images_are_skipped_listed_and_not_evaluated(broken, tmp_path):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        report = train_main(
            ["--data-root", str(broken), "--output-dir", str(tmp_path), "--max-broken", "35%", *RUN]
        )
    finally:
        torch.set_num_threads(before)
    assert report["status"] == "finished"
    train = _reasons(report, "train")
    assert set(train) == {"000000000002.jpg", "000000000003.jpg", "000000000004.jpg"}
    assert train["000000000002.jpg"].startswith("unreadable image (image file is truncated")
    assert train["000000000003.jpg"] == "image file not found"
    assert "has a malformed bbox [1.0, 2.0, 3.0]" in train["000000000004.jpg"]
    assert report["broken"]["train"]["total"] == 16 and report["train"]["broken"] == 3
    val = _reasons(report, "val")
    assert val == {"000001000001.jpg": "not an image file (PIL cannot identify it)",
                   "000001000002.jpg": val["000001000002.jpg"]}  # fmt: skip
    assert "has no 'bbox'" in val["000001000002.jpg"]
    # The two unreadable val images are left out of COCOeval, not counted as missed detections.
    assert (report["eval"]["images"], report["eval"]["excluded"]) == (4, 2)
    assert json.loads((tmp_path / "report.json").read_text())["broken"]["val"]["count"] == 2

    ev = tmp_path / "ev"
    code = cli(["eval", "--checkpoint", str(tmp_path / "checkpoint.pth"), "--output-dir", str(ev), "--max-broken",
                "35%", "--workers", "0", "--no-progress"])  # fmt: skip
    assert code == 0
    assert _reasons(json.loads((ev / "report.json").read_text()), "val") == val


def test_too_many_broken_stops_with_one_line(broken, tmp_path, capsys):
    # The default --max-broken is 1%.
    code = cli(["train", "--data-root", str(broken), "--output-dir", str(tmp_path), *RUN])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1
    assert err[0].startswith("error: too many broken samples in split 'train': ")
    assert "of 16 (more than --max-broken 1.0%); first: " in err[0]


def test_nothing_readable_is_an_error(broken, tmp_path, capsys):
    root = tmp_path / "all_broken"
    shutil.copytree(broken, root)
    for f in (root / "val2017").glob("*.jpg"):
        f.write_text("x")
    code = cli(["eval", "--checkpoint", str(_checkpoint(broken, tmp_path)), "--data-root", str(root),
                "--output-dir", str(tmp_path / "ev"), "--no-progress", "--workers", "0"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1
    assert err[0].startswith("error: nothing could be read in split 'val' (6 of 6")


def _checkpoint(data, tmp_path):
    out = tmp_path / "run"
    train_main(["--data-root", str(data), "--output-dir", str(out), "--max-broken", "35%", "--eval-every", "0",
                "--epochs", "1", *RUN])  # fmt: skip
    return out / "checkpoint.pth"
