"""The README's demo table is what ``make demo`` gives: render it from ``summary.json``, or check it.

    python -m tools.readme_numbers --summary runs/demo/summary.json --write   # regenerate the table
    python -m tools.readme_numbers --summary runs/demo/summary.json --check   # CI: fail on a stale table

The table lives in README.md between ``<!-- demo-table:start -->`` and ``<!-- demo-table:end -->``.
``--check`` compares every metric the table quotes with the summary and fails (exit 1, one line per
number) when one differs by more than :data:`TOLERANCE`: the demo is deterministic on one machine
type, but another CPU may round the last digit differently.  Seconds are printed, never checked
(they depend on the machine and its load).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["TOLERANCE", "check", "read_numbers", "render_table", "replace_table"]

#: largest accepted difference between a README number and the demo's (metrics in [0, 1], 3 decimals)
TOLERANCE = 0.01
START, END = "<!-- demo-table:start -->", "<!-- demo-table:end -->"
README = Path(__file__).resolve().parents[1] / "README.md"
# a quoted metric: "<label> 0.996" -> label, value; labels are unique within a row
_NUMBER = re.compile(r"((?:top-1|top-5|AP50|AP)(?: at \d+ frames)?|\d+ px(?: AP50)?) (\d\.\d{3})")


def _f(v: float) -> str:
    return f"{v:.3f}"


def _sizes(by_size: Mapping[str, float], skip: int, label: str = "") -> str:
    return ", ".join(f"{s} px{label} {_f(v)}" for s, v in by_size.items() if int(s) != skip)


def render_table(summary: Mapping[str, Any]) -> str:
    """The demo table (markdown, without the markers) of a ``tools.demo`` summary."""
    c, d, v = summary["classify"], summary["detect"], summary["video"]
    size = int(c["train_size"])
    det_size = sorted(int(s) for s in d["ap_by_size"])[len(d["ap_by_size"]) // 2]
    rows = [
        "| part | data | headline |",
        "|---|---|---|",
        f"| classify | CPVT-PEG, generated shapes, trained at {size} px | top-1 {_f(c['top1'])} "
        f"({_sizes(c['top1_by_size'], size)}), {c['seconds']:.0f} s |",
        f"| detect | DETR-PEG (tiny backbone), synthetic COCO, {det_size} px | AP {_f(d['ap'])}, "
        f"AP50 {_f(d['ap50'])} ({_sizes(d['ap50_by_size'], det_size, ' AP50')}), {d['seconds']:.0f} s |",
        *_rtdetr_row(d.get("rtdetr")),
        f"| video | PEG3d ViT, synthetic Kinetics, 8 frames | top-1 {_f(v['top1'])}, top-5 {_f(v['top5'])}, "
        f"top-1 at 12 frames {_f(v['top1_long_clip'])} ({v['videos_evaluated']} videos, "
        f"{v['skipped']} skipped), {v['seconds']:.0f} s |",
    ]
    return "\n".join(rows)


def _rtdetr_row(r: Mapping[str, Any] | None) -> list[str]:
    """The ``detect-rtdetr`` row (the RT-DETR-PEG line inside the detect part), none for an older summary."""
    if r is None:
        return []
    size = int(r["size"])  # its --val-size; the other sizes are 0.75x, 1.5x and 2x of it
    return [
        f"| detect-rtdetr | RT-DETR-PEG (tiny backbone, PEG in AIFI), same data, trained multi-scale around "
        f"{size} px | AP {_f(r['ap'])}, AP50 {_f(r['ap50'])} ({_sizes(r['ap50_by_size'], size, ' AP50')}), "
        f"{r['seconds']:.0f} s |"
    ]


def _block(text: str, where: Path) -> tuple[int, int]:
    start, end = text.find(START), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"no {START} ... {END} block: {where}")
    return start + len(START), end


def read_numbers(table: str) -> dict[tuple[str, str], float]:
    """``{(part, label): value}`` of every metric quoted in the table's rows."""
    out: dict[tuple[str, str], float] = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in ("part", "---"):
            continue
        for label, value in _NUMBER.findall(cells[2]):
            out[(cells[0], label)] = float(value)
    return out


def check(readme_text: str, summary: Mapping[str, Any], where: Path = README) -> list[str]:
    """One line per number of the README's table that the summary does not reproduce (empty: in step)."""
    start, end = _block(readme_text, where)
    quoted = read_numbers(readme_text[start:end])
    fresh = read_numbers(render_table(summary))
    problems = [
        f"README quotes {part} {label} but the demo gives none" for part, label in quoted.keys() - fresh
    ]
    problems += [
        f"the demo gives {part} {label} but README does not quote it" for part, label in fresh.keys() - quoted
    ]
    for key in sorted(quoted.keys() & fresh.keys()):
        if abs(quoted[key] - fresh[key]) > TOLERANCE:
            problems.append(
                f"{key[0]} {key[1]}: README {quoted[key]:.3f}, demo {fresh[key]:.3f} (tolerance {TOLERANCE})"
            )
    return problems


def replace_table(readme_text: str, summary: Mapping[str, Any], where: Path = README) -> str:
    """``readme_text`` with the demo block regenerated from ``summary``."""
    start, end = _block(readme_text, where)
    return readme_text[:start] + "\n" + render_table(summary) + "\n" + readme_text[end:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--summary", type=Path, default=Path("runs/demo/summary.json"))
    ap.add_argument("--readme", type=Path, default=README)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="exit 1 when the table is not what the demo gives")
    mode.add_argument("--write", action="store_true", help="regenerate the table from the summary")
    args = ap.parse_args(argv)
    try:
        summary = json.loads(args.summary.read_text())
        text = args.readme.read_text()
        if args.write:
            args.readme.write_text(replace_table(text, summary, args.readme))
            print(f"wrote the demo table of {args.readme} from {args.summary}")
            return 0
        problems = check(text, summary, args.readme)
    except (OSError, ValueError, KeyError, TypeError) as e:  # a missing/odd summary or README: one line
        print(f"error: cannot compare the README with the demo: {e}: {args.summary}", file=sys.stderr)
        return 1
    for line in problems:
        print(f"error: README demo table is stale: {line}", file=sys.stderr)
    if not problems:
        print(f"README demo table matches {args.summary} (tolerance {TOLERANCE})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
