"""A package peg_detr needs that is not installed: one line naming the pip install, exit 1, no traceback.

The package is hidden in the test only (``sys.modules[name] = None``: ``import name`` fails as if
it were not installed).
"""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from peg_core.engine.checkpoint import CHECKPOINT_FORMAT
from peg_core.errors import MissingDependency
from peg_detr.__main__ import main
from peg_detr.models import build_detr
from peg_detr.models.matcher import HungarianMatcher
from tests.core.test_optional_deps import _hide, _one_line_error

ROOT = Path(__file__).resolve().parents[2]
SMALL = dict(hidden_dim=32, nheads=2, enc_layers=1, dec_layers=1, dim_feedforward=32)


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
        ("pycocotools", "peg_detr needs pycocotools: pip install pycocotools"),
        ("faster_coco_eval", "peg_detr needs faster_coco_eval: pip install faster-coco-eval"),
    ],
)
def test_coco_evaluation_without_its_package(hidden, line):
    """Imported by the modules at load time: a fresh interpreter, the message names the pip package."""
    code = (
        f"import sys; sys.modules[{hidden!r}] = None\n"
        "try:\n    import peg_detr.evaluation\nexcept ImportError as e:\n    print(e)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == line
