"""A diverging DETR / RT-DETR run stops with the NaN policy's one line (exit 3), not in the matcher.

A learning rate of 1e6 gives NaN/inf predictions at the second step; the Hungarian matcher finds
them first (its cost is not finite), raises :class:`~peg_core.errors.NonFiniteError`, and the
engine turns that into ``TrainingDiverged``.  After a good epoch, poisoned predictions stop the
resumed run with the checkpoint of that epoch untouched.  NaN detections in the evaluation are
the same stop.
"""

from __future__ import annotations

import re

import pytest
import torch
from pycocotools.coco import COCO

import peg_detr.task
from peg_core.engine import EXIT_DIVERGED
from peg_core.errors import NonFiniteError
from peg_detr.__main__ import main as cli
from peg_detr.evaluation import CocoEvaluator
from peg_detr.models import HungarianMatcher

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread_module")]

DIVERGED = re.compile(
    r"error: the matching cost has NaN/inf entries \(non-finite pred_logits or pred_boxes\) at step \d+ "
    r"\(epoch \d+\); training stopped and (no checkpoint was written yet|the last good checkpoint is \S+): "
    r"lower the learning rate or check the data, then resume with --resume auto"
)


COCO_SET = dict(num_val=2)  # the module's ``data`` (tests/conftest.py)


def _argv(arch: str, data, out, *extra: str) -> list[str]:
    common = ["--data-root", str(data), "--output-dir", str(out), "--total-batch-size", "4",
              "--workers", "0", "--no-progress", "--seed", "7", *extra]  # fmt: skip
    if arch == "rtdetr":
        return ["train", "--config", "rtdetr_demo_tiny", "--val-size", "64", *common]
    return ["train", "--backbone", "tiny", "--pos-enc", "peg", "--hidden-dim", "32", "--num-heads", "2",
            "--enc-layers", "1", "--dec-layers", "2", "--dim-feedforward", "64", "--num-queries", "6",
            "--train-sizes", "64", "--max-size", "96", "--crop-resize", "64", "--crop-size", "40,64",
            "--val-size", "64", *common]  # fmt: skip


def _one_line(capsys: pytest.CaptureFixture) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


@pytest.mark.parametrize("arch", ["detr", "rtdetr"])
def test_a_huge_learning_rate_is_the_nan_stop(arch, data, tmp_path, capsys):
    capsys.readouterr()
    code = cli(_argv(arch, data, tmp_path, "--epochs", "2", "--lr", "1e6", "--lr-backbone", "1e6"))
    line = _one_line(capsys)
    assert code == EXIT_DIVERGED and DIVERGED.fullmatch(line), line
    assert not (tmp_path / "report.json").exists()


@pytest.mark.parametrize("arch", ["detr", "rtdetr"])
def test_nan_predictions_after_a_good_epoch_keep_its_checkpoint(arch, data, tmp_path, monkeypatch, capsys):
    assert (
        cli(_argv(arch, data, tmp_path, "--epochs", "2", "--stop-after-epoch", "1", "--eval-every", "0")) == 0
    )
    before = (tmp_path / "checkpoint.pth").read_bytes()
    real = peg_detr.task.to_float

    def poisoned(outputs):  # the step's predictions (what the criterion and its matcher see)
        out = real(outputs)
        return {**out, "pred_boxes": out["pred_boxes"] * float("nan")}

    monkeypatch.setattr(peg_detr.task, "to_float", poisoned)
    capsys.readouterr()
    assert cli(_argv(arch, data, tmp_path, "--epochs", "2", "--resume", "auto")) == EXIT_DIVERGED
    line = _one_line(capsys)
    assert DIVERGED.fullmatch(line) and " at step 3 (epoch 2); " in line, line
    assert f"the last good checkpoint is {tmp_path / 'checkpoint.pth'}:" in line
    assert (tmp_path / "checkpoint.pth").read_bytes() == before


def test_the_matcher_and_the_evaluator_raise_non_finite_errors(data):
    logits, boxes = torch.zeros(1, 3, 4), torch.full((1, 3, 4), 0.5)
    boxes[0, 1, 0] = float("inf")
    targets = [{"labels": torch.tensor([1]), "boxes": torch.tensor([[0.5, 0.5, 0.2, 0.2]])}]
    with pytest.raises(NonFiniteError, match=r"^the matching cost has NaN/inf entries"):
        HungarianMatcher()({"pred_logits": logits, "pred_boxes": boxes}, targets)

    evaluator = CocoEvaluator(COCO(str(data / "annotations" / "instances_val2017.json")))
    image_id = evaluator.coco_gt.getImgIds()[0]
    nan = torch.tensor([float("nan")])
    evaluator.update({image_id: {"scores": nan, "labels": torch.tensor([1]), "boxes": torch.ones(1, 4)}})
    with pytest.raises(
        NonFiniteError, match=rf"^the model's detections are not finite \(image {image_id}: score nan"
    ):
        evaluator.summarize(verbose=False)
