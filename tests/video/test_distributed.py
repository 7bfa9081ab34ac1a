"""Two processes (torchrun, gloo): DDP training runs and its multi-view numbers equal a single-process evaluation."""

import json
import os
import subprocess
import sys

import pytest

from peg_video.__main__ import main
from peg_video.data import SyntheticSpec, make_synthetic_kinetics

pytestmark = pytest.mark.slow


def test_two_process_training_and_evaluation(tmp_path):
    # 5 validation videos over 2 ranks: DistributedSampler pads with a repeated video,
    # which the evaluator must count once.
    make_synthetic_kinetics(
        tmp_path / "d", SyntheticSpec(num_train=8, num_val=5, width=64, height=48, frames=8, seed=4)
    )
    out = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        "-m", "peg_video", "train", "--train-ann", str(tmp_path / "d" / "train.csv"),
        "--val-ann", str(tmp_path / "d" / "val.csv"), "--output-dir", str(out), "--config", "synthetic_tiny",
        "--epochs", "1", "--num-frames", "4", "--batch-size", "2", "--num-clips", "2", "--num-crops", "3",
        "--model-opt", "embed_dim=32", "--model-opt", "depth=1", "--device", "cpu", "--no-progress",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "world size 2" in proc.stdout
    report = json.loads((out / "report.json").read_text())
    distributed = report["eval"]
    assert distributed["num_videos"] == 5 and distributed["num_views"] == 5 * 6
    assert report["steps"] == 2  # 8 videos / 2 ranks / batch 2
    assert report["broken"]["val"] == {"count": 0, "total": 5, "samples": []}

    argv = ["eval", "--checkpoint", str(out / "checkpoint.pth"), "--output-dir", str(tmp_path / "single"),
            "--no-progress", "--workers", "0"]  # fmt: skip
    assert main(argv) == 0
    single = json.loads((tmp_path / "single" / "report.json").read_text())["eval"]
    for key in ("top1", "top5", "mean_class_accuracy", "clip_top1", "num_videos", "num_views"):
        assert distributed[key] == pytest.approx(single[key], abs=1e-6), key
