"""The Predictor API takes what Python users pass (``peg_core.engine.predictor``, through the classifier's).

Paths as ``str`` / ``Path``, PIL images of any mode (16-bit grey scaled, not clipped), numpy arrays
and tensors of uint8 or float pixels give the same prediction as the same image in a file;
anything else is a ``TypeError`` / ``ValueError`` naming the argument, before any model runs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from peg_core.__main__ import main
from peg_core.classify.data import load_image
from peg_core.classify.predict import Predictor
from peg_core.engine.predictor import as_image, rgb_image
from tests.core.classify_runs import (
    keep_threads,  # noqa: F401 (autouse: restores torch's threads)
    tiny,
)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run")
    threads = torch.get_num_threads()
    assert main(["train", *tiny(16, 8), "--epochs", "1", "--output-dir", str(out)]) == 0
    torch.set_num_threads(threads)
    return out / "checkpoint.pth"


@pytest.fixture(scope="module")
def predictor(checkpoint) -> Predictor:
    return Predictor.from_checkpoint(checkpoint, top_k=12)  # every class: compared by name, not by rank


def _probs(pred) -> dict[str, float]:
    assert pred.skipped is None, pred.skipped
    return dict(pred.top)


def _same(a, b, tol: float = 5e-3) -> None:
    """The same probabilities per class (uint8 and float pixels resample slightly differently)."""
    pa, pb = _probs(a), _probs(b)
    assert pa.keys() == pb.keys() and all(abs(pa[k] - pb[k]) <= tol for k in pa), (pa, pb)


def _pixels(seed: int = 0, shape: tuple[int, ...] = (20, 24, 3)) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def test_paths_pil_numpy_and_tensors_give_the_same_prediction(predictor, tmp_path):
    rgb = _pixels()
    path = tmp_path / "x.png"
    Image.fromarray(rgb).save(path)
    (ref,) = predictor.predict_files([path])
    chw = torch.from_numpy(rgb).permute(2, 0, 1)
    inputs = {
        "str": str(path),
        "Path": path,
        "PIL": Image.fromarray(rgb),
        "numpy uint8": rgb,
        "numpy float64": rgb / 255.0,
        "numpy float32, a view with negative strides": np.ascontiguousarray(rgb[:, ::-1])[:, ::-1]
        / np.float32(255),
        "tensor uint8": chw,
        "tensor float": chw / 255.0,
        "tensor int64": chw.long(),
    }
    for what, item in inputs.items():
        preds = predictor(item)
        assert len(preds) == 1, what
        _same(preds[0], ref)
    # a 4-D array or tensor is a batch of images; a list mixes kinds and keeps the order
    assert [p.path for p in predictor(torch.stack([chw, chw]))] == [None, None]
    mixed = predictor([path, chw, Image.fromarray(rgb)])
    assert [p.path for p in mixed] == [str(path), None, None]
    for p in (*mixed, *predictor(rgb[None].repeat(2, 0))):
        _same(p, ref)


def test_grey_rgba_and_16_bit_images_are_converted(predictor, tmp_path):
    grey = _pixels(1, (20, 24))
    (ref,) = predictor(Image.fromarray(grey).convert("RGB"))
    for item in (
        Image.fromarray(grey),
        grey,
        grey[..., None],
        torch.from_numpy(grey),
        torch.from_numpy(grey)[None],
    ):
        _same(predictor(item)[0], ref)
    # 16-bit grey: a PNG of v * 257 is the 8-bit image of v (PIL's convert("RGB") made it white)
    wide = grey.astype(np.uint16) * 257
    Image.fromarray(wide).save(tmp_path / "grey16.png")
    with Image.open(tmp_path / "grey16.png") as im:
        assert im.mode.startswith("I")
        assert np.array_equal(np.asarray(rgb_image(im))[..., 0], grey)
    assert np.array_equal(
        np.asarray(load_image(tmp_path / "grey16.png")), np.asarray(Image.fromarray(grey).convert("RGB"))
    )
    _same(predictor.predict_files([tmp_path / "grey16.png"])[0], ref)
    _same(predictor(wide)[0], ref)  # a uint16 array: scaled by 1 / 65535
    _same(predictor(Image.open(tmp_path / "grey16.png"))[0], ref)
    # RGBA: the colour channels (the alpha is dropped, as the training loader does)
    rgb = _pixels(2)
    rgba = np.concatenate([rgb, np.full((20, 24, 1), 90, np.uint8)], axis=-1)
    Image.fromarray(rgba).save(tmp_path / "rgba.png")
    (want,) = predictor(rgb)
    _same(predictor(Image.fromarray(rgba))[0], want)
    _same(predictor.predict_files([tmp_path / "rgba.png"])[0], want)


@pytest.mark.parametrize(
    ("item", "error", "message"),
    [
        (b"x.png", TypeError, "inputs: a bytes path b'x.png': pass a str or pathlib.Path"),
        (bytearray(b"x.png"), TypeError, "inputs: a bytes path"),
        (torch.zeros(4, 8, 8, dtype=torch.uint8), ValueError, "4 channels (RGBA?): expected 1 (grey) or 3 (RGB)"),
        (np.zeros((8, 8, 4), np.uint8), ValueError, "4 channels (RGBA?)"),
        (torch.zeros(3, 0, 0), ValueError, "an empty image (shape (3, 0, 0)): it has no pixels: inputs"),
        (torch.full((3, 8, 8), 200.0), ValueError, "float pixel values must lie in [0, 1], these span [200, 200]; "
                                                   "0-255 pixels? pass them as uint8, or divide by 255: inputs"),
        (torch.full((3, 8, 8), float("nan")), ValueError, "float pixel values are not all finite (NaN or inf): inputs"),
        (torch.full((3, 8, 8), 300), ValueError, "integer pixel values must lie in 0..255, these span 300..300"),
        (torch.zeros(8, 8, 3, dtype=torch.uint8), ValueError, "tensors are channels-first"),
        (torch.zeros(2, 8, 8, dtype=torch.uint8), ValueError, "a tensor of shape (2, 8, 8)"),
        (torch.zeros(3, 8, 8, dtype=torch.bool), TypeError, "inputs: a tensor of dtype torch.bool"),
        (np.zeros((8, 8, 3), object), TypeError, "inputs: a numpy array of dtype object"),
        ([torch.zeros(3, 8, 8), object()], TypeError, "inputs[1]: expected an image path"),
        ([torch.zeros(3, 8, 8), [1, 2]], TypeError, "inputs[1]: expected an image path"),
        ({"a": 1}, TypeError, "inputs: expected an image path"),
        (3.0, TypeError, "inputs: expected an image path"),
    ],
)  # fmt: skip
def test_inputs_it_cannot_take_are_errors_naming_the_argument(predictor, item, error, message):
    with pytest.raises(error) as e:
        predictor(item)
    assert message in str(e.value)


def test_options_and_device_are_checked_before_the_checkpoint_is_read(checkpoint, monkeypatch):
    missing = "no_such_checkpoint.pth"  # never read: the argument errors come first
    for options, error, message in (
        ({"top_k": "3"}, TypeError, "top_k must be an int, got str '3'"),
        ({"top_k": 0}, ValueError, "top_k must be an int >= 1, got 0"),
        ({"batch_size": 2.0}, TypeError, "batch_size must be an int"),
        ({"img_size": True}, TypeError, "img_size must be an int"),
        ({"img_size": 10**6}, ValueError, "img_size must be an int in 1..4096"),
        ({"device": "gpu"}, ValueError, "device='gpu': expected 'cpu', 'cuda', 'cuda:N' or 'auto'"),
        ({"device": 0}, TypeError, "device: expected a str"),
    ):
        with pytest.raises(error) as e:
            Predictor.from_checkpoint(missing, **options)
        assert message in str(e.value), options
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for device in ("cuda", "cuda:1", torch.device("cuda")):
        with pytest.raises(ValueError) as e:
            Predictor.from_checkpoint(checkpoint, device=device)
        assert str(e.value) == f"CUDA is not available on this machine: device={device!r}"
    assert Predictor.from_checkpoint(checkpoint, device="auto").device == torch.device("cpu")


def test_predict_files_takes_paths_only_and_reports_each_file(predictor, tmp_path):
    good = tmp_path / "good.png"
    Image.fromarray(_pixels()).save(good)
    (tmp_path / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    preds = predictor.predict_files([good, tmp_path / "bad.png", tmp_path / "missing.png"])
    assert [p.path for p in preds] == [str(good), str(tmp_path / "bad.png"), str(tmp_path / "missing.png")]
    assert preds[0].skipped is None and preds[1].skipped and preds[2].skipped == "file not found"
    assert [p.path for p in predictor.predict_files(str(good))] == [str(good)]  # one path, not its letters
    with pytest.raises(
        TypeError, match=r"paths\[0\]: expected a file path \(str or os.PathLike\), got Tensor"
    ):
        predictor.predict_files([torch.zeros(3, 8, 8)])
    with pytest.raises(TypeError, match=r"paths\[1\]: a bytes path"):
        predictor.predict_files([good, bytes(good)])


def test_as_image_outputs():
    """The one normalisation: a PIL image stays PIL (RGB), arrays and tensors become (3, H, W)."""
    assert as_image(Image.new("L", (5, 4), 7)).mode == "RGB"
    assert as_image(Image.new("P", (5, 4))).mode == "RGB"
    out = as_image(np.full((4, 5), 7, np.uint8))
    assert out.shape == (3, 4, 5) and out.dtype == torch.uint8 and int(out.max()) == 7
    out = as_image(np.full((4, 5), 65535, np.uint16))
    assert out.dtype == torch.float32 and float(out.min()) == 1.0
    out = as_image(torch.full((1, 4, 5), 1.0005))  # a resampling overshoot: clamped, not refused
    assert out.shape == (3, 4, 5) and float(out.max()) == 1.0
    f = Image.fromarray(np.array([[0.0, 0.5, 1.0]], np.float32))
    assert np.asarray(as_image(f))[0, :, 0].tolist() == [0, 128, 255]
