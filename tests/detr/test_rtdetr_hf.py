"""``peg_detr.from_hf`` / ``export_hf_rtdetr`` against transformers' ``RTDetrForObjectDetection``.

Random models (a small ResNet-vd config and the default R50vd one) are saved with
``save_pretrained`` and rebuilt by ``from_hf``: logits and boxes equal at 320x320 and 256x384;
the post-processor equals transformers'; the export back to a Hugging Face folder loads with
``from_pretrained``; broken folders give one-line errors.  (``pos_enc="peg"`` equal to ``"none"`` as
read, and the ONNX export at other sizes: every arch's, ``test_archs.py``.)
"""

from __future__ import annotations

import json

import pytest
import torch
from scipy.optimize import linear_sum_assignment

from peg_core.interop.io import WeightsError
from peg_detr import from_hf
from peg_detr.interop import export_hf_rtdetr
from peg_detr.models.rtdetr import RTDETRPostProcess

transformers = pytest.importorskip("transformers")

SIZES = [(320, 320), (256, 384)]


def _randomise(model: torch.nn.Module) -> None:
    """Non-trivial box heads and BN statistics (their init is zero / identity), so a mix-up shows.

    transformers draws the encoder's BatchNorm weights from N(0, 0.01): every BN then shrinks the
    signal ~100x and the encoder's maps come out nearly constant over space (spatial std ~2e-4 of
    |x| ~3e-2), so the features barely depend on the image and the top-K scores tie to 1e-7 or
    exactly.  BN weights in [0.5, 1.5] keep the maps image-dependent and the top-K well separated.
    """
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "bbox_embed" in name or "bbox_head" in name:
                p.normal_(0, 0.1)
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.weight.uniform_(0.5, 1.5)
        for name, b in model.named_buffers():
            if name.endswith("running_var"):
                b.uniform_(0.5, 2.0)
            elif name.endswith("running_mean"):
                b.normal_(0, 0.1)


def _small_config(**overrides):
    backbone = transformers.RTDetrResNetConfig(
        layer_type="basic", depths=[1, 1, 1, 1], hidden_sizes=[32, 64, 128, 256], embedding_size=32,
        out_features=["stage2", "stage3", "stage4"],
    )  # fmt: skip
    options = dict(
        backbone_config=backbone, encoder_hidden_dim=64, d_model=64, encoder_in_channels=[64, 128, 256],
        decoder_in_channels=[64, 64, 64], num_labels=7, num_queries=30, decoder_layers=3,
    )  # fmt: skip
    return transformers.RTDetrConfig(**{**options, **overrides})


@pytest.fixture(scope="module")
def small_folder(tmp_path_factory):
    torch.manual_seed(0)
    model = transformers.RTDetrForObjectDetection(_small_config()).eval()
    _randomise(model)
    folder = tmp_path_factory.mktemp("hf") / "small"
    model.save_pretrained(folder)
    return model, folder


def _assert_same(hf, ours, x, atol=1e-4):
    """Logits and boxes equal query by query, except that two queries whose scores tie may trade places.

    The decoder is equivariant to the order of its queries, and the query selection sorts the
    encoder's top-K scores: a float-rounding difference between two equal implementations (~1e-6;
    the backbone folds its frozen norms into the convolutions, transformers applies them after)
    can swap two scores that tie to that level, which swaps their two output rows and nothing
    else.  So rows are matched by assignment, and a matched pair off the diagonal must be a tie of
    transformers' own selection scores (within 1e-5).
    """
    with torch.no_grad():
        want, got = hf(x), ours(x)
    for b in range(x.shape[0]):
        rows_want = torch.cat([want.logits[b], want.pred_boxes[b]], -1).double()
        rows_got = torch.cat([got["pred_logits"][b], got["pred_boxes"][b]], -1).double()
        cost = torch.cdist(rows_got, rows_want, p=float("inf"))
        ours_idx, hf_idx = map(torch.as_tensor, linear_sum_assignment(cost.numpy()))
        worst = cost[ours_idx, hf_idx].max().item()
        assert worst <= atol, f"image {b}: a query differs by {worst:.2e} (> {atol})"
        moved = ours_idx != hf_idx
        scores = want.enc_topk_logits[b].max(-1).values
        gaps = (scores[ours_idx[moved]] - scores[hf_idx[moved]]).abs()
        assert (gaps <= 1e-5).all(), f"image {b}: queries with untied scores swapped places, gaps {gaps}"
        assert moved.sum() <= len(scores) // 10, f"image {b}: {int(moved.sum())} queries out of place"
    return want, got


@pytest.mark.parametrize("size", SIZES)
def test_small_config_matches_transformers(small_folder, size):
    hf, folder = small_folder
    ours, report = from_hf(folder)
    assert not ours.training and ours.encoder.pos_enc == "sincos"
    assert report.converted == {} and report.missing == [] and report.skipped == {}
    assert len(report.copied) == len(ours.state_dict()) and report.args["model_type"] == "rt_detr"
    _assert_same(hf, ours, torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(1)))


def test_default_r50vd_config_matches_transformers(tmp_path):
    torch.manual_seed(0)
    hf = transformers.RTDetrForObjectDetection(transformers.RTDetrConfig(num_labels=80)).eval()
    _randomise(hf)
    hf.save_pretrained(tmp_path)
    ours, _ = from_hf(tmp_path)
    assert (
        ours.num_queries == 300 and len(ours.decoder.layers) == 6 and ours.backbone.layer_type == "bottleneck"
    )
    for size in SIZES:
        _assert_same(hf, ours, torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(2)))


def test_postprocess_matches_transformers():
    """Random logits (no ties) and boxes through both post-processors: the same top-K pairs."""
    from types import SimpleNamespace

    gen = torch.Generator().manual_seed(3)
    logits, boxes = torch.randn(2, 30, 7, generator=gen) * 3, torch.rand(2, 30, 4, generator=gen) * 0.5 + 0.1
    sizes = torch.tensor([[480, 640], [300, 200]])
    ref = transformers.RTDetrImageProcessor().post_process_object_detection(
        SimpleNamespace(logits=logits, pred_boxes=boxes), threshold=-1.0, target_sizes=sizes
    )
    mine = RTDETRPostProcess(num_top_queries=30)({"pred_logits": logits, "pred_boxes": boxes}, sizes)
    for r, m in zip(ref, mine):
        assert m["scores"].shape == (30,) and torch.equal(m["labels"], r["labels"])
        torch.testing.assert_close(m["scores"], r["scores"], atol=1e-6, rtol=0)
        torch.testing.assert_close(m["boxes"], r["boxes"], atol=1e-4, rtol=0)
    # one query, two classes: both pairs are kept, best first; capped at Q * C pairs
    many = RTDETRPostProcess(num_top_queries=1000)({"pred_logits": logits, "pred_boxes": boxes}, sizes)[0]
    assert many["scores"].shape == (30 * 7,) and bool((many["scores"][:-1] >= many["scores"][1:]).all())
    torch.testing.assert_close(many["scores"].sort().values, logits[0].sigmoid().flatten().sort().values)


def test_export_hf_round_trip(small_folder, tmp_path):
    _, folder = small_folder
    ours, _ = from_hf(folder)
    out = export_hf_rtdetr(ours, tmp_path / "exported")
    back = transformers.RTDetrForObjectDetection.from_pretrained(out).eval()
    assert json.loads((out / "config.json").read_text())["model_type"] == "rt_detr"
    for size in SIZES:
        _assert_same(
            back, ours, torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(4)), atol=1e-5
        )
    peg, _ = from_hf(folder, pos_enc="peg")
    with pytest.raises(ValueError, match="pos_enc 'peg' cannot be exported"):
        export_hf_rtdetr(peg, tmp_path / "refused")
    assert not (tmp_path / "refused").exists()


def test_from_hf_errors(small_folder, tmp_path):
    _, folder = small_folder
    with pytest.raises(WeightsError, match="Hugging Face folder not found"):
        from_hf(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(WeightsError, match=r"no config\.json"):
        from_hf(tmp_path / "empty")
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "yolos"}))
    with pytest.raises(ValueError, match="model_type 'yolos' is not supported"):
        from_hf(other)
    # a config that does not describe the weights: another width
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    config = json.loads((folder / "config.json").read_text())
    (wrong / "config.json").write_text(json.dumps({**config, "decoder_ffn_dim": 96}))
    with pytest.raises(WeightsError, match="neither"):
        from_hf(wrong)
    (wrong / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    with pytest.raises(WeightsError) as e:  # named before the model is built
        from_hf(wrong)
    assert str(e.value) == (f"config.json key 'decoder_ffn_dim' is 96, but the weights' model.decoder.layers.0.fc1.weight "
                            f"has shape (1024, 64): {wrong / 'config.json'}")  # fmt: skip
    (wrong / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(WeightsError, match=r"model\.safetensors"):
        from_hf(wrong)


def test_from_hf_detr_folder(tmp_path):
    config = transformers.DetrConfig(
        use_timm_backbone=True, backbone="resnet50", use_pretrained_backbone=False, d_model=32,
        encoder_layers=1, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
        encoder_ffn_dim=64, decoder_ffn_dim=64, num_queries=5, num_labels=3, auxiliary_loss=False,
    )  # fmt: skip
    torch.manual_seed(0)
    hf = transformers.DetrForObjectDetection(config).eval()
    hf.save_pretrained(tmp_path)
    ours, report = from_hf(tmp_path)
    assert report.args["model_type"] == "detr" and not report.missing
    x = torch.randn(1, 3, 96, 128)
    with torch.no_grad():
        want, got = hf(x), ours(x)
    torch.testing.assert_close(got["pred_logits"], want.logits, atol=1e-4, rtol=0)
    torch.testing.assert_close(got["pred_boxes"], want.pred_boxes, atol=1e-4, rtol=0)
