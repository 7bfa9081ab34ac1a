"""Training is a function of the seed, not of ``--workers``: per-step losses with 0 and 2 workers are equal.

Augmentation draws are functions of (seed, epoch, index) (DETR / RT-DETR transforms and RT-DETR's
per-batch side, video clips, crops and mixes); the model's own draws (dropout, RT-DETR's denoising
queries) come from the main process's generator, which the loader no longer touches.  The losses
are recorded at every step through the engine's one reduction of the logged values.
"""

from __future__ import annotations

import pytest
import torch

import peg_core.engine.trainer as trainer
from peg_detr.cli import train as detr_train
from peg_video.__main__ import main as video_main
from tests.video.runs import TINY, synthetic_set

pytestmark = pytest.mark.slow


@pytest.fixture
def losses(monkeypatch):
    """Every training step's loss (the rank mean the engine checks for NaN), in order."""
    seen: list[float] = []
    reduce = trainer.reduce_mean

    def recording(values):
        out = reduce(values)
        if (
            values.dim() == 1
        ):  # the step's logged values (the loss first); a 0-dim one is the epoch's weights check
            seen.append(float(out[0]))
        return out

    monkeypatch.setattr(trainer, "reduce_mean", recording)
    return seen


#: the module's ``coco`` (tests/conftest.py): 16 + 4 images of 1-3 shapes
COCO_SET = dict(max_objects=3, min_frac=0.2, max_frac=0.45, num_train=16, seed=3)


DETR = ["--config", "demo_tiny", "--train-sizes", "48,56,64", "--max-size", "80", "--val-size", "64"]
RTDETR = ["--config", "rtdetr_demo_tiny", "--train-sizes", "48,64", "--val-size", "64"]


@pytest.mark.parametrize("recipe", [DETR, RTDETR], ids=["detr", "rtdetr"])
def test_detection_losses_do_not_depend_on_workers(recipe, coco, tmp_path, losses):
    runs = []
    for workers in (0, 2):
        losses.clear()
        detr_train([
            *recipe, "--data-root", str(coco), "--output-dir", str(tmp_path / f"w{workers}"),
            "--epochs", "2", "--total-batch-size", "4", "--workers", str(workers), "--seed", "5",
            "--eval-every", "0", "--no-progress", "--threads", "1",
        ])  # fmt: skip
        runs.append(list(losses))
    assert len(runs[0]) == 8 and all(torch.isfinite(torch.tensor(runs[0])))
    assert runs[0] == runs[1]  # bit for bit, from the first step to the last


def test_video_losses_do_not_depend_on_workers(tmp_path, losses):
    data = synthetic_set(tmp_path / "syn", num_train=8, num_val=4, seed=4)
    runs = []
    for workers in (0, 2):
        losses.clear()
        assert video_main([
            "train", "--train-ann", str(data / "train.csv"), "--val-ann", str(data / "val.csv"),
            "--output-dir", str(tmp_path / f"w{workers}"), *TINY, "--workers", str(workers),
            "--epochs", "2", "--eval-every", "0", "--mixup", "0.8", "--cutmix", "1.0", "--seed", "5",
        ]) == 0  # fmt: skip
        runs.append(list(losses))
    assert len(runs[0]) == 4 and runs[0] == runs[1]
