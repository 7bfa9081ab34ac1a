"""``python -m peg_detr export``: every encoder position encoding, run by onnxruntime at other sizes.

Each checkpoint is a tiny detector built in-process and saved in the engine's
format; the export goes through the command line (in-process ``main``), and
the ONNX graph is run at two image sizes other than the example's (odd,
non-square, not multiples of the stride), against PyTorch on the same input.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from peg_core.engine.checkpoint import CHECKPOINT_FORMAT
from peg_detr.__main__ import main
from peg_detr.models import build_detr

pytest.importorskip("onnxruntime")

SIZES = [(48, 112), (90, 61)]


def _checkpoint(tmp_path, pos_enc: str):
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, _, _ = build_detr(
            "tiny", pos_enc, num_classes=3, num_queries=5, hidden_dim=32, num_heads=2, enc_layers=1,
            dec_layers=1, dim_feedforward=32, learned_grid=(3, 4),
        )  # fmt: skip
    with torch.no_grad():  # non-trivial PEG weights (its projection starts at zero in some builds)
        for p in model.parameters():
            if p.abs().sum() == 0:
                p.normal_(0, 0.1)
    path = tmp_path / f"{pos_enc}.pth"
    meta = {"categories": [{"id": i, "name": f"c{i}"} for i in range(3)]}
    torch.save(
        {"format": CHECKPOINT_FORMAT, "task": "detect", "model": model.state_dict(),
         "model_config": model.build_config, "meta": meta},
        path,
    )  # fmt: skip
    return model.eval(), path


@pytest.mark.slow  # an ONNX export each (``peg`` alone: every arch's, test_archs.py)
@pytest.mark.parametrize("pos_enc", ["sine", "learned", "none", "rope-axial", "peg+rope-mixed"])
def test_export_dynamic_sizes_match_pytorch(tmp_path, capsys, pos_enc):
    import onnx
    import onnxruntime as ort

    model, ckpt = _checkpoint(tmp_path, pos_enc)
    out = tmp_path / "out" / "detr.onnx"
    assert main(["export", str(ckpt), str(out), "--height", "64", "--width", "80", "--check"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["max_abs_diff"] <= 1e-4
    props = {p.key: p.value for p in onnx.load(str(out)).metadata_props}
    assert json.loads(props["peg_categories"])[2]["name"] == "c2"
    # a checkpoint without meta["labels"] (written before --labels): category ids are the labels
    assert json.loads(props["peg_labels"]) == {
        "mode": "ids",
        "labels": [{"label": i, "id": i, "name": f"c{i}"} for i in range(3)],
    }

    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["images"]
    assert [o.name for o in session.get_outputs()] == ["pred_logits", "pred_boxes"]
    for b, (h, w) in zip((1, 3), SIZES):
        x = torch.randn(b, 3, h, w)
        logits, boxes = session.run(None, {"images": x.numpy()})
        with torch.no_grad():
            want = model(x)
        assert logits.shape == (b, 5, 4) and boxes.shape == (b, 5, 4)
        torch.testing.assert_close(torch.from_numpy(logits), want["pred_logits"], atol=1e-4, rtol=0)
        torch.testing.assert_close(torch.from_numpy(boxes), want["pred_boxes"], atol=1e-4, rtol=0)


def test_export_user_errors(tmp_path, capsys):
    _, ckpt = _checkpoint(tmp_path, "none")
    # missing checkpoint, wrong task, output is a folder, unwritable folder: one line, exit 1
    assert main(["export", str(tmp_path / "nope.pth"), str(tmp_path / "a.onnx")]) == 1
    assert "checkpoint not found" in capsys.readouterr().err
    wrong = tmp_path / "video.pth"
    torch.save({"format": CHECKPOINT_FORMAT, "task": "video", "model": {}}, wrong)
    assert main(["export", str(wrong), str(tmp_path / "a.onnx")]) == 1
    assert "wrong model" in capsys.readouterr().err
    assert main(["export", str(ckpt), str(tmp_path)]) == 1
    assert "is a folder" in capsys.readouterr().err
    blocker = tmp_path / "file.txt"
    blocker.write_text("")
    assert main(["export", str(ckpt), str(blocker / "a.onnx")]) == 1
    err = capsys.readouterr().err
    assert "not writable" in err and len(err.strip().splitlines()) == 1
    # an example smaller than two feature cells (tiny backbone: stride 16)
    assert main(["export", str(ckpt), str(tmp_path / "a.onnx"), "--height", "16"]) == 1
    assert "at least 32 pixels" in capsys.readouterr().err
    # bad flag values: argparse, exit 2
    for flags in (["--opset", "9"], ["--height", "8"], ["--width", "abc"]):
        with pytest.raises(SystemExit) as e:
            main(["export", str(ckpt), str(tmp_path / "a.onnx"), *flags])
        assert e.value.code == 2
