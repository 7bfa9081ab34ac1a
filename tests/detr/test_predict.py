"""``python -m peg_detr predict``: annotated images and a detections json from a training checkpoint."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image
from torchvision.transforms.v2.functional import pil_to_tensor

from peg_core.engine import UserError
from peg_detr.__main__ import main as cli
from peg_detr.cli import train as train_main
from peg_detr.data import SyntheticSpec, make_synthetic_coco
from peg_detr.predict import Predictor


def _read(path) -> torch.Tensor:
    with Image.open(path) as im:
        return pil_to_tensor(im.convert("RGB"))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("pred")
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
    yield data, root / "run" / "checkpoint.pth"
    torch.set_num_threads(before)


def test_predict_cli_writes_images_and_json(checkpoint, tmp_path):
    data, ckpt = checkpoint
    images = sorted((data / "val2017").glob("*.jpg"))
    out = tmp_path / "preds"
    assert (
        cli(
            ["predict", *map(str, images), "--checkpoint", str(ckpt), "--threshold", "0.0", "--out", str(out)]
        )
        == 0
    )
    report = json.loads((out / "detections.json").read_text())
    assert sorted(report) == sorted(map(str, images))
    predictor = Predictor.from_checkpoint(ckpt, threshold=0.0)
    for path in images:
        original = _read(path)
        drawn = _read(out / f"{path.stem}.png")
        # a 64 px input is drawn on a 512 px canvas (same aspect), so the captions are legible
        assert drawn.shape == (3, 512, 512) and original.shape == (3, 64, 64)
        dets = report[str(path)]
        assert len(dets) == 5  # threshold 0: every query (softmax scores are > 0)
        h, w = original.shape[-2:]
        for d in dets:
            # Category names from the checkpoint; id 0 (unused in COCO-style files) has none.
            names = {1: "square", 2: "disc", 3: "triangle"}
            assert d["name"] == names.get(d["label"], str(d["label"])) and 0 < d["score"] <= 1
            x0, y0, x1, y1 = d["box"]
            assert -1e-3 <= x0 <= x1 <= w + 1e-3 and -1e-3 <= y0 <= y1 <= h + 1e-3
        # The json holds exactly what the Predictor computes, from the file or from the tensor.
        direct = predictor.detect(original)
        torch.testing.assert_close(torch.tensor([d["score"] for d in dets]), direct["scores"])
        torch.testing.assert_close(torch.tensor([d["box"] for d in dets]), direct["boxes"])
        (from_file,) = predictor.predict_files([path])
        (from_tensor,) = predictor(original)
        assert [d.to_json() for d in from_file.detections] == dets and from_file.path == str(path)
        assert [d.to_json() for d in from_tensor.detections] == dets and from_tensor.path is None


def test_the_png_is_large_with_small_filled_captions(checkpoint, tmp_path):
    """A 64 px input: the PNG is 512 px, the caption a small filled band above its box."""
    from peg_detr.predict import PALETTE, Detection, caption_height, draw_detections

    image = torch.full((3, 64, 48), 128, dtype=torch.uint8)  # plain grey, portrait
    canvas = draw_detections(image, [Detection(1, "square", 0.93, [8.0, 24.0, 40.0, 56.0])])
    assert canvas.size == (384, 512)  # long side 512, aspect kept: boxes scale by 8
    pixels = pil_to_tensor(canvas).int()
    colour = torch.tensor(PALETTE[1]).view(3, 1, 1)
    filled = ((pixels - colour).abs() < 40).all(0)  # (H, W): the class's colour
    top = 24 * 8  # the box's top edge on the canvas; the caption sits just above it
    caption_rows = filled[:top].any(1).nonzero().flatten()
    height = len(caption_rows)
    assert height == caption_height(512) and int(caption_rows[-1]) == top - 1  # one band, touching the box
    assert 0.02 < height / 512 < 0.06  # legible, and a small fraction of the canvas (not object-sized)
    band = pixels[:, top - height : top, 64:]
    assert (band.amax(0) < 60).any()  # black text on the filled background
    assert filled[top, 64:320].all()  # the box's top edge, 8x wider than at 64 px

    # the CLI writes that PNG
    data, ckpt = checkpoint
    path = sorted((data / "val2017").glob("*.jpg"))[0]
    assert (
        cli(["predict", str(path), "--checkpoint", str(ckpt), "--threshold", "0", "--out", str(tmp_path)])
        == 0
    )
    with Image.open(tmp_path / f"{path.stem}.png") as im:
        assert max(im.size) >= 512


def test_predict_threshold_and_errors(checkpoint, tmp_path):
    data, ckpt = checkpoint
    image = sorted((data / "val2017").glob("*.jpg"))[0]
    out = tmp_path / "o"
    assert (
        cli(["predict", str(image), "--checkpoint", str(ckpt), "--threshold", "1.0", "--out", str(out)]) == 0
    )
    report = json.loads((out / "detections.json").read_text())
    assert report[str(image)] == []
    assert json.loads((out / "report.json").read_text())["broken"]["predict"]["count"] == 0
    bad = tmp_path / "bad.pth"
    torch.save({"weights": torch.zeros(1)}, bad)
    with pytest.raises(UserError, match="not a peg training checkpoint"):
        Predictor.from_checkpoint(bad)


def test_predict_on_an_rtdetr_checkpoint_uses_its_square_unit_range_input(checkpoint, tmp_path):
    """RT-DETR: a square resize to the run's --val-size, pixels in [0, 1], sigmoid top-K boxes."""
    import torchvision.transforms.v2.functional as TF

    from peg_detr.model import load_model

    data, _ = checkpoint
    train_main(
        ["--config", "rtdetr_demo_tiny", "--data-root", str(data), "--output-dir", str(tmp_path / "rt"),
         "--epochs", "1", "--train-sizes", "64", "--val-size", "64", "--workers", "0", "--no-progress"]
    )  # fmt: skip
    ckpt = tmp_path / "rt" / "checkpoint.pth"
    gen = torch.Generator().manual_seed(0)
    image = torch.randint(0, 256, (3, 48, 80), dtype=torch.uint8, generator=gen)  # not square
    got = Predictor.from_checkpoint(ckpt, threshold=0.0).detect(image)

    loaded = load_model(ckpt)
    x = TF.resize(image, [64, 64]).float() / 255  # what evaluation fed: 64 x 64, no normalisation
    with torch.no_grad():
        (want,) = loaded.postprocess(loaded.model(x[None]), torch.tensor([[48, 80]]))
    order = want["scores"].argsort(descending=True)
    # the top-K (K = 20 queries of rtdetr_demo_tiny) of the 20 x 4 (query, class id) pairs, every one > 0
    assert len(got["scores"]) == 20 and loaded.config["arch"] == "rtdetr"
    torch.testing.assert_close(got["scores"], want["scores"][order])
    torch.testing.assert_close(got["labels"], want["labels"][order])
    torch.testing.assert_close(got["boxes"], want["boxes"][order])
    # DETR's pipeline (short side 64, ImageNet-normalised: a 64 x 107 input) gives other scores
    detr_x = TF.normalize(TF.resize(image, 64).float() / 255, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    with torch.no_grad():
        (other,) = loaded.postprocess(loaded.model(detr_x[None]), torch.tensor([[48, 80]]))
    assert not torch.allclose(other["scores"].sort().values, want["scores"].sort().values)
