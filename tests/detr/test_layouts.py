"""Detection data as users have it: COCO, Roboflow COCO export, ultralytics YOLO and explicit files.

The Roboflow and YOLO sets are the synthetic COCO shapes re-exported by
:func:`peg_detr.data.layouts.write_layout` (the same image files), so each converted split can be
compared with the COCO split it came from, box by box, and a run on it with the run on the COCO layout.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from peg_core.engine import BrokenSample, read_checkpoint
from peg_detr.__main__ import main as cli
from peg_detr.cli import evaluate as eval_main
from peg_detr.cli import train as train_main
from peg_detr.data import CocoDetr, SyntheticSpec, load_coco_annotations, make_synthetic_coco
from peg_detr.data.layouts import (
    DataLayoutError,
    detect_layout,
    drop_filler_category,
    write_layout,
    yolo_label_path,
)
from peg_detr.evaluation import STAT_NAMES, coco_stats
from tests.core.test_optional_deps import _hide

#: COCO stats over all areas: a YOLO set has no ``area`` (its boxes' area is used), so the
#: small / medium / large numbers may differ from the COCO set's shape areas, these may not
ALL_AREAS = ("ap", "ap50", "ap75", "ar1", "ar10", "ar100")


#: the module's ``coco`` (tests/conftest.py): 16 train and 4 val images, 64 px, 0-2 shapes of 3 classes
#: (some images without objects)
COCO_SET = dict(min_objects=0, num_train=16)


@pytest.fixture(scope="module")
def roboflow(coco, tmp_path_factory) -> Path:
    return write_layout(coco, tmp_path_factory.mktemp("rf") / "export", "roboflow", name="shapes")


@pytest.fixture(scope="module")
def yolo(coco, tmp_path_factory) -> Path:
    return write_layout(coco, tmp_path_factory.mktemp("yolo") / "set", "yolo")


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _without_objects(coco: Path, split: str) -> int:
    """How many images of the COCO split have no annotation (a YOLO export writes them no label file)."""
    doc = json.loads((coco / "annotations" / f"instances_{split}2017.json").read_text())
    return len({im["id"] for im in doc["images"]} - {a["image_id"] for a in doc["annotations"]})


def _boxes_by_file(split) -> dict[str, list[tuple[str, list[float]]]]:
    """``{file name: [(category name, bbox), ...]}`` of a split (or its annotations), in annotation order."""
    annotations = getattr(split, "annotations", split)
    coco = annotations.coco
    names = {c["id"]: c["name"] for c in annotations.categories}
    out = {}
    for image_id, im in coco.imgs.items():
        anns = sorted(coco.imgToAnns[image_id], key=lambda a: a["id"])
        out[Path(im["file_name"]).name] = [(names[a["category_id"]], a["bbox"]) for a in anns]
    return out


# ------------------------------------------------------------------------------------------- detection


def test_each_layout_is_detected_and_said_in_one_line(coco, roboflow, yolo):
    lines = {}
    empty = {s: _without_objects(coco, s) for s in ("train", "val")}
    assert empty["train"] > 0 and empty["val"] > 0
    for root in (coco, roboflow, yolo, yolo / "data.yaml"):
        layout = detect_layout(root)
        layout.split("train"), layout.split("val")
        lines[layout.kind, Path(root).name] = layout.describe()
    assert lines.pop(("yolo", "data.yaml")) == lines[("yolo", "set")]
    assert lines == {
        ("coco", coco.name): "data: COCO layout (train2017/ + annotations/instances_train2017.json, "
        "val2017/ + annotations/instances_val2017.json)",
        ("roboflow", "export"): "data: Roboflow COCO export (train/, valid/); its category 0 'shapes' names "
        "the data set and is not a class",
        ("yolo", "set"): "data: ultralytics YOLO set data.yaml (train images/train, val images/val); 3 classes, "
        f"{empty['train']} train images without a label file (no objects); {empty['val']} val images without "
        "a label file (no objects)",
    }  # fmt: skip
    explicit = detect_layout(
        None,
        train_ann=coco / "annotations/instances_train2017.json", train_images=coco / "train2017",
        val_ann=coco / "annotations/instances_val2017.json", val_images=coco / "val2017",
    )  # fmt: skip
    assert explicit.kind == "explicit" and explicit.describe().startswith("data: explicit files (train: ")
    # one split explicit, the other from the detected layout
    mixed = detect_layout(
        roboflow, val_ann=coco / "annotations/instances_val2017.json", val_images=coco / "val2017"
    )
    assert mixed.kind == "roboflow" and mixed.split("val").images == coco / "val2017"
    assert mixed.split("train").images == roboflow / "train"


def test_a_folder_without_a_layout_is_one_line(tmp_path, capsys):
    (tmp_path / "pictures").mkdir()
    with pytest.raises(DataLayoutError) as e:
        detect_layout(tmp_path)
    assert str(e.value) == (
        "no detection data layout found (looked for train2017/, val2017/ or annotations/ (COCO), train/ or "
        "valid/ with _annotations.coco.json (Roboflow COCO export), data.yaml or data.yml (ultralytics YOLO); "
        f"or give --train-ann/--train-images and --val-ann/--val-images): {tmp_path}"
    )
    capsys.readouterr()
    code = cli(
        ["train", "--data-root", str(tmp_path), "--output-dir", str(tmp_path / "out"), "--epochs", "1"]
    )
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and "Traceback" not in err
    assert (
        err.startswith("error: no detection data layout found (looked for train2017/")
        and str(tmp_path) in err
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"train_ann": "a.json"}, "--train-ann needs --train-images (a COCO json and the folder of its images)"),
        ({"val_images": "imgs"}, "--val-images needs --val-ann (a COCO json and the folder of its images)"),
        ({"train_ann": "a.json", "train_images": "imgs", "train_json": "b.json"},
         "--train-json and --train-ann both name the train annotations (--train-ann with --train-images is the "
         "general form; give one)"),
        ({"val_ann": "nope.json", "val_images": "."}, "annotation file not found (--val-ann)"),
    ],
)  # fmt: skip
def test_explicit_flags_are_checked(coco, flags, message):
    with pytest.raises(DataLayoutError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        detect_layout(coco, **flags)


# -------------------------------------------------------------------------------------------- Roboflow


def test_roboflow_filler_category_is_dropped(coco, roboflow):
    raw = json.loads((roboflow / "train" / "_annotations.coco.json").read_text())
    assert raw["categories"][0] == {"id": 0, "name": "shapes", "supercategory": "none"}
    layout = detect_layout(roboflow)
    for split, folder in (("train", "train"), ("val", "valid")):
        got = layout.split(split)
        assert got.images == roboflow / folder and got.source == roboflow / folder / "_annotations.coco.json"
        want = load_coco_annotations(coco / "annotations" / f"instances_{split}2017.json")
        assert [(c["id"], c["name"]) for c in got.annotations.categories] == [
            (c["id"], c["name"]) for c in want.categories
        ]
        # numbered from 0, as Roboflow does; read from 1 (COCOeval takes a match with annotation 0 for none)
        raw = json.loads(got.source.read_text())
        assert min(im["id"] for im in raw["images"]) == 0 and min(a["id"] for a in raw["annotations"]) == 0
        assert sorted(a["id"] for a in got.annotations.coco.dataset["annotations"]) == list(
            range(1, len(raw["annotations"]) + 1)
        )
        fields = ("category_id", "bbox", "area", "iscrowd")
        assert [{k: a[k] for k in fields} for a in got.annotations.coco.dataset["annotations"]] == [
            {k: a[k] for k in fields} for a in want.coco.dataset["annotations"]
        ]
        assert _boxes_by_file(got) == _boxes_by_file(want)


@pytest.mark.parametrize("backend", ["faster", "pycocotools"])
def test_annotation_id_0_is_matched(tmp_path, backend):
    """Roboflow numbers annotations from 0; COCOeval takes a match with gt id 0 for none (AP 0.25, not 1)."""
    doc = {
        "images": [{"id": i, "file_name": f"{i}.jpg", "width": 100, "height": 100} for i in (0, 1)],
        "categories": [{"id": 1, "name": "x"}],
        "annotations": [
            {"id": i, "image_id": i, "category_id": 1, "bbox": [10, 10, 50, 50], "area": 2500} for i in (0, 1)
        ],
    }
    path = tmp_path / "a.json"
    path.write_text(json.dumps(doc))
    ann = load_coco_annotations(path)
    assert sorted(ann.coco.anns) == [1, 2]  # shifted, in the same order
    detections = [{"image_id": i, "category_id": 1, "bbox": [10, 10, 50, 50], "score": 0.9} for i in (0, 1)]
    assert coco_stats(ann.coco, detections, [0, 1], verbose=False, backend=backend)["ap"] == 1.0


@pytest.mark.parametrize(
    ("categories", "annotated", "dropped"),
    [
        # Roboflow: supercategory "none", the classes under it
        ([(0, "fruits", "none"), (1, "apple", "fruits"), (2, "banana", "fruits")], {1, 2}, True),
        # the filler named as the classes' supercategory (supercategory not "none")
        ([(0, "fruits", "objects"), (1, "apple", "fruits"), (2, "banana", "fruits")], {1}, True),
        # ids from 0, category 0 a class: annotated
        ([(0, "apple", "fruits"), (1, "banana", "fruits")], {0, 1}, False),
        # ids from 0, category 0 a class without annotations in this split: not the filler
        ([(0, "apple", "fruits"), (1, "banana", "fruits")], {1}, False),
        # a filler that has annotations is a class
        ([(0, "fruits", "none"), (1, "apple", "fruits")], {0, 1}, False),
        # category 0 alone is never dropped
        ([(0, "fruits", "none")], set(), False),
    ],
)
def test_filler_rule(categories, annotated, dropped):
    doc = {
        "categories": [{"id": i, "name": n, "supercategory": s} for i, n, s in categories],
        "annotations": [{"id": k, "image_id": 1, "category_id": c} for k, c in enumerate(sorted(annotated))],
    }
    kept, filler = drop_filler_category(doc)
    assert (filler is not None) == dropped
    ids = [c["id"] for c in kept["categories"]]
    assert ids == ([i for i, _, _ in categories][1:] if dropped else [i for i, _, _ in categories])
    assert len(doc["categories"]) == len(categories)  # not modified


# ------------------------------------------------------------------------------------------------ YOLO


def test_yolo_boxes_are_the_coco_boxes(coco, yolo):
    """Round trip: COCO boxes -> normalised cx cy w h rows -> COCO boxes in pixels, per image and in order."""
    layout = detect_layout(yolo)
    coco_layout = detect_layout(coco)
    for split in ("train", "val"):
        got, want = layout.split(split), coco_layout.split(split)
        assert [c["name"] for c in got.annotations.categories] == ["square", "disc", "triangle"]
        assert [c["id"] for c in got.annotations.categories] == [0, 1, 2]  # YOLO class index
        got_boxes, want_boxes = _boxes_by_file(got), _boxes_by_file(want)
        assert list(got_boxes) == list(want_boxes) and not got.annotations.broken
        for name, rows in want_boxes.items():
            assert [n for n, _ in got_boxes[name]] == [n for n, _ in rows], name
            for (_, a), (_, b) in zip(got_boxes[name], rows, strict=True):
                assert a == pytest.approx(b, abs=1e-9), name
        # sizes from the image headers, as the COCO json says
        sizes = {im["file_name"]: (im["width"], im["height"]) for im in want.annotations.coco.imgs.values()}
        assert {
            im["file_name"]: (im["width"], im["height"]) for im in got.annotations.coco.imgs.values()
        } == sizes
    assert yolo_label_path(yolo / "images" / "train" / "a.jpg") == yolo / "labels" / "train" / "a.txt"
    assert yolo_label_path("x/images/sub/images/b.png") == Path("x/images/sub/labels/b.txt")
    assert yolo_label_path("flat/c.jpg") == Path("flat/c.txt")


def test_yolo_images_without_label_files_have_no_objects(coco, yolo, tmp_path):
    root = _copy(yolo, tmp_path / "set")
    labels = sorted((root / "labels" / "train").glob("*.txt"))
    labels[0].unlink()  # no label file
    labels[1].write_text("")  # an empty one
    layout = detect_layout(root)
    train = layout.split("train").annotations
    for label in labels[:2]:
        (image_id,) = [i for i, im in train.coco.imgs.items() if Path(im["file_name"]).stem == label.stem]
        assert train.coco.imgToAnns[image_id] == [] and image_id not in train.broken
    unlabelled = _without_objects(coco, "train") + 1  # the empty file is a label file
    assert f"; 3 classes, {unlabelled} train images without a label file (no objects)" in layout.describe()
    # not one label file: the labels are elsewhere, which is an error, not a set without objects
    shutil.rmtree(root / "labels" / "val")
    with pytest.raises(
        DataLayoutError, match=r"^none of the 4 val images has a label file \(looked for .*labels/val/"
    ):
        detect_layout(root).split("val")


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ("3 0.5 0.5 0.2 0.2", "has class 3 (not among the 3 names: 0..2)"),
        ("-1 0.5 0.5 0.2 0.2", "has class -1 (not among the 3 names: 0..2)"),
        ("1.5 0.5 0.5 0.2 0.2", "has class 1.5 (not among the 3 names: 0..2)"),
        ("0 0.5 0.5 0.2", "has 4 fields (want 5: class cx cy w h)"),
        ("0 0.5 0.5 0.2 0.2 0.1", "has 6 fields (want 5: class cx cy w h)"),
        ("0 0.5 abc 0.2 0.2", "has 'abc', not a finite number"),
        ("0 0.5 nan 0.2 0.2", "has 'nan', not a finite number"),
        (
            "0 0.95 0.5 0.2 0.2",
            "has box 0.95 0.5 0.2 0.2 outside its 64x64 image (YOLO rows are cx cy w h normalised to 0..1)",
        ),
        (
            "0 32 32 10 10",
            "has box 32 32 10 10 outside its 64x64 image (YOLO rows are cx cy w h normalised to 0..1)",
        ),
        ("0 0.5 0.5 -0.2 0.2", "has a negative width or height (-0.2 0.2)"),
    ],
)
def test_yolo_bad_rows_are_broken_samples(yolo, tmp_path, row, reason):
    root = _copy(yolo, tmp_path / "set")
    label = sorted((root / "labels" / "val").glob("*.txt"))[0]
    good = label.read_text()
    label.write_text(good + row + "\n")
    bad_line = len(good.splitlines()) + 1
    layout = detect_layout(root)
    val = layout.split("val")
    assert layout.describe().endswith(", 1 val image with bad label rows or files (broken samples)")
    ann = val.annotations
    (image_id,) = [i for i, im in ann.coco.imgs.items() if Path(im["file_name"]).stem == label.stem]
    assert ann.broken == {image_id: f"{label.name} line {bad_line} {reason}"}
    assert len(ann.coco.imgs) == 4 and ann.coco.imgToAnns[image_id] == []  # counted, its rows left out
    ds = CocoDetr(val.images, ann)
    with pytest.raises(BrokenSample, match="line"):
        ds[ds.ids.index(image_id)]


def test_yolo_unreadable_images_are_broken(yolo, tmp_path):
    root = _copy(yolo, tmp_path / "set")
    image = sorted((root / "images" / "val").glob("*.jpg"))[0]
    image.write_text("not an image")
    layout = detect_layout(root)
    ann = layout.split("val").annotations
    assert list(ann.broken.values()) == ["not an image file (PIL cannot identify it)"]
    assert "1 val image with bad label rows or files (broken samples)" in layout.describe()


def test_yolo_yaml_forms(yolo, tmp_path):
    """names as a dict or a list, path relative to the yaml, .txt lists, Roboflow's ``../train/images``."""
    root = _copy(yolo, tmp_path / "set")
    want = _boxes_by_file(detect_layout(root).split("train"))
    (root / "data.yaml").unlink()
    (root / "lists").mkdir()
    files = sorted((root / "images" / "train").glob("*.jpg"))
    (root / "lists" / "train.txt").write_text("".join(f"../images/train/{f.name}\n" for f in files))
    yaml = root.parent / "elsewhere" / "my.yaml"
    yaml.parent.mkdir()
    yaml.write_text(
        "path: ../set\ntrain: lists/train.txt\nval: [images/val]\nnames: [square, disc, triangle]\nnc: 3\n"
    )
    layout = detect_layout(yaml)
    assert _boxes_by_file(layout.split("train")) == want
    layout.split("val")
    assert layout.describe().startswith(
        "data: ultralytics YOLO set my.yaml (train lists/train.txt, val images/val)"
    )
    # Roboflow's YOLO export: train/images, train/labels beside data.yaml, written as ../train/images
    rf = tmp_path / "rf_yolo"
    for split, folder in (("train", "train"), ("val", "valid")):
        shutil.copytree(root / "images" / split, rf / folder / "images")
        shutil.copytree(root / "labels" / split, rf / folder / "labels")
    (rf / "data.yaml").write_text(
        "train: ../train/images\nval: ../valid/images\nnc: 3\nnames: ['square', 'disc', 'triangle']\n"
    )
    assert _boxes_by_file(detect_layout(rf).split("train")) == want


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("train: images/train\nval: images/val\n", "the YOLO yaml has no 'names'"),
        ("train: images/train\nval: images/val\nnames: [a, b]\nnc: 3\n", "the YOLO yaml's nc 3 does not agree with its 2 names"),
        ("train: images/train\nnames: [a, b, c]\n", "the ultralytics YOLO set data.yaml names no 'val' split (or give --val-ann/--val-images)"),
        ("train: images/nope\nval: images/val\nnames: [a, b, c]\n", "the YOLO yaml's train folder or list not found"),
        ("names: {0: a, x: b}\ntrain: images/train\nval: images/val\n", "the YOLO yaml's names has key 'x'"),
        ("- a\n- b\n", "the YOLO yaml is not a mapping of keys"),
        ("train: [unclosed\n", "the YOLO yaml is not valid YAML"),
    ],
)  # fmt: skip
def test_bad_yaml_is_one_line(yolo, tmp_path, text, message):
    root = _copy(yolo, tmp_path / "set")
    (root / "data.yaml").write_text(text)
    with pytest.raises(DataLayoutError) as e:
        detect_layout(root).split("train")
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_yolo_without_pyyaml_names_the_package(yolo, tmp_path, monkeypatch, capsys):
    _hide(monkeypatch, "yaml")
    code = cli(["train", "--data-root", str(yolo), "--output-dir", str(tmp_path / "out"), "--epochs", "1"])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and "pip install pyyaml" in err, err


def test_make_data_writes_each_layout(tmp_path, capsys):
    for layout in ("roboflow", "yolo"):
        out = tmp_path / layout
        assert (
            cli(
                [
                    "make-data",
                    str(out),
                    "--num-train",
                    "3",
                    "--num-val",
                    "2",
                    "--size",
                    "32",
                    "--layout",
                    layout,
                ]
            )
            == 0
        )
        found = detect_layout(out)
        assert found.kind == layout and len(found.split("train").annotations.coco.imgs) == 3
    found = detect_layout(tmp_path / "roboflow")
    found.split("val")
    assert "its category 0 'shapes' names the data set" in found.describe()
    assert "Roboflow COCO export" in capsys.readouterr().out


# ------------------------------------------------------------------------------------ train and eval


def _argv(out: Path, *data: str) -> list[str]:
    """A tiny DETR for 30 epochs on 8 images (AP above zero, so equal numbers mean something)."""
    return [
        *data, "--output-dir", str(out), "--epochs", "30", "--eval-every", "0",
        "--backbone", "tiny", "--pos-enc", "peg", "--hidden-dim", "32", "--num-heads", "2",
        "--enc-layers", "1", "--dec-layers", "2", "--dim-feedforward", "64", "--dropout", "0.0",
        "--num-queries", "6", "--train-sizes", "64", "--max-size", "64", "--crop-resize", "",
        "--val-size", "64", "--total-batch-size", "4", "--workers", "0", "--lr", "2e-3",
        "--lr-backbone", "2e-3", "--lr-drop", "1000", "--seed", "7", "--no-progress",
        "--labels", "contiguous",  # label k = k-th category: the same labels whatever the ids
    ]  # fmt: skip


@pytest.fixture(scope="module")
def learnable(tmp_path_factory) -> dict[str, Path]:
    """8 images of one shape each, validated on themselves, in the three layouts."""
    spec = SyntheticSpec(size=64, num_classes=2, min_objects=1, max_objects=1, min_frac=0.4, max_frac=0.6)
    base = tmp_path_factory.mktemp("learnable")
    root = make_synthetic_coco(base / "coco", num_train=8, num_val=1, seed=1, spec=spec)
    shutil.rmtree(root / "val2017")
    shutil.copytree(root / "train2017", root / "val2017")
    shutil.copy(root / "annotations/instances_train2017.json", root / "annotations/instances_val2017.json")
    return {
        "coco": root,
        "roboflow": write_layout(root, base / "roboflow", "roboflow"),
        "yolo": write_layout(root, base / "yolo", "yolo"),
    }


@pytest.fixture(scope="module")
def runs(learnable, tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same kernels in every run
    try:
        out = {}
        for kind, root in learnable.items():
            folder = tmp_path_factory.mktemp(f"run_{kind}")
            out[kind] = folder, train_main(_argv(folder, "--data-root", str(root)))
        return out
    finally:
        torch.set_num_threads(threads)


def _losses(folder: Path) -> list[float]:
    records = [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if r["tag"] == "train"]


@pytest.mark.slow
def test_roboflow_and_yolo_train_and_evaluate_like_the_coco_layout(runs, capsys):
    coco_dir, coco_report = runs["coco"]
    reference = coco_report["eval"]
    assert (
        reference["ap50"] > 0 and reference["images"] == 8
    )  # something was learnt: equal numbers mean something
    for kind in ("roboflow", "yolo"):
        folder, report = runs[kind]
        # the same images, targets and labels: the same training, step by step
        assert _losses(folder) == _losses(coco_dir), kind
        stats = STAT_NAMES if kind == "roboflow" else ALL_AREAS  # YOLO has no shape areas
        assert {k: report["eval"][k] for k in stats} == {k: reference[k] for k in stats}, kind
        ckpt = read_checkpoint(folder / "checkpoint.pth", "detect")
        assert [c["name"] for c in ckpt["meta"]["categories"]] == ["square", "disc"]  # no filler
        # eval finds the data again from the checkpoint's --data-root and detects its layout
        capsys.readouterr()
        again = eval_main(["--checkpoint", str(folder / "checkpoint.pth"), "--output-dir", str(folder / "ev"),
                           "--workers", "0", "--no-progress"])  # fmt: skip
        assert {k: again["eval"][k] for k in STAT_NAMES} == {k: report["eval"][k] for k in STAT_NAMES}
        printed = capsys.readouterr().out.splitlines()
        title = {"roboflow": "Roboflow COCO export (valid/)", "yolo": "ultralytics YOLO set data.yaml (val"}
        assert any(line.startswith(f"data: {title[kind]}") for line in printed), printed


@pytest.mark.slow
def test_explicit_files_evaluate_like_the_layout(learnable, runs, tmp_path):
    """``--val-ann/--val-images`` (no --data-root) give the COCO run's numbers; the yolo run's too."""
    coco_dir, coco_report = runs["coco"]
    root = learnable["coco"]
    report = eval_main([
        "--checkpoint", str(coco_dir / "checkpoint.pth"), "--output-dir", str(tmp_path / "ev"), "--workers", "0",
        "--no-progress", "--val-ann", str(root / "annotations/instances_val2017.json"),
        "--val-images", str(root / "val2017"),
    ])  # fmt: skip
    assert {k: report["eval"][k] for k in STAT_NAMES} == {k: coco_report["eval"][k] for k in STAT_NAMES}


@pytest.mark.slow
def test_explicit_training_is_recorded_and_evaluated_again(learnable, tmp_path):
    """A run on --train-ann/--val-ann only: eval without flags re-reads the recorded files."""
    root = learnable["roboflow"]
    argv = _argv(tmp_path / "run", "--train-ann", str(root / "train/_annotations.coco.json"),
                 "--train-images", str(root / "train"), "--val-ann", str(root / "valid/_annotations.coco.json"),
                 "--val-images", str(root / "valid"))  # fmt: skip
    argv[argv.index("--epochs") + 1] = "1"
    trained = train_main(argv)
    again = eval_main(["--checkpoint", str(tmp_path / "run" / "checkpoint.pth"), "--output-dir",
                       str(tmp_path / "ev"), "--workers", "0", "--no-progress"])  # fmt: skip
    assert {k: again["eval"][k] for k in STAT_NAMES} == {k: trained["eval"][k] for k in STAT_NAMES}


@pytest.mark.slow
def test_yolo_broken_rows_are_skipped_and_listed(learnable, tmp_path):
    root = _copy(learnable["yolo"], tmp_path / "set")
    label = sorted((root / "labels" / "train").glob("*.txt"))[0]
    label.write_text(label.read_text() + "7 0.5 0.5 0.1 0.1\n")
    argv = _argv(tmp_path / "run", "--data-root", str(root), "--max-broken", "50%")
    argv[argv.index("--epochs") + 1] = "1"
    report = train_main(argv)
    samples = report["broken"]["train"]["samples"]
    assert [Path(s["path"]).stem for s in samples] == [label.stem]
    assert samples[0]["reason"] == f"{label.name} line 2 has class 7 (not among the 2 names: 0..1)"
