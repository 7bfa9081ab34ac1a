"""A video run that diverges in its only step stops with the NaN policy's line (exit 3), before any
checkpoint: the weights after the update are finite but give NaN scores, which the evaluation
used to rank into an accuracy (exit 0, ``top1 0.167``)."""

import re

import pytest

from peg_core.engine import EXIT_DIVERGED
from peg_video.__main__ import main
from tests.video.runs import TINY, synthetic_set

pytestmark = pytest.mark.slow


def test_nan_scores_in_the_evaluation_are_the_nan_stop(tmp_path, capsys):
    data = synthetic_set(tmp_path / "syn", num_train=4, num_val=2, seed=2)
    out = tmp_path / "run"
    argv = ["train", "--train-ann", str(data / "train.csv"), "--val-ann", str(data / "val.csv"),
            "--output-dir", str(out), *TINY, "--batch-size", "4", "--epochs", "1", "--lr", "1e9",
            "--warmup-epochs", "0"]  # fmt: skip
    capsys.readouterr()
    code = main(argv)
    err = capsys.readouterr().err
    assert code == EXIT_DIVERGED and err.count("\n") == 1 and "Traceback" not in err, err
    assert re.fullmatch(
        r"error: .+ at step 1 \(epoch 1\); training stopped and no checkpoint was written yet: lower the "
        r"learning rate or check the data, then resume with --resume auto\n",
        err,
    ), err
    assert not (out / "checkpoint.pth").exists() and not (out / "report.json").exists()
