"""``tools/bench_rtdetr.py --small``: same weights in both models, a table with both measurements and ratios."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("transformers")

from tools.bench_rtdetr import main


def test_small_bench_prints_both_measurements(capsys):
    assert main(["--small", "--size", "96", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("small ResNet, 96x96, batch 2, 1 thread(s)")
    for name in ("eval", "eval_fused", "train"):
        row = re.search(rf"^\| {name} \| (\d+\.\d+) \| (\d+\.\d+) \| (\d+\.\d\d)x \|$", out, re.M)
        assert row and float(row.group(3)) > 0  # reported, not asserted: timings vary with load
