"""``tools/gpu_check.py --device cpu --quick``: the GPU check's own smoke run, with its JSON checked."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gpu_check_cpu_quick(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    # One intra-op thread: on a shared 2-core machine OpenMP spinning makes tiny ops far slower with 2.
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "gpu_check.py"), "--device", "cpu", "--quick", "--json", str(out)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())

    assert set(result) >= {"env", "correctness", "detr", "video", "peg_vs_copy", "rtdetr", "rtdetr_eval",
                           "seconds", "all_correct"}  # fmt: skip
    assert result["env"]["device"] == "cpu" and result["env"]["quick"] is True

    # Correctness: PEG2d (plain, separable, prefix tokens, 1-row grid) and PEG3d (plain, factorized, T=1).
    checks = result["correctness"]
    assert len(checks) == 6
    assert sum(c["check"].startswith("PEG2d") for c in checks) == 3
    assert sum(c["check"].startswith("PEG3d") for c in checks) == 3
    for c in checks:
        assert c["ok"] is True, c
        for key in ("max_err_out", "max_err_grad_x", "max_err_grad_w"):
            assert 0 <= c[key] < 1e-3, c
    assert result["all_correct"] is True

    # Timings: both DETR encodings and the video model, positive throughput.
    assert {r["model"].split()[-1] for r in result["detr"]} == {"peg", "sine"}
    for r in result["detr"]:
        assert r["img_per_s"] > 0 and r["step_ms"] > 0 and r["compile"] is False
        assert math.isclose(r["img_per_s"] * r["step_ms"] / 1e3, 2, rel_tol=1e-6)  # batch 2 in quick mode
    assert len(result["video"]) == 1 and result["video"][0]["clips_per_s"] > 0

    # PEG vs copy: two 2D shapes, one 3D shape in both variants; every ratio positive and consistent.
    ops = [r["op"] for r in result["peg_vs_copy"]]
    assert sum(o.startswith("PEG2d") for o in ops) == 2 and sum(o.startswith("PEG3d") for o in ops) == 2
    for r in result["peg_vs_copy"]:
        assert r["ratio"] > 0
        assert math.isclose(r["ratio"], r["peg_ms"] / r["copy_ms"], rel_tol=1e-6)

    # RT-DETR: training steps with peg and sincos in AIFI (denoising, VFL), the peg model evaluated at
    # two sizes; on one device its encoder equals the CPU copy exactly.
    assert [r["model"] for r in result["rtdetr"]] == ["RT-DETR-tiny peg", "RT-DETR-tiny sincos"]
    for r in result["rtdetr"]:
        assert r["img_per_s"] > 0 and r["loss"] == "vfl+l1+giou, denoising"
        assert math.isclose(r["img_per_s"] * r["step_ms"] / 1e3, 2, rel_tol=1e-6)
    assert [r["input"] for r in result["rtdetr_eval"]] == ["2x3x64x64", "2x3x96x96"]
    assert all(
        r["ok"] is True and r["enc_rel_err"] == 0.0 and r["img_per_s"] > 0 for r in result["rtdetr_eval"]
    )

    # The classifier: eager in the smoke run (the compiled rows run on the GPU), positive throughput.
    assert [(r["model"], r["compile"]) for r in result["classify"]] == [("CPVT-tiny peg", False)]
    assert result["classify"][0]["img_per_s"] > 0

    # The table is printed last.
    assert proc.stdout.rstrip().splitlines()[-1].startswith("JSON:")
    assert "| check |" in proc.stdout and "| op | peg_ms | copy_ms | ratio |" in proc.stdout


_WITHOUT_OPTIONAL = """
import runpy, sys
for name in ("scipy", "pycocotools", "decord", "pytorchvideo", "av"):
    sys.modules[name] = None  # any import of them now raises ImportError
sys.argv = [sys.argv[1], *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.slow
def test_gpu_check_runs_with_torch_and_torchvision_only(tmp_path: Path) -> None:
    """A GPU image may have only torch and torchvision: every other package is optional."""
    out = tmp_path / "gpu_check.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    script = str(REPO / "tools" / "gpu_check.py")
    proc = subprocess.run(
        [sys.executable, "-c", _WITHOUT_OPTIONAL, script, "--device", "cpu", "--quick", "--json", str(out)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["all_correct"] is True
    assert {r["loss"] for r in result["detr"] + result["rtdetr"]} == {"sum (no scipy)"}
    assert all(r["img_per_s"] > 0 for r in result["detr"]) and result["video"][0]["clips_per_s"] > 0


@pytest.mark.slow
def test_without_a_gpu_it_says_so_in_one_line_and_stops(tmp_path: Path) -> None:
    """No GPU: exit 77 ("skipped") with one line at once, not the full-size models on the CPU for ten minutes."""
    out = tmp_path / "gpu_check.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    script = str(REPO / "tools" / "gpu_check.py")
    for argv in ([], ["--device", "cuda:0", "--quick"]):
        proc = subprocess.run([sys.executable, script, *argv, "--json", str(out)],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
        assert proc.returncode == 77, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert proc.stdout == "" and proc.stderr == (
            "error: no CUDA GPU on this machine (torch.cuda.is_available() is False), nothing was measured "
            "(exit 77: skipped); run it on a GPU, or --device cpu --quick for the CPU smoke run\n"
        )
        assert not out.exists()
    # the CPU runs the smoke run only
    proc = subprocess.run([sys.executable, script, "--device", "cpu", "--json", str(out)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.rstrip().endswith("add --quick") and not out.exists()
