"""``--fsdp``: FSDP2 under torchrun equals DDP, and its checkpoint resumes exactly.

Two CPU processes with gloo (as :mod:`tests.test_grad_accum` launches them): the epoch losses and
final weights of a DDP run and of a sharded run with activation checkpointing agree; a sharded run
stopped after its first epoch (with micro-batches, ``--grad-accum-steps 2``) and resumed from its
``checkpoint.pth`` ends where the uninterrupted run ends.  The checkpoint of a sharded run is the
usual one: the same keys and layout as DDP's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from tests.core.classify_runs import one_line_error, tiny


def test_fsdp_without_torchrun_is_one_line(tmp_path, capsys):
    from peg_core.__main__ import main

    argv = ["train", *tiny(8, 4, "--epochs", "1", "--output-dir", str(tmp_path / "run")), "--fsdp"]
    err = one_line_error(capsys, main(argv))
    assert "torchrun" in err and err.endswith(": --fsdp"), err
    assert not (tmp_path / "run" / "checkpoint.pth").exists()


def test_fsdp_refuses_the_weight_ema_in_one_line(tmp_path, capsys):
    from peg_detr.__main__ import main

    argv = ["train", "--config", "rtdetr_demo_tiny", "--data-root", str(tmp_path / "none"),
            "--output-dir", str(tmp_path / "run"), "--device", "cpu", "--fsdp"]  # fmt: skip
    err = one_line_error(capsys, main(argv))
    assert "EMA" in err and err.endswith("--fsdp --ema-decay 0.99"), err


def _train(prewarmed, out, *extra: str, processes: int = 2) -> None:
    """torchrun (its launcher forked from the prewarmed server: ``tests/prewarmed.py``; the workers are
    fresh processes) of a tiny classifier run."""
    argv = tiny(40, 8, "--epochs", "2", "--lr", "1e-3", "--output-dir", str(out), *extra)
    args = ["--standalone", "--nproc_per_node", str(processes), "-m", "peg_core", "train", *argv]
    proc = prewarmed.run(
        "torch.distributed.run", args, cwd=Path.cwd(), env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def _losses(out):
    rows = map(json.loads, (out / "log.jsonl").read_text().splitlines())
    return [r["loss"] for r in rows if r["tag"] == "train"]


def _same_run(a, b, rtol: float) -> None:
    la, lb = _losses(a), _losses(b)
    assert len(la) == len(lb) == 2 and la == pytest.approx(lb, rel=1e-6, abs=1e-7), (la, lb)
    ca = torch.load(a / "checkpoint.pth", weights_only=True)
    cb = torch.load(b / "checkpoint.pth", weights_only=True)
    assert ca["model"].keys() == cb["model"].keys()
    for k in ca["model"]:
        assert torch.allclose(ca["model"][k], cb["model"][k], rtol=rtol, atol=rtol), k
    # the optimizer state in Optimizer.state_dict's layout, whoever wrote it
    ga, gb = ca["optimizer"]["param_groups"], cb["optimizer"]["param_groups"]
    assert [g["params"] for g in ga] == [g["params"] for g in gb]
    for i, state in ca["optimizer"]["state"].items():
        for name, value in state.items():
            assert torch.allclose(value, cb["optimizer"]["state"][i][name], rtol=rtol, atol=rtol), (i, name)


@pytest.mark.slow
def test_fsdp_equals_ddp_and_resumes_exactly(tmp_path, prewarmed):
    _train(prewarmed, tmp_path / "ddp", "--batch-size", "8")  # per process: 20 images, steps of 8, 8 and 4
    _train(prewarmed, tmp_path / "fsdp", "--batch-size", "8", "--fsdp", "--grad-checkpointing")
    _same_run(tmp_path / "ddp", tmp_path / "fsdp", rtol=1e-5)
    report = json.loads((tmp_path / "fsdp" / "report.json").read_text())
    assert report["status"] == "finished" and report["steps"] == 6
    # interrupted after epoch 1 (micro-batches of 4 under --grad-accum-steps 2), resumed from the gathered checkpoint
    resumed = tmp_path / "resumed"
    flags = ("--batch-size", "4", "--grad-accum-steps", "2", "--fsdp")
    _train(prewarmed, resumed, *flags, "--stop-after-epoch", "1")
    assert json.loads((resumed / "report.json").read_text())["status"] == "stopped"
    _train(prewarmed, resumed, *flags, "--resume", "auto")
    _train(prewarmed, tmp_path / "whole", *flags)
    _same_run(tmp_path / "whole", resumed, rtol=0.0)  # exact
    _same_run(tmp_path / "ddp", resumed, rtol=1e-5)  # accumulation under FSDP2 equals the large batch
