"""DEIM's flat-cosine learning-rate schedule (``--lr-schedule flatcosine``) and its flags."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from peg_core.engine import UserError
from peg_detr.cli import parse_train_args
from peg_detr.task import _rtdetr_optimization, flat_cosine_lr, warmup_step_lr


def test_flat_cosine_by_hand():
    # warm-up 4 steps (quadratic), flat to step 10, cosine to 0.5 at step 30 (40 steps, last 10 unaugmented)
    f = flat_cosine_lr(4, 10, 40, 10, 0.5)
    assert [f(s) for s in (0, 1, 2, 4)] == [0.0, 1 / 16, 1 / 4, 1.0]
    assert f(5) == f(10) == 1.0
    assert f(20) == pytest.approx(0.5 + 0.5 * 0.5 * (1 + math.cos(math.pi * 0.5)))  # half way: 0.75
    assert f(29) == pytest.approx(0.5 + 0.25 * (1 + math.cos(math.pi * 19 / 20)))
    assert f(30) == f(39) == f(100) == 0.5
    # monotone non-increasing after the warm-up
    values = [f(s) for s in range(4, 40)]
    assert all(a >= b for a, b in itertools.pairwise(values))


def test_flat_cosine_without_warmup_or_decay_window():
    f = flat_cosine_lr(0, 0, 10, 10, 0.25)  # the whole run is the unaugmented tail: gamma from the start
    assert f(0) == 1.0 and f(1) == 0.25
    g = flat_cosine_lr(0, 0, 10, 0, 0.0)  # cosine from 1 to 0 over 10 steps
    assert g(5) == pytest.approx(0.5) and g(10) == 0.0


def _args(tmp_path, *extra):
    return parse_train_args(["--config", "rtdetr_demo_tiny", "--data-root", str(tmp_path), *extra])


def test_optimizer_follows_the_flag(tmp_path):
    model = torch.nn.Linear(2, 2)
    args = _args(tmp_path, "--lr-schedule", "flatcosine", "--epochs", "4", "--flat-epochs", "1",
                 "--no-aug-epochs", "1", "--lr-gamma", "0.5", "--warmup-steps", "2", "--ema-decay", "0")  # fmt: skip
    _, opt, sched = _rtdetr_optimization(model, args, steps_per_epoch=5)
    want = flat_cosine_lr(2, 5, 20, 5, 0.5)
    lrs = []
    for _ in range(20):
        lrs.append(opt.param_groups[0]["lr"] / args.lr)
        opt.step()
        sched.step()
    assert lrs == pytest.approx([want(s) for s in range(20)])
    step = _args(tmp_path, "--ema-decay", "0")  # the default stays RT-DETR's step schedule
    _, opt, sched = _rtdetr_optimization(model, step, steps_per_epoch=5)
    assert opt.param_groups[0]["lr"] == pytest.approx(
        step.lr * warmup_step_lr(step.warmup_steps, 5 * step.lr_drop)(0)
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--lr-gamma", "0.5"], "applies to --lr-schedule flatcosine only"),
        (["--flat-epochs", "3"], "applies to --lr-schedule flatcosine only"),
    ],
)
def test_flat_cosine_flags_without_the_schedule_are_refused(tmp_path, argv, message):
    with pytest.raises(UserError, match=message):
        _args(tmp_path, *argv)


def test_detr_refuses_the_schedule(tmp_path):
    with pytest.raises(UserError, match="applies to the RT-DETR family only"):
        parse_train_args(["--data-root", str(tmp_path), "--lr-schedule", "flatcosine"])
