"""A package peg_detr needs that is not installed: one line naming the pip install, exit 1, no traceback.

The package is hidden in the test only (``sys.modules[name] = None``: ``import name`` fails as if
it were not installed).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from peg_core.engine.checkpoint import CHECKPOINT_FORMAT
from peg_core.errors import MissingDependency
from peg_detr.__main__ import main
from peg_detr.models import build_detr
from peg_detr.models.matcher import HungarianMatcher
from tests.core.test_optional_deps import _hide, _one_line_error, run_module

SMALL = dict(hidden_dim=32, num_heads=2, enc_layers=1, dec_layers=1, dim_feedforward=32)


def _checkpoint(tmp_path: Path, pos_enc: str) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, _, _ = build_detr("tiny", pos_enc, num_classes=2, num_queries=3, **SMALL)
    path = tmp_path / f"{pos_enc}.pth"
    torch.save({"format": CHECKPOINT_FORMAT, "task": "detect", "model": model.state_dict(),
                "model_config": model.build_config}, path)  # fmt: skip
    return path


def test_export_without_onnx(tmp_path, monkeypatch, capsys):
    ckpt = _checkpoint(tmp_path, "none")
    _hide(monkeypatch, "onnx")
    code = main(["export", str(ckpt), str(tmp_path / "detr.onnx"), "--height", "64", "--width", "64"])
    assert _one_line_error(capsys, code) == "error: export needs onnx: pip install 'peg-core[onnx]'"
    assert not (tmp_path / "detr.onnx").exists()


def test_export_hf_without_safetensors_writes_nothing(tmp_path, monkeypatch, capsys):
    ckpt = _checkpoint(tmp_path, "sine")
    _hide(monkeypatch, "safetensors")
    code = main(["export-hf", str(ckpt), str(tmp_path / "hf")])
    assert _one_line_error(capsys, code) == "error: export-hf needs safetensors: pip install 'peg-detr[hf]'"
    assert not (tmp_path / "hf").exists()


def test_matching_without_scipy(monkeypatch):
    outputs = {"pred_logits": torch.zeros(1, 3, 3), "pred_boxes": torch.full((1, 3, 4), 0.5)}
    targets = [{"labels": torch.tensor([1]), "boxes": torch.tensor([[0.5, 0.5, 0.2, 0.2]])}]
    _hide(monkeypatch, "scipy")
    with pytest.raises(MissingDependency, match=r"^matching needs scipy: pip install scipy$"):
        HungarianMatcher()(outputs, targets)


@pytest.mark.parametrize(
    "hidden,line",
    [
        ("pycocotools", "error: peg_detr needs pycocotools: pip install pycocotools"),
        ("faster_coco_eval", "error: peg_detr needs faster_coco_eval: pip install faster-coco-eval"),
    ],
)
def test_command_line_without_a_coco_package(hidden, line):
    """Imported when the command line loads: a fresh interpreter; one line, exit 1, no traceback."""
    done = run_module("peg_detr", ["eval", "--checkpoint", "c.pth"], hide=hidden)
    assert (done.returncode, done.stderr) == (1, line + "\n")
