"""The README's demo table quotes ranges that any machine of the build kind reproduces; render or check it.

    python -m tools.demo_spread                                                # measure + --write (minutes)
    python -m tools.readme_numbers --summary runs/spread/*/summary.json --write  # regenerate the table
    python -m tools.readme_numbers --summary runs/demo/summary.json --check     # CI: a run inside the ranges

The demo is deterministic on one machine, but its numbers depend on the CPU's kernel path
(AVX-512 or AVX2 code in ATen, MKL and oneDNN round differently, and a few hundred optimiser steps
amplify that) and on the training seed.  So the table is rendered from *several* summaries (seeds
0-2 under each CPU path, :mod:`tools.demo_spread`) and quotes each metric as the range they span,
rounded outwards to two decimals (``0.91–0.97``; one value when they agree to two decimals).
``--check`` fails (exit 1, one line per number) when a run's metric falls outside its quoted range.

The table lives in README.md between ``<!-- demo-table:start -->`` and ``<!-- demo-table:end -->``.
Seconds are printed as the range measured, never checked (they depend on the machine and its load).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from peg_core.jsonfile import read_json

__all__ = ["DASH", "check", "metrics", "read_numbers", "render_table", "replace_table", "span"]

START, END = "<!-- demo-table:start -->", "<!-- demo-table:end -->"
README = Path(__file__).resolve().parents[1] / "README.md"
DASH = "–"  # en dash between the ends of a range
# a quoted metric: "<label> 0.91–0.97" or "<label> 1.00" -> label, low, high; labels are unique within a row
_NUMBER = re.compile(
    r"((?:top-1|top-5|AP50|AP)(?: at \d+ frames)?|\d+ px(?: AP50)?) (\d\.\d{2})(?:" + DASH + r"(\d\.\d{2}))?"
)

Range = tuple[float, float]
Key = tuple[str, str]  # (table row, metric label)


def span(values: Sequence[float]) -> Range:
    """``(low, high)`` of ``values`` rounded outwards to two decimals (metrics in [0, 1])."""
    if not values or any(not math.isfinite(v) for v in values):
        raise ValueError(f"a metric needs finite values from every summary, got {list(values)}")
    # the 1e-9 keeps a value that is already on a two-decimal step (0.35 as 0.3500000001) where it is
    return math.floor(min(values) * 100 + 1e-9) / 100, math.ceil(max(values) * 100 - 1e-9) / 100


def _range_text(values: Sequence[float]) -> str:
    lo, hi = span(values)
    return f"{lo:.2f}" if lo == hi else f"{lo:.2f}{DASH}{hi:.2f}"


def _seconds_text(values: Sequence[float]) -> str:
    lo, hi = round(min(values)), round(max(values))
    return f"{lo} s" if lo == hi else f"{lo}{DASH}{hi} s"


def _other_sizes(part: str, by_size: Mapping[str, float], skip: int, label: str = "") -> dict[Key, float]:
    return {(part, f"{s} px{label}"): float(v) for s, v in by_size.items() if int(s) != skip}


def metrics(summary: Mapping[str, Any]) -> dict[Key, float]:
    """Every metric the table quotes, ``{(row, label): value}`` in the table's order, at full precision."""
    c, d, v = summary["classify"], summary["detect"], summary["video"]
    size = int(c["train_size"])
    out = {("classify", "top-1"): float(c["top1"]), **_other_sizes("classify", c["top1_by_size"], size)}
    out |= {("detect", "AP"): float(d["ap"]), ("detect", "AP50"): float(d["ap50"])}
    out |= _other_sizes("detect", d["ap50_by_size"], _headline_size(d), " AP50")
    r = d.get("rtdetr")
    if r is not None:  # the RT-DETR-PEG line of the detect part (an older summary has none)
        out |= {("detect-rtdetr", "AP"): float(r["ap"]), ("detect-rtdetr", "AP50"): float(r["ap50"])}
        out |= _other_sizes("detect-rtdetr", r["ap50_by_size"], int(r["size"]), " AP50")
    out |= {("video", "top-1"): float(v["top1"]), ("video", "top-5"): float(v["top5"]),
            ("video", "top-1 at 12 frames"): float(v["top1_long_clip"])}  # fmt: skip
    return out


def _headline_size(d: Mapping[str, Any]) -> int:
    """DETR's headline size: the middle one of its evaluation sizes."""
    return sorted(int(s) for s in d["ap_by_size"])[len(d["ap_by_size"]) // 2]


def render_table(summaries: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> str:
    """The demo table (markdown, without the markers) of one or several ``tools.demo`` summaries.

    Several summaries (seeds, CPU paths) give each metric as the range they span.
    """
    runs = [summaries] if isinstance(summaries, Mapping) else list(summaries)
    if not runs:
        raise ValueError("no demo summary to render")
    per_run = [metrics(s) for s in runs]
    keys = list(per_run[0])
    if any(list(m) != keys for m in per_run):
        raise ValueError("the demo summaries do not quote the same metrics (runs of different code?)")
    first = runs[0]
    d = first["detect"]

    def row(part: str, data: str, seconds: Callable[[Mapping[str, Any]], float], extra: str = "") -> str:
        quoted = {label: _range_text([m[(p, label)] for m in per_run]) for p, label in keys if p == part}
        head = ", ".join(f"{label} {q}" for label, q in quoted.items() if " px" not in label)
        sizes = ", ".join(f"{label} {q}" for label, q in quoted.items() if " px" in label)
        inner = "; ".join(x for x in (sizes, extra) if x)
        secs = _seconds_text([float(seconds(s)) for s in runs])
        return f"| {part} | {data} | {head}{f' ({inner})' if inner else ''}, {secs} |"

    rows = [
        "| part | data | headline |",
        "|---|---|---|",
        row("classify", f"CPVT-PEG, generated shapes, trained at {int(first['classify']['train_size'])} px",
            lambda s: s["classify"]["seconds"]),
        row("detect", f"DETR-PEG (tiny backbone), synthetic COCO, {_headline_size(d)} px",
            lambda s: s["detect"]["seconds"]),
    ]  # fmt: skip
    if ("detect-rtdetr", "AP") in keys:
        rows.append(row(
            "detect-rtdetr",
            f"RT-DETR-PEG (tiny backbone, PEG in AIFI), same data, trained at {int(d['rtdetr']['size'])} px",
            lambda s: s["detect"]["rtdetr"]["seconds"],
        ))  # fmt: skip
    v = first["video"]
    skipped = max(int(s["video"]["skipped"]) for s in runs)
    rows.append(row("video", "PEG3d ViT, synthetic Kinetics, 8 frames", lambda s: s["video"]["seconds"],
                    f"{v['videos_evaluated']} videos, {skipped} skipped"))  # fmt: skip
    return "\n".join(rows)


def _block(text: str, where: Path) -> tuple[int, int]:
    start, end = text.find(START), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"no {START} ... {END} block: {where}")
    return start + len(START), end


def read_numbers(table: str) -> dict[tuple[str, str], Range]:
    """``{(part, label): (low, high)}`` of every metric quoted in the table's rows (low == high: one value)."""
    out: dict[tuple[str, str], Range] = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in ("part", "---"):
            continue
        for label, low, high in _NUMBER.findall(cells[2]):
            out[(cells[0], label)] = (float(low), float(high or low))
    return out


def check(readme_text: str, summary: Mapping[str, Any], where: Path = README) -> list[str]:
    """One line per number of the README's table that the summary falls outside of (empty: inside)."""
    start, end = _block(readme_text, where)
    quoted = read_numbers(readme_text[start:end])
    fresh = metrics(summary)
    problems = [
        f"README quotes {part} {label} but the demo gives none"
        for part, label in sorted(quoted.keys() - fresh)
    ]
    problems += [
        f"the demo gives {part} {label} but README does not quote it"
        for part, label in sorted(fresh.keys() - quoted)
    ]
    for key in sorted(quoted.keys() & fresh.keys()):
        lo, hi = quoted[key]
        if not lo <= fresh[key] <= hi:
            quote = f"{lo:.2f}" if lo == hi else f"{lo:.2f}{DASH}{hi:.2f}"
            problems.append(
                f"{key[0]} {key[1]}: the demo gives {fresh[key]:.3f}, outside the README's {quote}"
            )
    return problems


def replace_table(readme_text: str, summaries: Any, where: Path = README) -> str:
    """``readme_text`` with the demo block regenerated from ``summaries`` (one or several)."""
    start, end = _block(readme_text, where)
    return readme_text[:start] + "\n" + render_table(summaries) + "\n" + readme_text[end:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--summary", type=Path, nargs="+", default=[Path("runs/demo/summary.json")],
                    help="summary.json of one demo run (--check), or of each measured run (--write)")  # fmt: skip
    ap.add_argument("--readme", type=Path, default=README)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument(
        "--check", action="store_true", help="exit 1 when a run falls outside the quoted ranges"
    )
    mode.add_argument("--write", action="store_true", help="regenerate the table from the summaries")
    args = ap.parse_args(argv)
    if args.check and len(args.summary) != 1:
        print("error: --check takes one summary: --summary", file=sys.stderr)
        return 2
    where = args.summary[0]
    try:
        summaries = []
        for where in args.summary:
            summaries.append(read_json(where))
        where = args.readme
        text = args.readme.read_text()
        if args.write:
            args.readme.write_text(replace_table(text, summaries, args.readme))
            print(f"wrote the demo table of {args.readme} from {len(summaries)} summaries")
            return 0
        problems = check(text, summaries[0], args.readme)
    except (OSError, ValueError, KeyError, TypeError) as e:  # a missing/odd summary or README: one line
        print(f"error: cannot compare the README with the demo: {e}: {where}", file=sys.stderr)
        return 1
    for line in problems:
        print(f"error: README demo table: {line}", file=sys.stderr)
    if not problems:
        print(f"every number of {args.summary[0]} is inside the README's demo table ranges")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
