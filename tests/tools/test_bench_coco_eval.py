"""``tools/bench_coco_eval.py --quick``: both backends run on the same data, equal stats, a printed ratio."""

from __future__ import annotations

import re

from tools.bench_coco_eval import main


def test_quick_mode_prints_table_and_equal_stats(capsys):
    assert main(["--quick", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("200 images, ")
    assert re.search(r"^\| pycocotools \| \d+\.\d\d \| 1\.0x \| \d+\.\d\d \| 1\.0x \|$", out, re.M)
    ratio = re.search(
        r"^\| faster-coco-eval \| \d+\.\d\d \| (\d+\.\d)x \| \d+\.\d\d \| \d+\.\dx \|$", out, re.M
    )
    assert ratio and float(ratio.group(1)) > 0  # reported, not asserted: timings vary with load
    diff = re.search(r"max \|stat difference\| (\S+)$", out, re.M)
    assert diff and float(diff.group(1)) <= 1e-9
