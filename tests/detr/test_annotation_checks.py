"""COCO annotation files checked where they are read: ids (categories, annotations) and boxes.

What makes the file unusable is one :class:`~peg_core.errors.InputError` line naming the file; a
malformed annotation makes its image a broken sample (skipped, counted, listed), never a box that is
silently clipped or dropped.
"""

from __future__ import annotations

import json

import pytest
from PIL import Image

from peg_core.engine import BrokenSample
from peg_core.errors import InputError
from peg_detr.data import CocoDetr, load_coco_annotations, make_val_transforms
from peg_detr.data.annotations import MAX_CATEGORY_ID, CocoAnnotationError


def _doc() -> dict:
    """Two 40x30 images with two boxes each, three categories."""
    images = [{"id": 1, "file_name": "a.png", "width": 40, "height": 30},
              {"id": 2, "file_name": "b.png", "width": 40, "height": 30}]  # fmt: skip
    anns = [
        {"id": 1, "image_id": 1, "category_id": 1, "bbox": [2, 3, 10, 8]},
        {"id": 2, "image_id": 1, "category_id": 2, "bbox": [20, 10, 15, 15]},
        {"id": 3, "image_id": 2, "category_id": 3, "bbox": [0, 0, 40, 30]},
        {"id": 4, "image_id": 2, "category_id": 1, "bbox": [5, 5, 5, 5]},
    ]
    cats = [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}, {"id": 3, "name": "c"}]
    return {"images": images, "annotations": anns, "categories": cats}


def _write(tmp_path, doc) -> str:
    path = tmp_path / "instances.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def _error(tmp_path, doc) -> str:
    path = _write(tmp_path, doc)
    with pytest.raises(InputError) as e:
        load_coco_annotations(path)
    line = str(e.value)
    assert line.endswith(f": {path}") and "\n" not in line
    return e.value.what


def test_a_clean_file_loads(tmp_path):
    ann = load_coco_annotations(_write(tmp_path, _doc()))
    assert not ann.broken and sorted(ann.coco.anns) == [1, 2, 3, 4]


def test_repeated_annotation_ids_are_refused(tmp_path):
    """pycocotools keeps one annotation per id: the ground truth against itself would score AP 0.04, not 1.0."""
    doc = _doc()
    doc["annotations"][2]["id"] = 1
    assert _error(tmp_path, doc) == "annotation id 1 is listed twice in 'annotations'"


@pytest.mark.parametrize("bad", [-1, 10**9, MAX_CATEGORY_ID + 1])
def test_category_ids_out_of_range_are_refused(tmp_path, bad):
    doc = _doc()
    doc["categories"][2]["id"] = bad
    assert _error(tmp_path, doc) == (
        f"category entry 2 has id {bad}, outside 0..{MAX_CATEGORY_ID} (labels index a classifier by category id)"
    )


def test_repeated_category_ids_are_refused(tmp_path):
    doc = _doc()
    doc["categories"][2]["id"] = 1
    assert _error(tmp_path, doc) == "category id 1 is listed twice in 'categories'"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["annotations"][0].update(category_id=[1]),
         "annotation 1 (image 1) has category_id [1], which is not in 'categories' (ids [1, 2, 3])"),
        (lambda d: d["annotations"][0].update(image_id={"a": 1}), "annotation 1 has image_id {'a': 1}, which is not "
                                                                   "in 'images'"),
        (lambda d: d["images"][0].update(width="40"), 'image 1 has width "40" (want a positive int of pixels)'),
        (lambda d: d["images"][1].update(height=0), "image 2 has height 0 (want a positive int of pixels)"),
    ],
)  # fmt: skip
def test_unusable_values_are_one_line(tmp_path, edit, message):
    doc = _doc()
    edit(doc)
    assert _error(tmp_path, doc) == message


def test_deeply_nested_file_is_one_line(tmp_path):
    doc = json.dumps(_doc())[:-1] + ', "info": ' + "[" * 100_000 + "]" * 100_000 + "}"
    assert _error(tmp_path, doc) == "annotation file is nested deeper than 64 levels"


@pytest.mark.parametrize(
    ("box", "reason"),
    [
        (
            [30, 10, 15, 5],
            "annotation 2 has bbox [30, 10, 15, 5] outside its 40x30 image",
        ),  # past the right edge
        ([-5, 0, 10, 10], "annotation 2 has bbox [-5, 0, 10, 10] outside its 40x30 image"),
        (
            [0, 0, 80, 60],
            "annotation 2 has bbox [0, 0, 80, 60] outside its 40x30 image",
        ),  # larger than the image
        ([0, 0, 10], "annotation 2 has a malformed bbox [0, 0, 10] (want [x, y, w, h])"),
    ],
)
def test_boxes_outside_the_image_make_it_broken(tmp_path, box, reason):
    doc = _doc()
    doc["annotations"][1]["bbox"] = box
    ann = load_coco_annotations(_write(tmp_path, doc))
    assert ann.broken == {1: reason}
    assert ann.coco.getAnnIds(imgIds=[1]) == [] and ann.coco.getAnnIds(imgIds=[2]) == [3, 4]


def test_boxes_within_the_tolerance_are_kept(tmp_path):
    doc = _doc()
    doc["annotations"][1]["bbox"] = [20.5, 10, 20.3, 20.6]  # 0.8 / 0.6 px past the border: float rounding
    assert not load_coco_annotations(_write(tmp_path, doc)).broken


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        ("area", "big", 'annotation 4 has area "big" (want a non-negative number)'),
        ("area", -3, "annotation 4 has area -3 (want a non-negative number)"),
        ("iscrowd", 2, "annotation 4 has iscrowd 2 (want 0 or 1)"),
    ],
)
def test_malformed_area_or_iscrowd_make_the_image_broken(tmp_path, key, value, reason):
    doc = _doc()
    doc["annotations"][3][key] = value
    assert load_coco_annotations(_write(tmp_path, doc)).broken == {2: reason}


def test_a_box_outside_the_decoded_image_is_a_broken_sample(tmp_path):
    """Without width / height in the file, the box is checked against the decoded picture."""
    doc = _doc()
    for im in doc["images"]:
        del im["width"], im["height"]
    doc["annotations"][2]["bbox"] = [0, 0, 60, 30]  # the picture is 40 wide
    for name in ("a.png", "b.png"):
        Image.new("RGB", (40, 30)).save(tmp_path / name)
    ds = CocoDetr(tmp_path, _write(tmp_path, doc), make_val_transforms(None))
    image, target = ds[0]
    assert image.shape[-2:] == (30, 40) and len(target["boxes"]) == 2
    with pytest.raises(BrokenSample) as e:
        ds[1]
    assert e.value.reason == "annotation 3 has bbox [0, 0, 60, 30] outside its 40x30 image"


def test_the_error_is_an_input_error():
    assert issubclass(CocoAnnotationError, InputError)
