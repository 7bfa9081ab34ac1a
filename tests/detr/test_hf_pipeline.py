"""``export-hf`` folders in transformers' ``pipeline("object-detection")`` give ``predict``'s detections.

For each family a small random model is written as a training checkpoint (its run's ``--val-size``
recorded, named categories), exported with ``python -m peg_detr export-hf`` and read back by
``transformers.pipeline("object-detection", model=folder)``: the folder's ``preprocessor_config.json``
(the processor transformers pairs with the model, at the run's size, with the model's normalisation)
makes the pipeline feed the model what :class:`peg_detr.predict.Predictor` feeds it, so the two agree
on the same non-square image file: the same labels by name, scores within 1e-5, boxes within the
pipeline's rounding to whole pixels (it truncates).

* RT-DETR and D-FINE (tiny random transformers folders read by ``from_hf``): ``RTDetrImageProcessor``,
  a square resize, pixels in [0, 1];
* DEIMv2 with a DINOv3 ViT: the same processor with ImageNet mean / std (peg_detr's backbone
  standardises inside the model, transformers' takes standardised pixels); and DEIMv2-S's layout (the
  distilled ViT, its last block taken without a norm, which transformers' ``DINOv3ViTBackbone``
  always applies): the folder holds one more block that changes nothing, and transformers computes
  what the model computes;
* DETR (``sine``, ResNet-18): ``DetrImageProcessor``, short side ``--val-size``, ImageNet mean / std.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from PIL import Image
from scipy.optimize import linear_sum_assignment

from peg_core.engine.checkpoint import CHECKPOINT_FORMAT
from peg_detr.__main__ import main as cli
from peg_detr.labels import LabelMap
from peg_detr.predict import Predictor
from tests.detr.rtdetr_checks import tiny_rtdetr_config

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

SIZE = 96  # the runs' --val-size: the folders' processor size
NAMES = ["square", "disc", "triangle", "star", "ring"]
TOP = 12  # detections compared per image (the best by score)


def _image(path, width=150, height=110, seed=0):
    """A non-square RGB image with structure (blocks of colour) and noise, written to ``path``."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (height // 10 + 1, width // 10 + 1, 3), dtype=np.uint8)
    pixels = np.kron(blocks, np.ones((10, 10, 1), dtype=np.uint8))[:height, :width]
    noisy = np.clip(pixels.astype(int) + rng.integers(-20, 21, pixels.shape), 0, 255).astype(np.uint8)
    Image.fromarray(noisy).save(path)
    return path


def _checkpoint(model, arch, folder, classes):
    """A training checkpoint of ``model`` (``arch``) whose run evaluated at :data:`SIZE`."""
    cats = [{"id": i + 1, "name": n} for i, n in enumerate(NAMES[:classes])]
    config = {"arch": arch, **model.build_config, "num_classes": model.num_classes}
    meta = {
        "categories": cats,
        "labels": LabelMap.from_categories(cats, "contiguous").to_json(),
        "val_size": SIZE,
    }
    path = folder / "checkpoint.pth"
    torch.save({"format": CHECKPOINT_FORMAT, "task": "detect", "model": model.state_dict(), "model_config": config,
                "meta": meta, "args": {"val_size": SIZE}}, path)  # fmt: skip
    return path


def _export_and_compare(checkpoint, tmp_path, processor_type, normalized):
    out = tmp_path / "hf"
    assert cli(["export-hf", str(checkpoint), str(out)]) == 0
    pre = json.loads((out / "preprocessor_config.json").read_text())
    assert pre["image_processor_type"] == processor_type and pre["do_normalize"] is normalized
    image = _image(tmp_path / "image.png")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pipe = transformers.pipeline("object-detection", model=str(out), device="cpu")
    assert type(pipe.image_processor).__name__ == processor_type
    theirs = sorted(pipe(str(image), threshold=0.0), key=lambda d: -d["score"])
    ours = Predictor(checkpoint, threshold=0.0).predict_files([str(image)])[0].detections[:TOP]
    assert len(ours) == TOP and len(theirs) >= TOP
    # matched by assignment: two detections whose scores tie to rounding may trade places
    cost = np.full((len(ours), len(theirs)), np.inf)
    for i, d in enumerate(ours):
        for j, t in enumerate(theirs):
            box = [t["box"][k] for k in ("xmin", "ymin", "xmax", "ymax")]
            if t["label"] == d.name and all(abs(a - b) < 1.0 for a, b in zip(d.box, box)):
                cost[i, j] = abs(t["score"] - d.score)
    finite = np.where(np.isfinite(cost), cost, 1e9)
    rows, cols = linear_sum_assignment(finite)
    worst = finite[rows, cols].max()
    assert worst <= 1e-5, f"a detection of predict has no match in the pipeline's (score gap {worst:.2e})"
    # the scores tell detections apart (not all one value): the comparison is not vacuous
    assert ours[0].score - ours[-1].score > 1e-4
    return out


@torch.no_grad()
def _perturb(model, seed):
    """Every float tensor of the state dict moved (zero-initialised heads included), norms near 1; buffers
    that are not saved (an input standardisation, rotary periods) are constants of the architecture."""
    g = torch.Generator().manual_seed(seed)
    for name, t in model.state_dict().items():
        if not t.is_floating_point() or name.endswith(("up", "reg_scale", "num_points_scale")):
            continue
        if name.endswith("running_var"):
            t.copy_(torch.rand(t.shape, generator=g) + 0.5)
        else:
            t.add_(torch.randn(t.shape, generator=g) * 0.1)
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d) or "FrozenBatchNorm" in type(module).__name__:
            module.weight.copy_(torch.rand(module.weight.shape, generator=g) + 0.5)


def _from_transformers(config, cls, tmp_path, seed=0):
    from peg_detr import from_hf

    torch.manual_seed(seed)
    hf = cls(config).eval()
    _perturb(hf, seed)
    hf.save_pretrained(tmp_path / "src")
    model, _ = from_hf(tmp_path / "src")
    return model


def test_rtdetr_pipeline_equals_predict(tmp_path):
    backbone = transformers.RTDetrResNetConfig(
        layer_type="basic", depths=[1, 1, 1, 1], hidden_sizes=[32, 64, 128, 256], embedding_size=32,
        out_features=["stage2", "stage3", "stage4"],
    )  # fmt: skip
    config = transformers.RTDetrConfig(
        backbone_config=backbone, encoder_hidden_dim=64, d_model=64, encoder_in_channels=[64, 128, 256],
        decoder_in_channels=[64, 64, 64], num_labels=5, num_queries=30, decoder_layers=3,
    )  # fmt: skip
    model = _from_transformers(config, transformers.RTDetrForObjectDetection, tmp_path)
    out = _export_and_compare(
        _checkpoint(model, "rtdetr", tmp_path, 5), tmp_path, "RTDetrImageProcessor", False
    )
    assert json.loads((out / "preprocessor_config.json").read_text())["size"] == {
        "height": SIZE,
        "width": SIZE,
    }
    processor = transformers.AutoImageProcessor.from_pretrained(out)  # what a user loads by hand too
    assert processor.size["height"] == SIZE and not processor.do_normalize
    # the control: at transformers' default size (640) the pipeline's best score is another
    pre = json.loads((out / "preprocessor_config.json").read_text())
    (out / "preprocessor_config.json").write_text(json.dumps({**pre, "size": {"height": 640, "width": 640}}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        at_640 = transformers.pipeline("object-detection", model=str(out), device="cpu")
    best = Predictor(tmp_path / "checkpoint.pth", threshold=0.0).predict_files([str(tmp_path / "image.png")])
    assert (
        abs(at_640(str(tmp_path / "image.png"), threshold=0.0)[0]["score"] - best[0].detections[0].score)
        > 1e-4
    )


def test_dfine_pipeline_equals_predict(tmp_path):
    from tests.detr.test_dfine_hf import _config

    model = _from_transformers(_config(), transformers.DFineForObjectDetection, tmp_path)
    _export_and_compare(_checkpoint(model, "dfine", tmp_path, 5), tmp_path, "RTDetrImageProcessor", False)


@pytest.mark.skipif(not hasattr(transformers, "Deimv2Config"), reason="this transformers has no DEIMv2")
def test_deimv2_dinov3_pipeline_equals_predict(tmp_path):
    from tests.detr.test_deimv2_hf import _config

    model = _from_transformers(_config("dinov3"), transformers.Deimv2ForObjectDetection, tmp_path)
    _export_and_compare(_checkpoint(model, "deimv2", tmp_path, 5), tmp_path, "RTDetrImageProcessor", True)


@pytest.mark.skipif(not hasattr(transformers, "Deimv2Config"), reason="this transformers has no DEIMv2")
def test_deimv2_s_layout_exports_a_form_transformers_computes(tmp_path):
    """DEIMv2-S's distilled ViT takes its last block without a norm; transformers' backbone norms its last
    stage.  The export adds a block that changes nothing, so the last stage transformers norms is unread."""
    from peg_detr.interop import deimv2_from_hf, export_hf_deimv2
    from peg_detr.models.deimv2 import build_deimv2

    torch.manual_seed(0)
    model, _, _ = build_deimv2(
        "vit_tiny", hidden_dim=32, num_heads=2, dec_heads=2, enc_dim_feedforward=64, dim_feedforward=64,
        dec_layers=2, num_queries=20, num_classes=5, vit_options=dict(embed_dim=32, depth=3, num_heads=2),
        vit_out_indices=[0, 1, 2], sta_inplanes=8,
    )  # fmt: skip
    backbone = model.backbone
    assert backbone.out_indices[-1] == len(backbone.vit.blocks) - 1
    assert not (backbone.apply_layernorm or backbone.final_norm)  # the layout transformers used to refuse
    _perturb(model, 3)
    model.eval()
    export_hf_deimv2(model, tmp_path / "direct")
    saved = json.loads((tmp_path / "direct" / "config.json").read_text())["backbone_config"]
    assert saved["num_hidden_layers"] == 4 and saved["out_indices"] == [1, 2, 3]
    hf = transformers.Deimv2ForObjectDetection.from_pretrained(tmp_path / "direct").eval()
    back, _ = deimv2_from_hf(tmp_path / "direct")  # read back: the extra block is never run
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)))
    for size in ((64, 64), (64, 96)):
        x = torch.rand(1, 3, *size, generator=torch.Generator().manual_seed(size[1]))
        with torch.no_grad():
            want, theirs, again = model(x), hf(pixel_values=(x - mean) / std), back(x)
        for a, b in ((want, again), (want, {"pred_logits": theirs.logits, "pred_boxes": theirs.pred_boxes})):
            torch.testing.assert_close(a["pred_logits"], b["pred_logits"], atol=1e-4, rtol=0)
            torch.testing.assert_close(a["pred_boxes"], b["pred_boxes"], atol=1e-4, rtol=0)
    _export_and_compare(_checkpoint(model, "deimv2", tmp_path, 5), tmp_path, "RTDetrImageProcessor", True)


@pytest.mark.filterwarnings("ignore:resnet18 backbone starts from random weights")
def test_detr_pipeline_equals_predict(tmp_path):
    from peg_detr.models import build_detr

    torch.manual_seed(0)
    model, _, _ = build_detr("resnet18", "sine", num_classes=5, num_queries=20, hidden_dim=32, num_heads=2,
                             enc_layers=1, dec_layers=2, dim_feedforward=64)  # fmt: skip
    _perturb(model, 1)
    with torch.no_grad():  # a class head that separates the classes (init_std leaves the softmax ~flat)
        model.class_embed.weight.normal_(0, 0.5)
    model.eval()
    out = _export_and_compare(_checkpoint(model, "detr", tmp_path, 5), tmp_path, "DetrImageProcessor", True)
    size = json.loads((out / "preprocessor_config.json").read_text())["size"]
    assert size == {"shortest_edge": SIZE, "longest_edge": round(SIZE * 1333 / 800)}


def test_a_run_side_transformers_cannot_run_is_rounded_up_to_a_multiple_of_32():
    """transformers' RT-DETR family fails at 80 px (its FPN concatenates 5 and 6 cells): the folder's
    processor resizes to 96 instead (export-hf says so); sides that are multiples of 32 stay."""
    from peg_detr.interop.hf_processor import hf_side, rtdetr_processor_config

    assert rtdetr_processor_config(80)["size"] == {"height": 96, "width": 96}
    assert [hf_side(s) for s in (64, 96, 640, 650)] == [64, 96, 640, 672]
    transformers = pytest.importorskip("transformers")
    config = tiny_rtdetr_config(transformers, decoder_layers=1, num_queries=10, num_labels=2, num_denoising=0)
    model = transformers.RTDetrForObjectDetection(config).eval()
    with torch.no_grad():
        model(pixel_values=torch.rand(1, 3, 96, 96))  # the rounded side runs
        with pytest.raises(RuntimeError, match="Sizes of tensors must match"):
            model(pixel_values=torch.rand(1, 3, 80, 80))  # why it is rounded
