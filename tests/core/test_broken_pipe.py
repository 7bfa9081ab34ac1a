"""A reader that leaves early (`... | head -n 1`) ends the command quietly, without a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("package", ["peg_core", "peg_detr", "peg_video"])
def test_configs_into_a_closed_pipe(package):
    proc = subprocess.run(
        f"{sys.executable} -m {package} configs | head -n 1", shell=True, cwd=REPO,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.stdout.count("\n") == 1
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr
