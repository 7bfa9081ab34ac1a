"""Every registered detector arch (:data:`peg_detr.archs.ARCHS`), each at its tiny size (:mod:`tests.detr.tiny`).

The checks every family must pass, parametrized over the registry (a new arch is tested by adding
its tiny settings to :data:`tests.detr.tiny.TINY`, or a ``"tiny"`` size preset):

* build and forward in eval mode at a square and a non-square size: the output contract, finite
  boxes in [0, 1], each image's outputs independent of the batch it came in;
* the training forward, the criterion's losses and their gradients reaching every part;
* ``model.build_config`` (json-safe, what a checkpoint stores) rebuilds the same model;
* the Hugging Face round trip: ``export_hf`` -> :func:`peg_detr.from_hf` gives back the same model,
  and transformers' ``AutoModelForObjectDetection`` reads the folder and computes the same logits and
  boxes (its input what the folder's ``preprocessor_config.json`` makes of the pixels); read with
  ``pos_enc="peg"`` the folder's model computes what ``"none"`` computes (the PEG added at zero and
  reported), and that model is refused by the export;
* the ONNX export (dynamic batch / height / width, a PEG with trained-looking weights) equals
  onnxruntime at sizes other than the export's (sides no multiple of the stride);
* every position encoding the arch accepts (``Arch.encodings``: each registered one alone, and the
  combinations its ``-h`` shows) builds, runs at a square and an odd non-square size, and trains.

Parity with transformers' own random models (folders transformers wrote, their variants and
refusals) stays per family: ``test_rtdetr_hf.py``, ``test_dfine_hf.py``, ``test_deimv2_hf.py``,
``test_hf_weights.py``.
"""

from __future__ import annotations

import json

import pytest
import torch

from peg_detr import from_hf
from peg_detr.archs import ARCHS
from peg_detr.model import build_model
from tests.detr.rtdetr_checks import topk_margin
from tests.detr.tiny import NUM_CLASSES, TINY, perturb, tiny_model

SIZES = [(96, 96), (96, 128)]  # square; non-square
NAMES = ["square", "disc", "triangle"]
TARGETS = [
    {"labels": torch.tensor([0, 2]), "boxes": torch.tensor([[0.3, 0.3, 0.2, 0.2], [0.6, 0.5, 0.3, 0.4]])},
    {"labels": torch.tensor([1]), "boxes": torch.tensor([[0.5, 0.5, 0.5, 0.5]])},
]
#: the registry when the tests are collected
ARCH_NAMES = list(ARCHS)
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

# tiny models: one intra-op thread is faster (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("one_thread")


def _normalise(x: torch.Tensor, mean=MEAN, std=STD) -> torch.Tensor:
    return (x - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)


def _model_input(arch: str, pixels: torch.Tensor) -> torch.Tensor:
    """What peg_detr's evaluation feeds the model for ``pixels`` in [0, 1]: DETR ImageNet-normalised pixels,
    the RT-DETR family the pixels (a DINOv3 backbone standardises inside the model)."""
    return pixels if ARCHS[arch].square_inputs else _normalise(pixels)


def _num_logits(arch: str) -> int:
    """The classifier's width: DETR's softmax has a no-object column, the RT-DETR family's sigmoid none."""
    return NUM_CLASSES + (0 if ARCHS[arch].square_inputs else 1)


def _pixels(batch: int, size: tuple[int, int], seed: int) -> torch.Tensor:
    return torch.rand(batch, 3, *size, generator=torch.Generator().manual_seed(seed))


def _max_diff(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in ("pred_logits", "pred_boxes"))


def test_every_arch_has_a_tiny_model():
    assert set(ARCHS) <= set(TINY), "add the new arch's tiny settings to tests/detr/tiny.py"


@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_forward_at_two_sizes(arch):
    model = perturb(tiny_model(arch)[0], 1).eval()
    assert type(model) is ARCHS[arch].model_cls
    q = TINY[arch]["num_queries"]
    for i, size in enumerate(SIZES):
        x = _model_input(arch, _pixels(2, size, i))
        with torch.no_grad():
            out, second = model(x), model(x[1:])
        assert {"pred_logits", "pred_boxes"} <= set(out)
        assert out["pred_logits"].shape == (2, q, _num_logits(arch)) and out["pred_boxes"].shape == (2, q, 4)
        # cx, cy, w, h: D-FINE's distance-based boxes may leave the image, their sides stay positive
        assert torch.isfinite(out["pred_logits"]).all() and torch.isfinite(out["pred_boxes"]).all()
        assert (out["pred_boxes"][..., 2:] > 0).all()
        # an image's detections do not depend on the batch it is in, and they do depend on the image
        assert _max_diff({k: out[k][1:] for k in ("pred_logits", "pred_boxes")}, second) <= 1e-4, size
        assert (out["pred_logits"][0] - out["pred_logits"][1]).abs().max() > 1e-3, size


@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_losses_and_gradients(arch):
    model, criterion, _ = tiny_model(arch)
    model.train()
    x = _model_input(arch, _pixels(2, SIZES[1], 3))
    # the RT-DETR family builds its denoising queries from the targets (the task's training step)
    out = model(x, TARGETS) if ARCHS[arch].square_inputs else model(x)
    losses = criterion(out, TARGETS)
    assert set(criterion.weight_dict) & set(losses), "no weighted loss"
    total = criterion.total(losses)
    assert torch.isfinite(total) and total > 0
    total.backward()
    # every top-level part with trainable weights gets a gradient (backbone, encoder, decoder, heads)
    parts: dict[str, bool] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            part = name.split(".")[0]
            parts[part] = parts.get(part, False) or (p.grad is not None and bool(p.grad.abs().sum() > 0))
    assert len(parts) >= 2 and all(parts.values()), parts


@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_build_config_rebuilds_the_model(arch):
    model = perturb(tiny_model(arch)[0], 4).eval()
    config = json.loads(json.dumps(model.build_config))  # what a checkpoint stores
    assert config == model.build_config and config["arch"] == arch
    again, _, _ = build_model(config)
    again.load_state_dict(model.state_dict())  # strict: the same keys and shapes
    x = _model_input(arch, _pixels(1, SIZES[1], 5))
    with torch.no_grad():
        assert _max_diff(model(x), again.eval()(x)) == 0


def _hf_input(folder, pixels: torch.Tensor) -> torch.Tensor:
    """What the folder's ``preprocessor_config.json`` makes of ``pixels`` in [0, 1] (already resized)."""
    pre = json.loads((folder / "preprocessor_config.json").read_text())
    return _normalise(pixels, pre["image_mean"], pre["image_std"]) if pre["do_normalize"] else pixels


def _check_top_k_margin(arch: str, model, x: torch.Tensor) -> None:
    """Two implementations may swap top-K cells that tie within float rounding: say so instead of a mismatch."""
    if ARCHS[arch].square_inputs:
        assert topk_margin(model, x) > 4e-6, f"near-tied top-K scores at {tuple(x.shape)}: not a valid check"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """``arch -> (model, its export_hf folder)``: the perturbed exportable tiny model, exported once."""
    pytest.importorskip("safetensors")
    done: dict[str, tuple] = {}

    def get(arch: str):
        if arch not in done:
            model = perturb(tiny_model(arch, hf=True)[0], 2).eval()
            folder = tmp_path_factory.mktemp(arch) / "hf"
            done[arch] = model, ARCHS[arch].export_hf(model, folder, NAMES, size=SIZES[0][0])
        return done[arch]

    return get


@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_hugging_face_round_trip(arch, exported):
    transformers = pytest.importorskip("transformers")
    model, folder = exported(arch)
    back, report = from_hf(folder)
    assert type(back) is type(model) and not back.training
    assert report.missing == [] and report.converted == {}
    theirs = transformers.AutoModelForObjectDetection.from_pretrained(folder).eval()
    assert theirs.config.model_type in ARCHS[arch].hf_model_types
    assert [theirs.config.id2label[i] for i in range(NUM_CLASSES)] == NAMES
    for i, size in enumerate(SIZES):
        pixels = _pixels(2, size, 10 + i)
        x = _model_input(arch, pixels)
        with torch.no_grad():
            ours, again, hf = model(x), back(x), theirs(pixel_values=_hf_input(folder, pixels))
        assert _max_diff(ours, again) <= 1e-6, size
        _check_top_k_margin(arch, model, x)
        assert (ours["pred_logits"] - hf.logits).abs().max() <= 1e-4, size
        assert (ours["pred_boxes"] - hf.pred_boxes).abs().max() <= 1e-4, size


@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_folder_read_with_a_peg_computes_what_none_computes(arch, exported, tmp_path):
    """``from_hf(folder, pos_enc="peg")``: the folder's weights plus a PEG at zero (reported as added), so the
    model computes what ``pos_enc="none"`` computes until it trains; it has no Hugging Face form."""
    _, folder = exported(arch)
    peg, report = from_hf(folder, pos_enc="peg")
    none, _ = from_hf(folder, pos_enc="none")
    assert report.converted and all(".pegs." in key or ".pos_blocks." in key for key in report.converted)
    assert all("zero" in why for why in report.converted.values()), report.converted
    assert all(not peg.state_dict()[key].any() for key in report.converted)
    for i, size in enumerate([*SIZES, (130, 100)]):
        x = _model_input(arch, _pixels(1, size, 20 + i))
        with torch.no_grad():  # the PEG adds exact zeros; only the op order rounds (~1e-8)
            assert _max_diff(peg(x), none(x)) <= 1e-5, size
    with pytest.raises(ValueError, match="peg"):
        ARCHS[arch].export_hf(peg, tmp_path / "refused", NAMES)
    assert not (tmp_path / "refused").exists()


@pytest.mark.slow  # an ONNX export per arch (~10 s each)
@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_onnx_export_equals_onnxruntime_at_other_sizes(arch, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from peg_core.export.onnx import export_onnx
    from peg_detr.export import DetrForExport

    model, _, _ = tiny_model(arch, pos_enc="peg")
    perturb(model, 6).eval()  # a trained-looking PEG (it may start at zero)
    dim = torch.export.Dim
    dynamic = (
        {
            0: dim("batch", min=1, max=64),
            2: dim("height", min=64, max=2048),
            3: dim("width", min=64, max=2048),
        },
    )
    example = _model_input(arch, _pixels(2, SIZES[0], 30))
    out = tmp_path / f"{arch}.onnx"
    export_onnx(
        DetrForExport(model).eval(), example, out, dynamic, "images", ["pred_logits", "pred_boxes"], 20, {}
    )
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    for i, (batch, h, w) in enumerate([(1, 97, 130), (3, 128, 96)]):  # odd, non-square; another batch
        x = _model_input(arch, _pixels(batch, (h, w), 31 + i))
        _check_top_k_margin(arch, model, x)
        logits, boxes = session.run(None, {"images": x.numpy()})
        with torch.no_grad():
            want = model(x)
        assert logits.shape == (batch, TINY[arch]["num_queries"], _num_logits(arch))
        torch.testing.assert_close(torch.from_numpy(logits), want["pred_logits"], atol=1e-4, rtol=0)
        torch.testing.assert_close(torch.from_numpy(boxes), want["pred_boxes"], atol=1e-4, rtol=0)


#: (arch, pos_enc): every encoding each arch's registry entry accepts alone, and its ``-h`` combinations
#: (the registry when the tests are collected, less encodings other tests register)
ENCODINGS = [
    (arch, name)
    for arch in ARCH_NAMES
    for name in dict.fromkeys([*ARCHS[arch].encodings.names(), *ARCHS[arch].encodings.examples])
    if not name.startswith("test-")
]


@pytest.mark.parametrize(("arch", "pos_enc"), ENCODINGS, ids=[f"{a}-{e}" for a, e in ENCODINGS])
def test_every_encoding_of_every_arch_runs_at_any_size_and_trains(arch, pos_enc):
    model, criterion, _ = tiny_model(arch, pos_enc=pos_enc)
    assert model.build_config["pos_enc"] == pos_enc
    q = TINY[arch]["num_queries"]
    model.eval()
    for i, size in enumerate([(96, 96), (97, 130)]):  # square; odd and non-square
        with torch.no_grad():
            out = model(_model_input(arch, _pixels(1, size, 40 + i)))
        assert out["pred_logits"].shape == (1, q, _num_logits(arch)), size
        assert torch.isfinite(out["pred_logits"]).all() and torch.isfinite(out["pred_boxes"]).all(), size
    model.train()
    x = _model_input(arch, _pixels(2, (96, 128), 42))
    out = model(x, TARGETS) if ARCHS[arch].square_inputs else model(x)
    total = criterion.total(criterion(out, TARGETS))
    total.backward()
    assert torch.isfinite(total)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
