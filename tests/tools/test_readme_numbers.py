"""tools.readme_numbers: the README's demo table is rendered from, and checked against, summary.json."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tools.readme_numbers import README, TOLERANCE, check, read_numbers, render_table, replace_table

REPO = Path(__file__).resolve().parents[2]
SUMMARY = {
    "classify": {"top1": 0.99609375, "train_size": 48, "seconds": 119.2,
                 "top1_by_size": {"36": 0.912109375, "48": 0.99609375, "72": 0.826171875, "96": 0.564453125}},
    "detect": {"ap": 0.3183, "ap50": 0.7159, "seconds": 281.0,
               "ap_by_size": {"60": 0.2, "80": 0.3183, "100": 0.1},
               "ap50_by_size": {"60": 0.353, "80": 0.7159, "100": 0.19}},
    "video": {"top1": 1.0, "top5": 1.0, "top1_long_clip": 1.0, "videos_evaluated": 60, "skipped": 0,
              "seconds": 129.0},
    "seconds": 530.0,
}  # fmt: skip


def _readme(summary=SUMMARY) -> str:
    return "intro\n<!-- demo-table:start -->\n" + render_table(summary) + "\n<!-- demo-table:end -->\nrest\n"


def test_render_quotes_every_headline_number():
    numbers = read_numbers(render_table(SUMMARY))
    assert numbers[("classify", "top-1")] == 0.996
    assert numbers[("classify", "36 px")] == 0.912 and numbers[("classify", "96 px")] == 0.564
    assert ("classify", "48 px") not in numbers  # the training size is the headline itself
    assert numbers[("detect", "AP")] == 0.318 and numbers[("detect", "AP50")] == 0.716
    assert numbers[("detect", "60 px AP50")] == 0.353 and numbers[("detect", "100 px AP50")] == 0.19
    assert numbers[("video", "top-1 at 12 frames")] == 1.0
    assert len(numbers) == 11


def test_check_accepts_the_tolerance_and_names_a_stale_number():
    assert check(_readme(), SUMMARY) == []
    nudged = json.loads(json.dumps(SUMMARY))
    nudged["classify"]["top1_by_size"]["96"] += TOLERANCE / 2  # last-digit CPU noise
    assert check(_readme(), nudged) == []
    stale = json.loads(json.dumps(SUMMARY))
    stale["classify"]["top1_by_size"]["96"] = 0.617
    assert check(_readme(), stale) == [f"classify 96 px: README 0.564, demo 0.617 (tolerance {TOLERANCE})"]


def test_check_names_missing_numbers_and_block():
    text = _readme().replace("top-5 1.000, ", "")
    assert check(text, SUMMARY) == ["the demo gives video top-5 but README does not quote it"]
    with pytest.raises(ValueError, match="no <!-- demo-table:start -->"):
        check("no table here", SUMMARY)


def test_write_then_check_round_trip(tmp_path):
    readme, summary = tmp_path / "README.md", tmp_path / "summary.json"
    stale = json.loads(json.dumps(SUMMARY))
    stale["detect"]["ap"] = 0.5
    readme.write_text(_readme(stale))
    summary.write_text(json.dumps(SUMMARY))
    cmd = [sys.executable, "-m", "tools.readme_numbers", "--summary", str(summary), "--readme", str(readme)]
    failed = subprocess.run([*cmd, "--check"], cwd=REPO, capture_output=True, text=True)
    assert failed.returncode == 1
    assert (
        failed.stderr.strip()
        == "error: README demo table is stale: detect AP: README 0.500, demo 0.318 (tolerance 0.01)"
    )
    assert subprocess.run([*cmd, "--write"], cwd=REPO, capture_output=True).returncode == 0
    assert readme.read_text() == replace_table(_readme(stale), SUMMARY) and readme.read_text().endswith(
        "rest\n"
    )
    assert subprocess.run([*cmd, "--check"], cwd=REPO, capture_output=True).returncode == 0


RTDETR = {"ap": 0.21, "ap50": 0.45, "size": 80, "seconds": 22.4,
          "ap_by_size": {"60": 0.1, "80": 0.21, "120": 0.15, "160": 0.05},
          "ap50_by_size": {"60": 0.3, "80": 0.45, "120": 0.35, "160": 0.125}}  # fmt: skip


def _with_rtdetr() -> dict:
    summary = json.loads(json.dumps(SUMMARY))
    summary["detect"]["rtdetr"] = RTDETR
    return summary


def test_the_readme_has_the_block_with_every_number():
    """The README's block quotes what today's demo gives: the four parts, the RT-DETR-PEG line included."""
    start, end = (
        README.read_text().index("<!-- demo-table:start -->"),
        README.read_text().index("<!-- demo-table:end -->"),
    )
    quoted = read_numbers(README.read_text()[start:end])
    assert set(quoted) == set(read_numbers(render_table(_with_rtdetr())))


def test_the_rtdetr_line_of_the_detect_part_is_rendered_and_checked():
    summary = _with_rtdetr()
    table = render_table(summary)
    row = table.splitlines()[4]
    assert row.startswith("| detect-rtdetr | RT-DETR-PEG") and row.endswith(", 22 s |")
    numbers = read_numbers(table)
    assert numbers[("detect-rtdetr", "AP")] == 0.21 and numbers[("detect-rtdetr", "AP50")] == 0.45
    assert (
        numbers[("detect-rtdetr", "160 px AP50")] == 0.125 and ("detect-rtdetr", "80 px AP50") not in numbers
    )
    assert numbers[("detect", "AP")] == 0.318  # DETR's own numbers are still the detect row's
    # a README without the line is stale for a summary with it (the lead regenerates it with --write)
    assert sorted(check(_readme(), summary)) == [
        f"the demo gives detect-rtdetr {label} but README does not quote it"
        for label in ("120 px AP50", "160 px AP50", "60 px AP50", "AP", "AP50")
    ]
    assert check(_readme(summary), summary) == [] and render_table(SUMMARY) in _readme()
