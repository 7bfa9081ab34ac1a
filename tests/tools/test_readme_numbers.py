"""tools.readme_numbers: the README's demo table quotes a bar per metric over several demo summaries, and checks a run against them."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest

from tools.readme_numbers import (
    DASH,
    GE,
    README,
    bar,
    bars,
    check,
    metrics,
    read_bars,
    render_table,
    replace_table,
)

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
#: the table of SUMMARY in the README's former format (ranges rounded outwards to two decimals)
OLD_TABLE = f"""| part | data | headline |
|---|---|---|
| classify | CPVT-PEG, generated shapes, trained at 48 px | top-1 0.99{DASH}1.00 (36 px 0.93{DASH}0.99, 72 px 0.74{DASH}0.84, 96 px 0.45{DASH}0.69), 152{DASH}355 s |
| detect | DETR-PEG (tiny backbone), synthetic COCO, 80 px | AP 0.21{DASH}0.27, AP50 0.57{DASH}0.67 (60 px AP50 0.45{DASH}0.53, 100 px AP50 0.11{DASH}0.17), 92{DASH}107 s |
| detect-rtdetr | RT-DETR-PEG (tiny backbone, PEG in AIFI), same data, trained at 80 px | AP 0.29{DASH}0.42, AP50 0.65{DASH}0.75 (60 px AP50 0.39{DASH}0.59, 120 px AP50 0.54{DASH}0.65, 160 px AP50 0.32{DASH}0.54), 22{DASH}27 s |
| video | PEG3d ViT, synthetic Kinetics, 8 frames | top-1 0.98{DASH}1.00, top-5 1.00, top-1 at 12 frames 0.96{DASH}1.00 (60 videos, 0 skipped), 61{DASH}70 s |"""


def _other(**changes: float) -> dict:
    """SUMMARY with ``classify.top1_by_size.96`` or ``detect.ap`` changed: ``_other(c96=0.61, dap=0.2)``."""
    out = json.loads(json.dumps(SUMMARY))
    for key, value in changes.items():
        {"c96": out["classify"]["top1_by_size"], "dap": out["detect"]}[key[:3]][
            key[1:] if key[0] == "c" else "ap"
        ] = value
    return out


def _readme(table_or_summaries) -> str:
    table = table_or_summaries if isinstance(table_or_summaries, str) else render_table(table_or_summaries)
    return "intro\n<!-- demo-table:start -->\n" + table + "\n<!-- demo-table:end -->\nrest\n"


def test_bar_is_85_percent_of_the_lowest_value_floored_to_a_multiple_of_0_05():
    assert bar([0.99]) == 0.80
    assert bar([0.332, 0.5]) == 0.25  # the lowest value counts
    assert bar([1.0]) == 0.85  # already on a step: not lowered by float noise
    assert bar([0.0]) == 0.0 and bar([0.01]) == 0.0
    assert [bar([k / 20 / 0.85]) for k in range(21)] == [k / 20 for k in range(21)]
    with pytest.raises(ValueError, match="finite"):
        bar([0.5, float("nan")])
    with pytest.raises(ValueError, match="finite"):
        bar([])


def test_one_summary_quotes_a_bar_for_every_metric_and_the_row_layout():
    table = render_table(SUMMARY)
    rows = table.splitlines()
    assert rows[2] == (
        f"| classify | CPVT-PEG, generated shapes, trained at 48 px | top-1 {GE} 0.80 "
        f"(36 px {GE} 0.75, 72 px {GE} 0.70, 96 px {GE} 0.45), 119 s |"
    )
    assert rows[5] == (
        f"| video | PEG3d ViT, synthetic Kinetics, 8 frames | top-1 {GE} 0.85, top-5 {GE} 0.85, "
        f"top-1 at 12 frames {GE} 0.85 (60 videos, 0 skipped), 129 s |"
    )
    quoted = read_bars(table)
    assert quoted == bars(SUMMARY) and list(quoted) == list(metrics(SUMMARY)) and len(quoted) == 16
    assert ("classify", "48 px") not in quoted
    assert quoted[("detect", "60 px AP50")] == 0.30 and quoted[("detect", "100 px AP50")] == 0.15
    assert quoted[("detect-rtdetr", "160 px AP50")] == 0.10
    assert quoted[("video", "top-1 at 12 frames")] == 0.85


def test_several_summaries_give_the_bar_of_the_lowest_and_the_seconds_they_span():
    low, high = _other(c96=0.40), _other(c96=0.61, dap=0.25)
    quoted = read_bars(render_table([SUMMARY, low, high]))
    assert quoted[("classify", "96 px")] == bar([0.40]) == 0.30
    assert quoted[("detect", "AP")] == bar([0.25]) == 0.20
    assert quoted[("classify", "top-1")] == 0.80  # the same in all three
    slow = json.loads(json.dumps(SUMMARY))
    slow["classify"]["seconds"] = 140.4
    assert render_table([SUMMARY, slow]).splitlines()[2].endswith(f", 119{DASH}140 s |")


def test_check_passes_at_and_above_the_bar_and_names_a_number_below():
    text = _readme([SUMMARY, _other(c96=0.40)])  # classify 96 px >= 0.30
    assert check(text, SUMMARY) == [] and check(text, _other(c96=0.30)) == []  # at the bar
    assert check(text, _other(c96=0.99)) == []  # a bar has no upper end
    assert check(text, _other(c96=0.29)) == [
        "classify 96 px: the demo gives 0.290, below the README's bar 0.30"
    ]
    assert check(_readme(SUMMARY), _other(dap=0.18, c96=float("nan"))) == [
        "classify 96 px: the demo gives nan, below the README's bar 0.45",
        "detect AP: the demo gives 0.180, below the README's bar 0.25",
    ]


def test_check_names_missing_numbers_and_block():
    text = _readme(SUMMARY).replace(f"top-5 {GE} 0.85, ", "")
    assert check(text, SUMMARY) == ["the demo gives video top-5 but README does not quote it"]
    older = json.loads(json.dumps(SUMMARY))
    del older["detect"]["rtdetr"]
    assert check(_readme(older), SUMMARY) == [
        f"the demo gives detect-rtdetr {label} but README does not quote it"
        for label in ("120 px AP50", "160 px AP50", "60 px AP50", "AP", "AP50")
    ]
    assert check(_readme(SUMMARY), older) == [
        f"README quotes detect-rtdetr {label} but the demo gives none"
        for label in ("120 px AP50", "160 px AP50", "60 px AP50", "AP", "AP50")
    ]
    with pytest.raises(ValueError, match="no <!-- demo-table:start -->"):
        check("no table here", SUMMARY)
    with pytest.raises(ValueError, match="not quote the same metrics"):
        render_table([SUMMARY, older])


def test_write_merges_with_the_bars_quoted_and_fresh_ignores_them():
    quoted_low = _readme([SUMMARY, _other(c96=0.40)])  # classify 96 px >= 0.30
    merged = read_bars(replace_table(quoted_low, [_other(c96=0.9, dap=0.1)]))
    assert merged[("classify", "96 px")] == 0.30  # a bar another machine needed stays
    assert merged[("detect", "AP")] == bar([0.1]) == 0.05  # the new run needs a lower one
    assert merged[("classify", "72 px")] == 0.70
    fresh = read_bars(replace_table(quoted_low, [_other(c96=0.9, dap=0.1)], fresh=True))
    assert fresh[("classify", "96 px")] == bar([0.9]) == 0.75 and fresh[("detect", "AP")] == 0.05
    # a metric the README does not quote yet gets its computed bar
    older = json.loads(json.dumps(SUMMARY))
    del older["detect"]["rtdetr"]
    assert read_bars(replace_table(_readme(older), SUMMARY)) == bars(SUMMARY)


def test_write_migrates_the_former_range_format():
    """A former range's low end is a measured minimum: its bar is ``bar([low])``; seconds are merged."""
    assert read_bars(OLD_TABLE)[("classify", "72 px")] == bar([0.74]) == 0.60
    assert read_bars(OLD_TABLE)[("video", "top-5")] == bar([1.0]) == 0.85  # one value
    new = replace_table(_readme(OLD_TABLE), [_other(c96=0.3)])
    rows = new.split("<!-- demo-table:start -->\n")[1].splitlines()
    assert rows[2] == (
        f"| classify | CPVT-PEG, generated shapes, trained at 48 px | top-1 {GE} 0.80 "
        f"(36 px {GE} 0.75, 72 px {GE} 0.60, 96 px {GE} 0.25), 119{DASH}355 s |"
    )
    assert rows[4].endswith(f"160 px AP50 {GE} 0.10), 22{DASH}27 s |")  # 0.125 measured, 0.32 quoted
    assert rows[5].endswith(f"(60 videos, 0 skipped), 61{DASH}129 s |")
    assert all(DASH not in n for row in rows[2:6] for n in row.split(", ")[:-1])  # no range is left
    assert check(new, _other(c96=0.3)) == [] and new.endswith("rest\n")


def test_write_then_check_round_trip(tmp_path, prewarmed):
    """``python -m tools.readme_numbers`` as a command: its exit statuses, messages and the README it writes
    (each run a process of its own, forked from one that imported torch already: ``tests/prewarmed.py``)."""
    readme = tmp_path / "README.md"
    readme.write_text(_readme(_other(dap=0.5)))  # detect AP >= 0.40
    files = []
    for i, summary in enumerate([SUMMARY, _other(c96=0.40)]):
        files.append(tmp_path / f"s{i}.json")
        files[-1].write_text(json.dumps(summary))
    cmd = ["--readme", str(readme)]

    def run(*args: str) -> subprocess.CompletedProcess:
        return prewarmed.run("tools.readme_numbers", [*cmd, *args], cwd=REPO, env=os.environ, timeout=120)

    failed = run("--summary", str(files[0]), "--check")
    assert failed.returncode == 1
    assert failed.stderr.strip() == (
        "error: README demo table: detect AP: the demo gives 0.318, below the README's bar 0.40"
    )
    wrote = run("--summary", *map(str, files), "--write")
    assert wrote.returncode == 0
    assert readme.read_text() == _readme([SUMMARY, _other(c96=0.40)])  # every bar lowered, none raised
    assert readme.read_text().endswith("rest\n")
    for f in files:
        ok = run("--summary", str(f), "--check")
        assert ok.returncode == 0 and "clears its bar" in ok.stdout
    readme.write_text(_readme(_other(c96=0.1)))  # classify 96 px >= 0.05
    merged = run("--summary", str(files[0]), "--write")
    assert merged.returncode == 0 and read_bars(readme.read_text())[("classify", "96 px")] == 0.05
    fresh = run("--summary", str(files[0]), "--write", "--fresh")
    assert fresh.returncode == 0 and readme.read_text() == _readme(SUMMARY)
    two = run("--summary", *map(str, files), "--check")
    assert two.returncode == 2 and two.stderr.strip() == "error: --check takes one summary: --summary"
    lone = run("--summary", str(files[0]), "--check", "--fresh")
    assert lone.returncode == 2 and lone.stderr.strip() == "error: --fresh only goes with --write: --fresh"
    files[0].write_text("{")
    bad = run("--summary", str(files[0]), "--check")
    assert bad.returncode == 1 and bad.stderr.startswith("error: cannot compare the README with the demo: ")
    assert bad.stderr.strip().endswith(str(files[0])) and len(bad.stderr.strip().splitlines()) == 1
    readme.write_text("no block")
    none = run("--summary", str(files[1]), "--check")
    assert none.returncode == 1 and len(none.stderr.strip().splitlines()) == 1
    assert "no <!-- demo-table:start -->" in none.stderr and none.stderr.strip().endswith(str(readme))


def test_the_readme_has_the_block_with_a_bar_for_every_number():
    """The README's block quotes a bar for every metric today's demo gives, the RT-DETR family's lines included."""
    text = README.read_text()
    start, end = text.index("<!-- demo-table:start -->"), text.index("<!-- demo-table:end -->")
    block = text[start:end]
    quoted = read_bars(block)
    # today's demo: the detect part's D-FINE-PEG and DEIMv2-PEG lines too (the summary above predates them)
    today = {**SUMMARY, "detect": {**SUMMARY["detect"], "dfine": RTDETR, "deimv2": RTDETR}}
    assert set(quoted) == set(metrics(today))
    assert block.count(f" {GE} ") == len(quoted)  # bars, no range left from the former format
    assert all(0.0 <= b <= 1.0 and math.isclose(b * 20, round(b * 20)) for b in quoted.values())
