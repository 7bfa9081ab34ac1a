"""``--early-stopping-patience N``: the stop after N evaluations without improvement, the best checkpoint."""

from __future__ import annotations

import json

import pytest

from peg_core.engine import UserError, fit, read_checkpoint
from tests.core.test_engine import ToyTask, _args


class Scripted(ToyTask):
    """The toy task whose validation metric ``score`` follows ``scores``, one per evaluation."""

    def __init__(self, scores, monitor="score"):
        super().__init__()
        self.scores, self.monitor = list(scores), monitor

    def setup_train(self, args, ctx, ckpt):
        parts = super().setup_train(args, ctx, ckpt)
        scores = iter(self.scores)
        parts.evaluate = lambda model, ctx: {"score": next(scores)}
        parts.monitor, parts.summary = self.monitor, None
        return parts


def test_stops_after_patience_and_keeps_the_best(tmp_path, capsys):
    # evaluations at epochs 1..: 0.5, 0.7 (best), 0.6, 0.65 -> two without improvement: stop after epoch 4
    report = fit(
        Scripted([0.5, 0.7, 0.6, 0.65, 0.9, 0.9]),
        _args(tmp_path, "--epochs", "6", "--early-stopping-patience", "2"),
    )
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("early stopping")]
    assert len(lines) == 1 and "val score has not improved for 2 evaluations" in lines[0], out
    assert "0.7000 at epoch 2" in lines[0] and "checkpoint_best.pth" in lines[0]
    assert report["status"] == "early_stopped" and report["epochs_done"] == 4
    assert report["best"]["best"] == 0.7 and report["best"]["epoch"] == 1
    best = read_checkpoint(tmp_path / "checkpoint_best.pth", "toy")
    last = read_checkpoint(tmp_path / "checkpoint.pth", "toy")
    assert best["epoch"] == 1 and best["metrics"] == {"score": 0.7} and last["epoch"] == 3
    assert json.loads((tmp_path / "report.json").read_text())["status"] == "early_stopped"
    # a resumed run that had stopped stays stopped
    report = fit(
        Scripted([]), _args(tmp_path, "--epochs", "6", "--early-stopping-patience", "2", "--resume", "auto")
    )
    assert report["status"] == "early_stopped" and "nothing to do" in capsys.readouterr().out


def test_counts_evaluations_with_eval_every_and_resumes_its_count(tmp_path):
    # --eval-every 2: evaluations after epochs 2, 4, 6 -> 0.5, 0.4, 0.3; patience 2 stops after epoch 6 of 8
    report = fit(Scripted([0.5, 0.4, 0.3, 0.2]), _args(tmp_path, "--epochs", "8", "--eval-every", "2",
                                                       "--early-stopping-patience", "2"))  # fmt: skip
    assert report["epochs_done"] == 6 and report["status"] == "early_stopped"
    # a stop mid-way: the count of evaluations without improvement comes back with the checkpoint
    out = tmp_path / "resumed"
    fit(Scripted([0.5, 0.4]), _args(out, "--epochs", "8", "--eval-every", "2", "--early-stopping-patience", "2",
                                    "--stop-after-epoch", "4"))  # fmt: skip
    report = fit(Scripted([0.3, 0.2]), _args(out, "--epochs", "8", "--eval-every", "2",
                                             "--early-stopping-patience", "2", "--resume", "auto"))  # fmt: skip
    assert report["epochs_done"] == 6 and report["status"] == "early_stopped"


@pytest.mark.parametrize(
    ("task", "flags", "message"),
    [
        (Scripted([1.0]), ["--eval-every", "0"], "needs evaluations during training"),
        (Scripted([1.0], monitor=None), [], "needs a validation metric of task 'toy' to watch"),
    ],
)
def test_refusals_name_the_flag(tmp_path, task, flags, message):
    with pytest.raises(UserError) as e:
        fit(task, _args(tmp_path, "--early-stopping-patience", "3", *flags))
    assert message in e.value.what and e.value.where == "--early-stopping-patience 3"
    assert not (tmp_path / "checkpoint.pth").exists()
