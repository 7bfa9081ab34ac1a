"""Synthetic generator, COCO dataset and DETR transforms: boxes follow the pixels."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import v2

from peg_core.errors import InputError
from peg_detr.__main__ import main as cli
from peg_detr.data import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    SHAPES,
    CocoAnnotationError,
    CocoDataError,
    CocoDetr,
    RandomSizeCrop,
    SyntheticSpec,
    collate_detr,
    infer_num_classes,
    load_coco_annotations,
    make_synthetic_coco,
    make_train_transforms,
    make_val_transforms,
    resolve_coco_paths,
)
from peg_detr.data.transforms import make_boxes


@pytest.fixture(scope="module")
def shapes_root(tmp_path_factory):
    spec = SyntheticSpec(size=96, num_classes=3, min_objects=0, max_objects=3, min_frac=0.25, max_frac=0.4)
    return make_synthetic_coco(tmp_path_factory.mktemp("shapes"), num_train=24, num_val=6, seed=3, spec=spec)


def _json(root, split):
    return json.loads((root / "annotations" / f"instances_{split}2017.json").read_text())


def _unnormalise(image: torch.Tensor) -> np.ndarray:
    mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1)
    return ((image * std + mean) * 255).permute(1, 2, 0).numpy()


def test_generator_layout_and_determinism(tmp_path, shapes_root):
    again = make_synthetic_coco(
        tmp_path / "again",
        num_train=24,
        num_val=6,
        seed=3,
        spec=SyntheticSpec(size=96, num_classes=3, min_objects=0, max_objects=3, min_frac=0.25, max_frac=0.4),
    )
    for split, n in (("train", 24), ("val", 6)):
        doc = _json(shapes_root, split)
        assert doc == _json(again, split)
        assert len(doc["images"]) == n
        assert [c["name"] for c in doc["categories"]] == [s[0] for s in SHAPES[:3]]
        for im in doc["images"]:
            a = (shapes_root / f"{split}2017" / im["file_name"]).read_bytes()
            assert a == (again / f"{split}2017" / im["file_name"]).read_bytes()
        counts = np.bincount([a["image_id"] for a in doc["annotations"]], minlength=0)
        for a in doc["annotations"]:
            x, y, w, h = a["bbox"]
            assert x >= 0 and y >= 0 and x + w <= 96 and y + h <= 96 and w >= 4 and h >= 4
            assert 0 < a["area"] <= w * h and a["iscrowd"] == 0
        assert len(counts) > 0
    # Val ids do not collide with train ids, and some train image has no object (min_objects=0).
    train, val = _json(shapes_root, "train"), _json(shapes_root, "val")
    assert not {i["id"] for i in train["images"]} & {i["id"] for i in val["images"]}
    with_objects = {a["image_id"] for a in train["annotations"]}
    assert len(with_objects) < len(train["images"])
    other_seed = make_synthetic_coco(tmp_path / "s4", 4, 2, seed=4, spec=SyntheticSpec(size=96))
    assert (
        _json(other_seed, "train")["annotations"] != train["annotations"][: len(_json(other_seed, "train"))]
    )


def test_generator_pixels_match_annotations(shapes_root):
    """The pixel at each box centre has the class colour (±jitter), the background is grey."""
    doc = _json(shapes_root, "train")
    files = {im["id"]: im["file_name"] for im in doc["images"]}
    for a in doc["annotations"]:
        img = np.asarray(
            Image.open(shapes_root / "train2017" / files[a["image_id"]]).convert("RGB"), dtype=float
        )
        x, y, w, h = a["bbox"]
        cx, cy = int(x + w / 2), int(y + h / 2)
        colour = np.array(SHAPES[a["category_id"] - 1][1], dtype=float)
        assert np.abs(img[cy - 1 : cy + 2, cx - 1 : cx + 2].mean((0, 1)) - colour).max() < 45


def test_mixed_sizes_and_bad_spec(tmp_path):
    root = make_synthetic_coco(tmp_path, 6, 1, seed=0, spec=SyntheticSpec(size=128, min_size=64))
    sizes = {(im["height"], im["width"]) for im in _json(root, "train")["images"]}
    assert len(sizes) > 1 and all(h % 16 == 0 and w % 16 == 0 and min(h, w) >= 64 for h, w in sizes)
    with pytest.raises(ValueError, match="num_classes"):
        make_synthetic_coco(tmp_path / "x", 1, 1, spec=SyntheticSpec(num_classes=9))


def test_make_data_cli(tmp_path):
    assert cli(["make-data", str(tmp_path / "d"), "--num-train", "3", "--num-val", "2", "--size", "64"]) == 0
    assert len(_json(tmp_path / "d", "val")["images"]) == 2
    assert len(list((tmp_path / "d" / "train2017").glob("*.jpg"))) == 3


def test_dataset_targets_val(shapes_root):
    img_dir, ann = resolve_coco_paths(shapes_root, "val")
    ds = CocoDetr(img_dir, ann, make_val_transforms(size=192, max_size=None))
    doc = _json(shapes_root, "val")
    for i in range(len(ds)):
        image, t = ds[i]
        assert image.shape == (3, 192, 192) and image.dtype == torch.float32
        assert t["size"].tolist() == [192, 192] and t["orig_size"].tolist() == [96, 96]
        anns = [a for a in doc["annotations"] if a["image_id"] == int(t["image_id"])]
        # Normalised cxcywh from the json's xywh, in float64: a resize leaves them unchanged.
        ref = (
            torch.tensor(
                [
                    [a["bbox"][0] + a["bbox"][2] / 2, a["bbox"][1] + a["bbox"][3] / 2, *a["bbox"][2:]]
                    for a in anns
                ],
                dtype=torch.float64,
            ).reshape(-1, 4)
            / 96
        )
        torch.testing.assert_close(t["boxes"].double(), ref, atol=2e-6, rtol=0)
        assert t["labels"].tolist() == [a["category_id"] for a in anns]
        assert t["boxes"].dtype == torch.float32 and t["labels"].dtype == torch.int64


def test_flip_moves_boxes_with_pixels(shapes_root):
    img_dir, ann = resolve_coco_paths(shapes_root, "train")
    tf = make_train_transforms(scales=[144], max_size=1000, crop_resize=None, hflip=1.0)
    ds, ref = CocoDetr(img_dir, ann, tf), CocoDetr(img_dir, ann, make_val_transforms(144, None))
    checked = 0
    for i in range(10):
        (image, t), (_, r) = ds[i], ref[i]
        expected = r["boxes"].clone()
        expected[:, 0] = 1 - expected[:, 0]
        torch.testing.assert_close(t["boxes"], expected, atol=1e-6, rtol=0)
        pixels = _unnormalise(image)
        for (cx, cy, _, _), label in zip(t["boxes"].tolist(), t["labels"].tolist()):
            colour = np.array(SHAPES[label - 1][1], dtype=float)
            px = pixels[int(cy * 144), int(cx * 144)]
            assert np.abs(px - colour).max() < 50
            checked += 1
    assert checked > 5


def test_crop_drops_outside_boxes_and_keeps_labels_aligned():
    image = torch.zeros(3, 100, 100, dtype=torch.uint8)
    boxes = make_boxes(torch.tensor([[5.0, 5.0, 25.0, 25.0], [60.0, 60.0, 90.0, 95.0]]), (100, 100))
    target = {"boxes": boxes, "labels": torch.tensor([1, 2])}
    crop = RandomSizeCrop(40, 40)
    params = {"top": 50, "left": 50, "height": 40, "width": 40}
    pipeline = v2.Compose([v2.ClampBoundingBoxes(), v2.SanitizeBoundingBoxes(min_size=1.0)])
    out_img = crop.transform(image, params)
    out = pipeline(out_img, {"boxes": crop.transform(target["boxes"], params), "labels": target["labels"]})[1]
    assert out_img.shape == (3, 40, 40)
    assert out["labels"].tolist() == [2]
    assert out["boxes"].tolist() == [[10.0, 10.0, 40.0, 40.0]]  # 60-50, clipped at the crop's edge
    torch.manual_seed(0)
    for _ in range(20):
        p = RandomSizeCrop(30, 70).make_params([image])
        assert 30 <= p["height"] <= 70 and 30 <= p["width"] <= 70
        assert p["top"] + p["height"] <= 100 and p["left"] + p["width"] <= 100
    with pytest.raises(ValueError, match="min_size"):
        RandomSizeCrop(10, 5)


def test_train_transforms_random_scales_and_crop(shapes_root):
    img_dir, ann = resolve_coco_paths(shapes_root, "train")
    tf = make_train_transforms(scales=[64, 80, 96], max_size=120, crop_resize=[96], crop_size=(48, 80))
    ds = CocoDetr(img_dir, ann, tf)
    torch.manual_seed(1)
    shorts = set()
    for i in range(len(ds)):
        image, t = ds[i]
        h, w = image.shape[-2:]
        shorts.add(min(h, w))
        assert min(h, w) in (64, 80, 96) and max(h, w) <= 120
        b = t["boxes"]
        assert b.shape[1] == 4 and len(b) == len(t["labels"])
        assert ((b[:, :2] - b[:, 2:] / 2) >= -1e-6).all() and ((b[:, :2] + b[:, 2:] / 2) <= 1 + 1e-6).all()
        assert (b[:, 2:] > 0).all()
    assert len(shorts) > 1


def test_crowd_excluded_and_empty_images_kept(tmp_path, shapes_root):
    doc = _json(shapes_root, "val")
    first = doc["images"][0]["id"]
    doc["annotations"].append(
        {
            "id": 999,
            "image_id": first,
            "category_id": 2,
            "bbox": [1.0, 1.0, 30.0, 30.0],
            "area": 900.0,
            "iscrowd": 1,
        }
    )
    emptied = doc["images"][1]["id"]
    doc["annotations"] = [a for a in doc["annotations"] if a["image_id"] != emptied]
    ann = tmp_path / "crowd.json"
    ann.write_text(json.dumps(doc))
    img_dir, _ = resolve_coco_paths(shapes_root, "val")
    ds = CocoDetr(img_dir, ann, make_val_transforms(96, None))
    assert len(ds) == 6  # the emptied image is still there
    _, t0 = ds[0]
    plain = [a for a in doc["annotations"] if a["image_id"] == first and not a["iscrowd"]]
    assert len(t0["labels"]) == len(plain)
    _, t1 = ds[1]
    assert int(t1["image_id"]) == emptied
    assert t1["boxes"].shape == (0, 4) and t1["labels"].shape == (0,)
    batch, targets = collate_detr([ds[0], ds[1]])
    assert batch.tensors.shape == (2, 3, 96, 96) and not batch.mask.any()
    assert [int(t["image_id"]) for t in targets] == [first, emptied]


def test_collate_pads_with_mask():
    a = (torch.ones(3, 32, 48), {"image_id": torch.tensor(1)})
    b = (torch.ones(3, 40, 24), {"image_id": torch.tensor(2)})
    batch, targets = collate_detr([a, b])
    assert batch.tensors.shape == (2, 3, 40, 48)
    assert batch.mask[0, 32:].all() and not batch.mask[0, :32].any()
    assert batch.mask[1, :, 24:].all() and not batch.mask[1, :, :24].any()
    assert len(targets) == 2


def test_num_classes_and_paths(tmp_path, shapes_root):
    assert infer_num_classes(_json(shapes_root, "train")["categories"]) == 4
    assert infer_num_classes([{"id": 90}, {"id": 1}]) == 91
    with pytest.raises(CocoAnnotationError, match="num-classes"):
        infer_num_classes([])
    img_dir, ann = resolve_coco_paths(tmp_path, "val", "x/y.json")
    assert img_dir == tmp_path / "val2017" and ann == tmp_path / "x" / "y.json"
    img_dir.mkdir()
    with pytest.raises(InputError, match=r"annotation file not found: .*y\.json"):
        CocoDetr(img_dir, ann)
    with pytest.raises(CocoDataError, match="image folder not found"):
        CocoDetr(tmp_path / "nope", ann)


def test_annotation_files_are_checked(tmp_path, shapes_root):
    """Keys COCOeval needs are filled in; what makes the file unusable is a one-line error naming it."""
    doc = _json(shapes_root, "val")
    for a in doc["annotations"]:
        del a["area"], a["iscrowd"]
    del doc["annotations"][0]["id"]
    path = tmp_path / "a.json"
    path.write_text(json.dumps(doc))
    ann = load_coco_annotations(path)
    a = ann.coco.anns[max(ann.coco.anns)]
    assert a["iscrowd"] == 0 and a["area"] == a["bbox"][2] * a["bbox"][3] and not ann.broken
    assert len(ann.coco.anns) == len(doc["annotations"])

    def error(mutate) -> str:
        d = _json(shapes_root, "val")
        text = mutate(d)
        path.write_text(text if isinstance(text, str) else json.dumps(d))
        with pytest.raises(InputError) as e:
            load_coco_annotations(path)
        assert str(e.value).endswith(f": {path}") and "\n" not in str(e.value)
        return e.value.what

    not_json = error(lambda d: "[1, 2")
    assert not_json == "annotation file is not valid JSON (Expecting ',' delimiter: line 1 column 6 (char 5))"
    assert error(lambda d: "[]") == "annotation file is not a COCO object (its top level is a list)"
    assert error(lambda d: d["images"].append({"id": d["images"][0]["id"], "file_name": "x.jpg"})) == (
        f"image id {_json(shapes_root, 'val')['images'][0]['id']} is listed twice in 'images'"
    )
    missing_name = error(lambda d: d["images"][1].pop("file_name") and None)
    assert missing_name == "image entry 1 has no integer 'id' and string 'file_name'"
    assert error(lambda d: d["annotations"][0].update(image_id=5)) == (
        f"annotation {d_first_id(shapes_root)} has image_id 5, which is not in 'images'"
    )
    assert error(lambda d: d.update(annotations={})) == "annotation file's 'annotations' is not a list"
    path.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(InputError, match="annotation file is not UTF-8 text"):
        load_coco_annotations(path)
    # Malformed boxes: the image is marked broken and its annotations left out, the file stays usable.
    d = _json(shapes_root, "val")
    first = d["annotations"][0]
    for bad in ([1, 2, 3, "4"], [0, 0, -1, 5], None, [0, 0, 1]):
        first["bbox"] = bad
        path.write_text(json.dumps(d))
        ann = load_coco_annotations(path)
        assert list(ann.broken) == [first["image_id"]] and "malformed bbox" in ann.broken[first["image_id"]]
        assert ann.coco.getAnnIds(imgIds=[first["image_id"]]) == []
    first["bbox"] = [0, 0, float("nan"), 1]  # NaN is no JSON: the one reader refuses the file
    path.write_text(json.dumps(d))
    with pytest.raises(InputError, match=r"annotation file is not valid JSON \(NaN is not JSON\)"):
        load_coco_annotations(path)


def d_first_id(root) -> int:
    return _json(root, "val")["annotations"][0]["id"]
