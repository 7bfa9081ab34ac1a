"""Read what transformers reads: the default ``VideoMAEConfig()``, ``TimesformerConfig()`` and ``VJEPA2Config()``
(each as an encoder and as its video classifier) written by ``save_pretrained`` and read by
``peg_video.from_hf``.

Only the depth is shrunk (one block; V-JEPA 2's unused predictor too), so the models build in a second:
every other field is transformers' default (ViT-B / ViT-L widths, 224 / 256 px, 16 / 8 / 64 frames,
tubelets, eps, biases, pooling, a classifier's two default labels that ``config.json`` does not spell
out).  Each loads with no key left over and gives transformers' outputs at its native clip (V-JEPA 2:
4 of its 64 frames, which transformers runs too; 64 frames at 256 px would be 8,192 tokens).
"""

from __future__ import annotations

import json

import pytest
import torch

from peg_video.interop.hf import from_hf, read_hf_video_config

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # ViT-B / ViT-L widths at their native clips: ~30 s on a CPU for the file

KINDS = {
    "videomae": ("VideoMAEConfig", "VideoMAEModel", "VideoMAEForVideoClassification"),
    "timesformer": ("TimesformerConfig", "TimesformerModel", "TimesformerForVideoClassification"),
    "vjepa2": ("VJEPA2Config", "VJEPA2Model", "VJEPA2ForVideoClassification"),
}


@pytest.mark.parametrize("classifier", [False, True], ids=["encoder", "classifier"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_default_configs_load_and_match(kind, classifier, tmp_path):
    config_cls, encoder_cls, classifier_cls = (getattr(transformers, n) for n in KINDS[kind])
    shrink = {"num_hidden_layers": 1, **({"pred_num_hidden_layers": 1} if kind == "vjepa2" else {})}
    defaults = config_cls()
    config = config_cls(**shrink)
    model_cls = classifier_cls if classifier else encoder_cls
    torch.manual_seed(0)
    hf = model_cls(config).eval()
    with torch.no_grad():  # transformers' init leaves biases and norms at 0 / 1: move everything
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    hf.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved.get("id2label") is None or not classifier  # the default labels are not written out
    info = read_hf_video_config(tmp_path)
    assert info["num_classes"] == (2 if classifier else 0)  # transformers' default num_labels
    assert info["embed_dim"] == defaults.hidden_size and info["num_heads"] == defaults.num_attention_heads
    ours, report = from_hf(tmp_path)
    # a VideoMAE encoder has no pooling norm: peg_video's mean pooling adds a fresh fc_norm (documented)
    new = ["fc_norm.weight", "fc_norm.bias"] if (kind, classifier) == ("videomae", False) else []
    assert report.missing == new, report.missing
    frames = 4 if kind == "vjepa2" else info["num_frames"]
    side = info["image_size"]
    x = torch.randn(1, 3, frames, *side, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = (
            hf(pixel_values_videos=x.transpose(1, 2))
            if kind == "vjepa2"
            else hf(pixel_values=x.transpose(1, 2))
        )
        got = ours(x) if classifier else ours.forward_features(x)[0]
    want = out.logits if classifier else out.last_hidden_state
    if (
        kind == "timesformer" and not classifier
    ):  # transformers orders the grid patch by patch, ours frame by frame
        b, _, d = want.shape
        grid = want[:, 1:].reshape(b, -1, frames, d).transpose(1, 2).reshape(b, -1, d)
        want = torch.cat([want[:, :1], grid], 1)
    assert got.shape == want.shape, (got.shape, want.shape)
    torch.testing.assert_close(got, want, atol=2e-4, rtol=0)
