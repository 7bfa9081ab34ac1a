"""The NaN policy covers the whole step: a NonFiniteError raised in the step or the evaluation and
non-finite weights after an epoch stop the run with the one line and exit 3, keeping the last good
checkpoint (and ``eval`` of unusable weights is one line, exit 1)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from peg_core.__main__ import main as classify_main
from peg_core.engine import (
    EXIT_DIVERGED,
    EXIT_ERROR,
    EvalParts,
    StepOutput,
    TrainParts,
    add_eval_args,
    add_train_args,
    evaluate_checkpoint,
    fit,
    new_parser,
    read_checkpoint,
    run_command,
)
from peg_core.errors import NonFiniteError
from tests.core.classify_runs import keep_threads, tiny  # noqa: F401 (autouse: restores torch's threads)

STEPS_PER_EPOCH = 4  # 32 points, batch 8


class LineTask:
    """A linear fit whose step, optimiser or evaluation can be made to misbehave from a given epoch on.

    ``fault`` is one of ``"step"`` (the step raises NonFiniteError, as the DETR matcher does),
    ``"weights"`` (the last optimiser step of the epoch writes a NaN weight) or ``"evaluate"``.
    """

    name = "line"

    def __init__(self, fault: str | None = None, from_epoch: int = 1) -> None:
        self.fault, self.from_epoch = fault, from_epoch
        self.evaluated: list[int] = []  # the optimiser steps done at each evaluation

    def _model(self) -> nn.Module:
        return nn.Linear(1, 1)

    def _evaluate(self, steps: Callable[[], int]) -> Callable[[nn.Module, object], dict[str, float]]:
        def evaluate(model: nn.Module, ctx: object) -> dict[str, float]:
            self.evaluated.append(steps())
            if self.fault == "evaluate" and steps() > self.from_epoch * STEPS_PER_EPOCH:
                raise NonFiniteError("the model's detections are not finite (image 1: score nan)")
            return {"w": float(model.weight.detach().sum())}

        return evaluate

    def setup_train(self, args, ctx, ckpt) -> TrainParts:
        model = self._model()
        opt = torch.optim.SGD(model.parameters(), lr=args.lr)
        g = torch.Generator().manual_seed(0)
        x = torch.randn(32, 1, generator=g)
        loader = DataLoader(TensorDataset(x, 2 * x + 1), batch_size=8, shuffle=False)
        steps = [0]

        def count(*_: object) -> None:
            steps[0] += 1
            if self.fault == "weights" and steps[0] == (self.from_epoch + 1) * STEPS_PER_EPOCH:
                with torch.no_grad():
                    model.weight.fill_(float("nan"))  # the update of the epoch's last step overflows

        opt.register_step_post_hook(count)

        def step(net: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], ctx: object) -> StepOutput:
            if self.fault == "step" and steps[0] >= self.from_epoch * STEPS_PER_EPOCH:
                raise NonFiniteError("the matching cost has NaN/inf entries (non-finite pred_boxes)")
            xb, yb = batch
            return StepOutput(((net(xb) - yb) ** 2).mean())

        return TrainParts(model, opt, loader, 32, step, evaluate=self._evaluate(lambda: steps[0]))

    def setup_eval(self, args, ctx, ckpt) -> EvalParts:
        model = self._model()
        model.load_state_dict(ckpt["model"])
        return EvalParts(model, self._evaluate(lambda: 10**6))


def _train(task: LineTask, out: Path, *extra: str) -> int:
    p = new_parser("line train")
    add_train_args(p, output_dir="runs/line")
    p.set_defaults(epochs=3, lr=1e-2, workers=0, progress=False)
    return run_command(lambda a: fit(task, p.parse_args(a)), ["--output-dir", str(out), *extra])


def _one_line(capsys: pytest.CaptureFixture) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


def _kept(out: Path) -> str:
    return (
        f"training stopped and the last good checkpoint is {out / 'checkpoint.pth'}: lower the learning "
        "rate or check the data, then resume with --resume auto"
    )


@pytest.mark.parametrize(
    ("fault", "line"),
    [
        (
            "step",
            "error: the matching cost has NaN/inf entries (non-finite pred_boxes) at step 5 (epoch 2); ",
        ),
        ("weights", "error: the weights are not finite at step 8 (epoch 2); "),
        (
            "evaluate",
            "error: the model's detections are not finite (image 1: score nan) in the evaluation "
            "at step 8 (epoch 2); ",
        ),
    ],
)
def test_non_finite_anywhere_in_the_epoch_is_the_nan_stop(tmp_path, capsys, fault, line):
    task = LineTask(fault, from_epoch=1)
    capsys.readouterr()
    assert _train(task, tmp_path) == EXIT_DIVERGED
    assert _one_line(capsys) == line + _kept(tmp_path)
    ckpt = read_checkpoint(tmp_path / "checkpoint.pth", "line")
    assert ckpt["epoch"] == 0 and torch.isfinite(ckpt["model"]["weight"]).all()
    assert task.evaluated == ([4, 8] if fault == "evaluate" else [4])  # NaN weights are never evaluated
    assert "training stopped" in (tmp_path / "log.jsonl").read_text()


def test_weights_that_overflow_in_the_first_epoch_leave_no_checkpoint(tmp_path, capsys):
    assert _train(LineTask("weights", from_epoch=0), tmp_path) == EXIT_DIVERGED
    assert _one_line(capsys).startswith(
        "error: the weights are not finite at step 4 (epoch 1); training stopped and no checkpoint"
    )
    assert not (tmp_path / "checkpoint.pth").exists()


def test_eval_of_weights_with_non_finite_predictions_is_one_line(tmp_path, capsys):
    assert _train(LineTask(), tmp_path, "--epochs", "1") == 0
    p = new_parser("line eval")
    add_eval_args(p)
    argv = ["--checkpoint", str(tmp_path / "checkpoint.pth"), "--no-progress"]
    capsys.readouterr()
    task = LineTask("evaluate", from_epoch=0)
    assert run_command(lambda a: evaluate_checkpoint(task, p.parse_args(a)), argv) == EXIT_ERROR
    assert _one_line(capsys) == (
        "error: the model's detections are not finite (image 1: score nan); the checkpoint's weights are "
        f"not usable: {tmp_path / 'checkpoint.pth'}"
    )


DIVERGED_AT_FIRST_STEP = re.compile(
    r"error: .+ at step 1 \(epoch 1\); training stopped and no checkpoint was written yet: lower the "
    r"learning rate or check the data, then resume with --resume auto"
)


@pytest.mark.slow
def test_classify_diverging_in_its_only_step_stops_before_the_checkpoint(tmp_path, capsys):
    """lr 1e9, one step per epoch: the loss was finite, the update was not; the evaluation's loss is NaN."""
    argv = [
        "train",
        *tiny(32, 8, "--output-dir", str(tmp_path), "--batch-size", "32", "--epochs", "1", "--lr", "1e9"),
    ]
    capsys.readouterr()
    code = classify_main(argv)
    line = _one_line(capsys)
    assert code == EXIT_DIVERGED and DIVERGED_AT_FIRST_STEP.fullmatch(line), line
    assert not (tmp_path / "checkpoint.pth").exists() and not (tmp_path / "report.json").exists()
