"""``python -m peg_video export``: every ViT position encoding, run by onnxruntime at other clip sizes.

A tiny video transformer per encoding is built in-process and saved in the
engine's checkpoint format; the export goes through the command line
(in-process ``main``) and the graph runs at two clip shapes (batch, length,
non-square crop) other than the example's, against PyTorch.
"""

from __future__ import annotations

import json

import pytest
import torch

from peg_core.engine.checkpoint import CHECKPOINT_FORMAT
from peg_video.__main__ import main
from peg_video.models import build_video_model

pytest.importorskip("onnxruntime")

CLIPS = [(1, 4, 16, 16), (3, 8, 40, 24)]  # (B, T, H, W), tubelet (2, 8, 8)


def _save_checkpoint(model, config: dict, path):
    """``model`` (zero parameters randomised) as a 3-class checkpoint at ``path``; returns ``(model, path)``."""
    with torch.no_grad():  # PEG projections may start at zero: make every part count
        for p in model.parameters():
            if p.abs().sum() == 0:
                p.normal_(0, 0.1)
    torch.save(
        {"format": CHECKPOINT_FORMAT, "task": "video", "model": model.state_dict(), "model_config": config,
         "meta": {"classes": ["a", "b", "c"]}, "args": {"num_frames": 4}},
        path,
    )  # fmt: skip
    return model.eval(), path


def _checkpoint(tmp_path, pos_enc: str):
    torch.manual_seed(0)
    config = {
        "name": "vit_tiny", "pos_enc": pos_enc, "num_classes": 3, "num_frames": 4, "img_size": 16,
        "tubelet": [2, 8, 8], "embed_dim": 16, "depth": 1, "num_heads": 2, "mlp_ratio": 1.0,
    }  # fmt: skip
    return _save_checkpoint(build_video_model(**config), config, tmp_path / f"{pos_enc}.pth")


def _export_and_compare(model, ckpt, out, capsys) -> None:
    """Export ``ckpt`` with a 2 x 6 x 24 x 32 example (checked by ``--check``), then run the graph at CLIPS."""
    import onnxruntime as ort

    args = ["export", str(ckpt), str(out), "--num-frames", "6", "--height", "24", "--width", "32", "--check"]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["example"] == [2, 3, 6, 24, 32] and report["max_abs_diff"] <= 1e-4
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    for b, t, h, w in CLIPS:
        x = torch.randn(b, 3, t, h, w)
        (got,) = session.run(None, {"clips": x.numpy()})
        with torch.no_grad():
            want = model(x)
        assert got.shape == (b, 3)
        torch.testing.assert_close(torch.from_numpy(got), want, atol=1e-4, rtol=0)


@pytest.mark.slow  # an ONNX export each
@pytest.mark.parametrize("pos_enc", ["peg3d", "peg3d-factorized", "learned", "none"])
def test_export_dynamic_clips_match_pytorch(tmp_path, capsys, pos_enc):
    import onnx

    model, ckpt = _checkpoint(tmp_path, pos_enc)
    out = tmp_path / "video.onnx"
    # example 6 frames of 24x32: neither of the sizes of CLIPS
    _export_and_compare(model, ckpt, out, capsys)
    props = {p.key: p.value for p in onnx.load(str(out)).metadata_props}
    assert json.loads(props["peg_classes"]) == ["a", "b", "c"]


@pytest.mark.slow  # an ONNX export
def test_export_vjepa2_classifier_with_its_attentive_pooler(tmp_path, capsys):
    """A V-JEPA 2 classifier folder (3-D rotary, attentive pooler) as ``train --init FOLDER`` builds it.

    ``--pos-enc table`` keeps V-JEPA 2's own rotary encoding (``rope-3d`` in its channel layout);
    the graph rebuilds the rotary table, and the pooler's block and cross-attention run, for
    each input's grid.  (One case: an export takes seconds.)
    """
    transformers = pytest.importorskip("transformers")
    from peg_video.model import model_from_hf_folder

    cfg = transformers.VJEPA2Config(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, crop_size=16, patch_size=8,
        frames_per_clip=4, tubelet_size=2, pred_hidden_size=16, pred_num_hidden_layers=1,
        pred_num_attention_heads=2, num_pooler_layers=1, num_labels=3,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.VJEPA2ForVideoClassification(cfg).save_pretrained(tmp_path / "vjepa2")
    model, config, _ = model_from_hf_folder(tmp_path / "vjepa2", "table", 3)
    assert (config["pos_enc"], config["rope_layout"], config["global_pool"], config["pool_depth"]) == (
        "rope-3d", "vjepa2", "attentive", 1
    )  # fmt: skip
    model, ckpt = _save_checkpoint(model, config, tmp_path / "vjepa2.pth")
    _export_and_compare(model, ckpt, tmp_path / "vjepa2.onnx", capsys)


def test_export_user_errors(tmp_path, capsys):
    _, ckpt = _checkpoint(tmp_path, "none")
    assert main(["export", str(tmp_path / "nope.pth"), str(tmp_path / "a.onnx")]) == 1
    assert "checkpoint not found" in capsys.readouterr().err
    detect = tmp_path / "detect.pth"
    torch.save({"format": CHECKPOINT_FORMAT, "task": "detect", "model": {}}, detect)
    assert main(["export", str(detect), str(tmp_path / "a.onnx")]) == 1
    assert "wrong model" in capsys.readouterr().err
    blocker = tmp_path / "file.txt"
    blocker.write_text("")
    assert main(["export", str(ckpt), str(blocker / "a.onnx")]) == 1
    assert "not writable" in capsys.readouterr().err
    # 5 frames do not split into tubelets of 2; 2 frames are a single tubelet
    for frames in ("5", "2"):
        assert main(["export", str(ckpt), str(tmp_path / "a.onnx"), "--num-frames", frames]) == 1
        assert "multiples of the tubelet" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["export", str(ckpt), str(tmp_path / "a.onnx"), "--opset", "7"])
    assert e.value.code == 2
