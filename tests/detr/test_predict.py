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


def test_a_thin_image_is_one_skipped_file_and_the_others_are_kept(checkpoint, tmp_path):
    """A 1 x 400 px strip has no pixel left on its short side after DETR's resize: skipped, not a crash."""
    from peg_core.engine import BrokenSample

    data, ckpt = checkpoint
    good = sorted((data / "val2017").glob("*.jpg"))[0]
    thin, tall = tmp_path / "thin.png", tmp_path / "tall.png"
    Image.new("RGB", (400, 1), (90, 90, 90)).save(thin)
    Image.new("RGB", (1, 400), (90, 90, 90)).save(tall)
    predictor = Predictor.from_checkpoint(ckpt, threshold=0.0)
    preds = predictor.predict_files([thin, good, tall])
    reason = "a 400 x 1 px image is too elongated for the model's input: its short side would be 0 px at size 64 (long side at most 107)"  # fmt: skip
    assert [p.path for p in preds] == [str(thin), str(good), str(tall)]
    assert preds[0].skipped == reason and preds[0].line() == f"{thin}: skipped ({reason})"
    assert preds[1].skipped is None and len(preds[1].detections) == 5
    assert preds[2].skipped.startswith("a 1 x 400 px image is too elongated")
    with pytest.raises(BrokenSample, match="too elongated"):  # what the predict verb reads files with
        predictor.load(thin)
    with pytest.raises(ValueError, match=r"a 400 x 1 px image is too elongated .*: inputs\[1\]"):
        predictor([_read(good), _read(thin)])  # in memory: the caller's error, naming the argument


def test_detr_predictor_takes_pil_numpy_and_float_images_and_checks_its_options(checkpoint, monkeypatch):
    data, ckpt = checkpoint
    path = sorted((data / "val2017").glob("*.jpg"))[0]
    predictor = Predictor.from_checkpoint(ckpt, threshold=0.0)
    image = _read(path)  # uint8 (3, H, W)
    (want,) = predictor(image)
    with Image.open(path) as im:
        pil = im.convert("RGB")
    inputs = [pil, image.permute(1, 2, 0).numpy(), image / 255.0, pil.convert("RGBA"), str(path)]
    for pred in predictor(inputs):
        assert [d.label for d in pred.detections] == [d.label for d in want.detections]
        scores = [d.score for d in pred.detections]
        assert scores == pytest.approx([d.score for d in want.detections], abs=1e-3)
    for options, error, message in (
        ({"threshold": "0.5"}, TypeError, "threshold must be a number in [0, 1], got str '0.5'"),
        ({"threshold": 1.5}, ValueError, "threshold must be a number in [0, 1], got 1.5"),
        ({"threshold": float("nan")}, ValueError, "threshold must be a number in [0, 1], got nan"),
        ({"size": "64"}, TypeError, "size must be an int, got str '64'"),
        ({"size": 0}, ValueError, "size must be an int in 1..4096, got 0"),
    ):
        with pytest.raises(error) as e:
            Predictor.from_checkpoint("never_read.pth", **options)
        assert str(e.value) == message
    with pytest.raises(TypeError, match="threshold must be a number"):
        predictor.detect(image, threshold="0.1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"^CUDA is not available on this machine: device='cuda'$"):
        Predictor.from_checkpoint(ckpt, device="cuda")
