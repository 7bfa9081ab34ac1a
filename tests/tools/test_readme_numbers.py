"""tools.readme_numbers: the README's demo table quotes ranges over several demo summaries, and checks a run against them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tools.readme_numbers import DASH, README, check, metrics, read_numbers, render_table, replace_table, span

REPO = Path(__file__).resolve().parents[2]
RTDETR = {"ap": 0.21, "ap50": 0.45, "size": 80, "seconds": 22.4,
          "ap_by_size": {"60": 0.1, "80": 0.21, "120": 0.15, "160": 0.05},
          "ap50_by_size": {"60": 0.3, "80": 0.45, "120": 0.35, "160": 0.125}}  # fmt: skip
SUMMARY = {
    "classify": {"top1": 0.99609375, "train_size": 48, "seconds": 119.2,
                 "top1_by_size": {"36": 0.912109375, "48": 0.99609375, "72": 0.826171875, "96": 0.564453125}},
    "detect": {"ap": 0.3183, "ap50": 0.7159, "seconds": 281.0,
               "ap_by_size": {"60": 0.2, "80": 0.3183, "100": 0.1},
               "ap50_by_size": {"60": 0.353, "80": 0.7159, "100": 0.19}, "rtdetr": RTDETR},
    "video": {"top1": 1.0, "top5": 1.0, "top1_long_clip": 1.0, "videos_evaluated": 60, "skipped": 0,
              "seconds": 129.0},
    "seconds": 530.0,
}  # fmt: skip


def _other(**changes: float) -> dict:
    """SUMMARY with ``classify.top1_by_size.96`` and friends changed: ``_other(c96=0.61)``."""
    out = json.loads(json.dumps(SUMMARY))
    for key, value in changes.items():
        {"c96": out["classify"]["top1_by_size"], "dap": out["detect"]}[key[:3]][
            key[1:] if key[0] == "c" else "ap"
        ] = value
    return out


def _readme(summaries) -> str:
    return (
        "intro\n<!-- demo-table:start -->\n" + render_table(summaries) + "\n<!-- demo-table:end -->\nrest\n"
    )


def test_span_rounds_outwards_to_two_decimals():
    assert span([0.912, 0.967]) == (0.91, 0.97)
    assert span([0.35, 0.35]) == (0.35, 0.35)  # already on a step: not widened by float noise
    assert span([1.0, 0.99609375]) == (0.99, 1.0)
    with pytest.raises(ValueError, match="finite"):
        span([0.5, float("nan")])


def test_one_summary_quotes_every_metric_and_the_row_layout():
    table = render_table(SUMMARY)
    rows = table.splitlines()
    assert rows[2] == (
        "| classify | CPVT-PEG, generated shapes, trained at 48 px | top-1 0.99" + DASH + "1.00 "
        "(36 px 0.91" + DASH + "0.92, 72 px 0.82" + DASH + "0.83, 96 px 0.56" + DASH + "0.57), 119 s |"
    )
    assert rows[5].endswith("(60 videos, 0 skipped), 129 s |") and "top-1 1.00, top-5 1.00" in rows[5]
    numbers = read_numbers(table)
    assert numbers[("classify", "top-1")] == (0.99, 1.0) and ("classify", "48 px") not in numbers
    assert numbers[("detect", "60 px AP50")] == (0.35, 0.36) and numbers[("detect", "100 px AP50")] == (
        0.19,
        0.19,
    )
    assert numbers[("detect-rtdetr", "160 px AP50")] == (0.12, 0.13)
    assert numbers[("video", "top-1 at 12 frames")] == (1.0, 1.0)
    assert set(numbers) == set(metrics(SUMMARY)) and len(numbers) == 16


def test_several_summaries_quote_the_range_they_span():
    low, high = _other(c96=0.40), _other(c96=0.61, dap=0.25)
    numbers = read_numbers(render_table([SUMMARY, low, high]))
    assert numbers[("classify", "96 px")] == (0.40, 0.61)
    assert numbers[("detect", "AP")] == (0.25, 0.32)
    assert numbers[("classify", "top-1")] == (0.99, 1.0)  # the same in all three
    fast, slow = json.loads(json.dumps(SUMMARY)), json.loads(json.dumps(SUMMARY))
    slow["classify"]["seconds"] = 140.4
    assert render_table([fast, slow]).splitlines()[2].endswith(", 119" + DASH + "140 s |")


def test_check_accepts_a_run_inside_the_ranges_and_names_one_outside():
    text = _readme([SUMMARY, _other(c96=0.40)])
    assert check(text, SUMMARY) == [] and check(text, _other(c96=0.41)) == []
    assert check(text, _other(c96=0.58)) == [
        "classify 96 px: the demo gives 0.580, outside the README's 0.40" + DASH + "0.57"
    ]
    assert check(_readme(SUMMARY), _other(dap=0.3)) == [
        "detect AP: the demo gives 0.300, outside the README's 0.31" + DASH + "0.32"
    ]


def test_check_names_missing_numbers_and_block():
    text = _readme(SUMMARY).replace("top-5 1.00, ", "")
    assert check(text, SUMMARY) == ["the demo gives video top-5 but README does not quote it"]
    older = json.loads(json.dumps(SUMMARY))
    del older["detect"]["rtdetr"]
    assert check(_readme(older), SUMMARY) == [
        f"the demo gives detect-rtdetr {label} but README does not quote it"
        for label in ("120 px AP50", "160 px AP50", "60 px AP50", "AP", "AP50")
    ]
    with pytest.raises(ValueError, match="no <!-- demo-table:start -->"):
        check("no table here", SUMMARY)
    with pytest.raises(ValueError, match="not quote the same metrics"):
        render_table([SUMMARY, older])


def test_write_then_check_round_trip(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(_readme(_other(dap=0.5)))
    files = []
    for i, summary in enumerate([SUMMARY, _other(c96=0.40)]):
        files.append(tmp_path / f"s{i}.json")
        files[-1].write_text(json.dumps(summary))
    cmd = [sys.executable, "-m", "tools.readme_numbers", "--readme", str(readme)]
    failed = subprocess.run(
        [*cmd, "--summary", str(files[0]), "--check"], cwd=REPO, capture_output=True, text=True
    )
    assert failed.returncode == 1
    assert failed.stderr.strip() == (
        "error: README demo table: detect AP: the demo gives 0.318, outside the README's 0.50"
    )
    wrote = subprocess.run([*cmd, "--summary", *map(str, files), "--write"], cwd=REPO, capture_output=True)
    assert wrote.returncode == 0
    assert readme.read_text() == replace_table(_readme(SUMMARY), [SUMMARY, _other(c96=0.40)])
    assert readme.read_text().endswith("rest\n")
    for f in files:
        assert (
            subprocess.run([*cmd, "--summary", str(f), "--check"], cwd=REPO, capture_output=True).returncode
            == 0
        )
    two = subprocess.run(
        [*cmd, "--summary", *map(str, files), "--check"], cwd=REPO, capture_output=True, text=True
    )
    assert two.returncode == 2 and two.stderr.strip() == "error: --check takes one summary: --summary"
    files[0].write_text("{")
    bad = subprocess.run(
        [*cmd, "--summary", str(files[0]), "--check"], cwd=REPO, capture_output=True, text=True
    )
    assert bad.returncode == 1 and bad.stderr.startswith("error: cannot compare the README with the demo: ")
    assert bad.stderr.strip().endswith(str(files[0])) and len(bad.stderr.strip().splitlines()) == 1


def test_the_readme_has_the_block_with_every_number():
    """The README's block quotes ranges for every metric today's demo gives, the RT-DETR-PEG line included."""
    text = README.read_text()
    start, end = text.index("<!-- demo-table:start -->"), text.index("<!-- demo-table:end -->")
    quoted = read_numbers(text[start:end])
    assert set(quoted) == set(metrics(SUMMARY))
    assert all(0.0 <= lo <= hi <= 1.0 for lo, hi in quoted.values())
