"""``python -m tools.demo --quick``: what ``make demo`` runs, as a seconds-long smoke run with its summary checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tools import readme_numbers
from tools.demo import CPU_PATH_VARIABLES
from tools.demo_spread import PATHS

REPO = Path(__file__).resolve().parents[2]


def _quick_demo(out: Path, cwd: Path, path: str = "default") -> tuple[subprocess.CompletedProcess, dict]:
    """``tools.demo --quick`` in a process of its own under CPU path ``path`` (tools.demo_spread's PATHS)."""
    env = {k: v for k, v in os.environ.items() if k not in CPU_PATH_VARIABLES}
    env |= {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **PATHS[path]}
    proc = subprocess.run(
        [sys.executable, "-m", "tools.demo", "--quick", "--out", str(out)],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads((out / "summary.json").read_text())


@pytest.fixture(scope="module")
def default_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict, Path]:
    """The quick demo on the machine's own CPU path and its folder (shared by the tests below)."""
    tmp = tmp_path_factory.mktemp("demo")
    return *_quick_demo(tmp / "demo", tmp), tmp / "demo"


@pytest.mark.slow
def test_demo_quick_writes_summary(default_run) -> None:
    proc, summary, _ = default_run

    assert set(summary) == {"classify", "detect", "video", "seconds", "seed", "cpu"}
    assert summary["seed"] == 0 and summary["cpu"] == {"capability": torch.backends.cpu.get_cpu_capability()}
    assert summary["seconds"] >= sum(summary[p]["seconds"] for p in ("classify", "detect", "video")) - 1.0
    for part, keys in (("classify", ("top1",)), ("detect", ("ap", "ap50")), ("video", ("top1", "top5"))):
        for key in keys:
            assert 0.0 <= summary[part][key] <= 1.0, (part, key, summary[part])
    # top-5 can never be below top-1; AP50 never below AP.
    assert summary["video"]["top5"] >= summary["video"]["top1"]
    assert summary["detect"]["ap50"] >= summary["detect"]["ap"]
    # The detect part's RT-DETR-PEG, D-FINE-PEG and DEIMv2-PEG lines: evaluated at 0.75x, 1x, 1.5x and 2x
    # of their 48 px training size.
    for key in ("rtdetr", "dfine", "deimv2"):
        line = summary["detect"][key]
        assert 0.0 <= line["ap"] <= line["ap50"] <= 1.0 and line["size"] == 48, key
        assert (
            list(line["ap50_by_size"]) == ["36", "48", "72", "96"]
            and line["ap50"] == line["ap50_by_size"]["48"]
        )
    # The classifier is evaluated at 0.75x..2x its training size with the same weights.
    assert len(summary["classify"]["top1_by_size"]) == 4

    # The headline numbers are printed last, one line per part (detect's RT-DETR family lines under it), then the total.
    tail = proc.stdout.rstrip().splitlines()[-7:]
    assert [line.split()[0] for line in tail] == [
        "classify",
        "detect",
        "rtdetr",
        "dfine",
        "deimv2",
        "video",
        "total",
    ]


@pytest.mark.slow
def test_detect_part_is_peg_detrs_quick_demo(default_run) -> None:
    """The detect part is ``peg_detr.demo.run_demo(quick=True)``: DETR-PEG's summary at its 48 px training
    size and 0.75x / 1.25x of it, its checkpoint under ``detect/train``."""
    _, summary, out = default_run
    detect = summary["detect"]
    assert set(detect) >= {"ap", "ap50", "ap_by_size", "ap50_by_size", "seconds"}
    assert set(detect["ap_by_size"]) == {"36", "48", "60"}
    assert all(-1.0 <= v <= 1.0 for v in detect["ap_by_size"].values())
    assert detect["ap50"] == detect["ap50_by_size"]["48"]
    assert (out / "detect" / "train" / "checkpoint.pth").is_file()


@pytest.mark.slow
def test_demo_fast_path_under_two_cpu_capabilities(default_run, tmp_path: Path) -> None:
    """The AVX2 kernels (what a machine without AVX-512 runs) and the machine's own both run the demo.

    The two paths may round differently (that is why the README quotes bars with a margin, not
    exact values), but each gives a whole, well-formed summary and records the path it ran.
    """
    runs = {"default": default_run[1], "avx2": _quick_demo(tmp_path / "avx2", tmp_path, "avx2")[1]}
    assert runs["avx2"]["cpu"] == {"capability": "AVX2", **PATHS["avx2"]}
    assert runs["default"]["cpu"]["capability"] == torch.backends.cpu.get_cpu_capability()
    for summary in runs.values():
        metrics = readme_numbers.metrics(summary)
        assert len(metrics) == 26 and all(0.0 <= v <= 1.0 for v in metrics.values()), metrics
