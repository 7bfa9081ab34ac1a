"""``from_hf``'s class count read as transformers reads it, and checked against the weights.

transformers 5 stores no ``num_labels`` in config.json and leaves ``id2label`` out when it is the
2-label default, so the folder of a default ``RTDetrConfig()`` has neither key and 2-class heads.
"""

from __future__ import annotations

import json

import pytest
import torch

from peg_core.interop.io import WeightsError
from peg_detr import from_hf
from peg_detr.interop import hf_num_labels

transformers = pytest.importorskip("transformers")

from tests.detr.test_rtdetr_hf import _small_config  # noqa: E402  (after the skip: it needs transformers)


def _save(config, folder):
    torch.manual_seed(0)
    hf = transformers.RTDetrForObjectDetection(config).eval()
    hf.save_pretrained(folder)
    return hf


def test_hf_num_labels_follows_transformers():
    for config in (transformers.RTDetrConfig(), transformers.RTDetrConfig(num_labels=80)):
        saved = config.to_diff_dict()
        assert hf_num_labels(saved) == config.num_labels
    assert hf_num_labels({}) == 2
    assert hf_num_labels({"num_labels": 5}) == 5
    # id2label wins over num_labels (transformers only warns about the conflict)
    assert hf_num_labels({"num_labels": 5, "id2label": {"0": "a", "1": "b", "2": "c"}}) == 3
    with pytest.raises(WeightsError, match=r"key 'num_labels' must be a positive int; got \"80\""):
        hf_num_labels({"num_labels": "80"})
    with pytest.raises(WeightsError, match="key 'id2label' must be a non-empty object"):
        hf_num_labels({"id2label": []})


@pytest.mark.parametrize("num_labels", [None, 80])
def test_from_hf_class_count_like_transformers(tmp_path, num_labels):
    """Default labels (neither key in config.json, 2 classes) and ``num_labels=80`` (an 80-entry id2label)."""
    config = _small_config(num_labels=num_labels or 2)  # 2: transformers' default, which it does not write
    hf = _save(config, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    if num_labels is None:
        assert "id2label" not in saved and "num_labels" not in saved
    else:
        assert len(saved["id2label"]) == 80
    ours, report = from_hf(tmp_path)
    assert ours.num_classes == hf.config.num_labels == (num_labels or 2)
    assert report.missing == [] and report.skipped == {}
    x = torch.randn(1, 3, 128, 160, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want, got = hf(x), ours(x)
    assert got["pred_logits"].shape == (1, 30, num_labels or 2)
    torch.testing.assert_close(got["pred_logits"], want.logits, atol=1e-4, rtol=0)
    torch.testing.assert_close(got["pred_boxes"], want.pred_boxes, atol=1e-4, rtol=0)


def test_from_hf_default_r50vd_config(tmp_path):
    """The default ``RTDetrConfig()`` itself (R50vd, 2 labels): the folder loads, the heads have 2 classes."""
    _save(transformers.RTDetrConfig(), tmp_path)
    ours, _ = from_hf(tmp_path)
    assert ours.num_classes == 2 and ours.backbone.layer_type == "bottleneck"
    assert ours.decoder.class_embed[0].weight.shape == (2, 256)


def test_from_hf_class_count_disagrees_with_weights(tmp_path):
    _save(_small_config(num_labels=2), tmp_path)  # 2-class heads
    config = json.loads((tmp_path / "config.json").read_text())
    for extra, source in (
        ({"num_labels": 80}, "num_labels"),
        ({"id2label": {"0": "a", "1": "b", "2": "c"}}, "id2label"),
    ):
        (tmp_path / "config.json").write_text(json.dumps({**config, **extra}))
        with pytest.raises(WeightsError) as err:
            from_hf(tmp_path)
        message = str(err.value)
        assert "\n" not in message and "model.enc_score_head.weight has shape (2, 64)" in message
        assert f"config.json key '{source}' gives {len(extra.get('id2label', [])) or 80} classes" in message
