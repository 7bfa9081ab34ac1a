"""The README's demo table quotes a bar per metric that every measured run clears; render or check it.

    python -m tools.demo_spread                                                # measure + --write (minutes)
    python -m tools.readme_numbers --summary runs/spread/*/summary.json --write  # lower the bars if needed
    python -m tools.readme_numbers --summary runs/demo/summary.json --check     # CI: a run clears every bar

The demo is deterministic on one machine, but its numbers depend on the CPU's kernel path (AVX-512,
AVX2 or AMX code in ATen, MKL and oneDNN round differently, and a few hundred optimiser steps
amplify that) and on the training seed, so no range of values holds across CPUs.  The table quotes
each metric as a lower bound, ``top-1 ≥ 0.85``: :func:`bar` of the values measured over several
summaries (seeds 0-2 under each CPU path, :mod:`tools.demo_spread`), 85% of the lowest rounded down
to 0.05.  ``--check`` fails (exit 1, one line per number) when a run's metric is below its bar.

``--write`` regenerates the table from the summaries given and, unless ``--fresh``, merges it with the
bars the README already quotes (the lower of the two), so that measuring on a new machine never raises
a bar that another machine needed; seconds are merged the same way (the union of the ranges).  It
also reads the table's former format, a range ``0.21–0.27`` or one value ``0.99`` per metric, whose
low end is a minimum once observed: its bar is ``bar([low])``.

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

__all__ = ["DASH", "GE", "bar", "bars", "check", "metrics", "read_bars", "render_table", "replace_table"]

START, END = "<!-- demo-table:start -->", "<!-- demo-table:end -->"
README = Path(__file__).resolve().parents[1] / "README.md"
DASH = "–"  # en dash between the ends of a range (seconds; metrics in the former format)
GE = "≥"  # between a metric's label and its bar
MARGIN = 0.85  # a bar is this fraction of the lowest value measured ...
STEPS = 20  # ... rounded down to a multiple of 1 / STEPS = 0.05 (k / 20 is exact where k * 0.05 is not)
# a quoted metric: "<label> ≥ 0.85" (a bar), or the former "<label> 0.91–0.97" / "<label> 1.00" (a range);
# labels are unique within a row
_LABEL = r"(?:top-1|top-5|AP50|AP)(?: at \d+ frames)?|\d+ px(?: AP50)?"
_NUMBER = re.compile(rf"({_LABEL}) (?:{GE} (\d\.\d{{2}})|(\d\.\d{{2}})(?:{DASH}\d\.\d{{2}})?)")
# the seconds that close a row's headline cell: ", 152–355 s" or ", 119 s"
_SECONDS = re.compile(rf", (\d+)(?:{DASH}(\d+))? s$")

Range = tuple[float, float]
Key = tuple[str, str]  # (table row, metric label)


def bar(values: Sequence[float]) -> float:
    """The README's bar of a metric measured as ``values`` (in [0, 1]): 85% of the lowest, floored to 0.05.

    The demo's numbers move with the CPU's kernel path and the training seed (a few hundred optimiser
    steps amplify the rounding differences), so an exact value or a range measured on some machines
    fails on the next one.  A bar with a margin under the lowest value seen holds on a CPU path not
    measured yet, and still catches a real regression (a model that stops learning).  Rounded down to
    a multiple of 0.05 so the table reads as bars, not as measurements; never below 0.0.
    """
    if not values or any(not math.isfinite(v) for v in values):
        raise ValueError(f"a metric needs finite values from every summary, got {list(values)}")
    # the 1e-9 keeps a product already on a step (0.85 as 16.999999999999996 / 20) on that step
    return max(0.0, math.floor(MARGIN * min(values) * STEPS + 1e-9) / STEPS)


def _seconds_text(lo: float, hi: float) -> str:
    lo, hi = round(lo), round(hi)
    return f"{lo} s" if lo == hi else f"{lo}{DASH}{hi} s"


def _other_sizes(part: str, by_size: Mapping[str, float], skip: int, label: str = "") -> dict[Key, float]:
    return {(part, f"{s} px{label}"): float(v) for s, v in by_size.items() if int(s) != skip}


#: the RT-DETR family's lines of the demo's detect part (``tools.demo.FAMILY_LINES``) -> the model column
FAMILY_ROWS = {
    "rtdetr": "RT-DETR-PEG (tiny backbone, PEG in AIFI)",
    "dfine": "D-FINE-PEG (tiny backbone, PEG in AIFI)",
    "deimv2": "DEIMv2-PEG (4-block DINOv3 ViT, PEG in AIFI)",
}


def metrics(summary: Mapping[str, Any]) -> dict[Key, float]:
    """Every metric the table quotes, ``{(row, label): value}`` in the table's order, at full precision."""
    c, d, v = summary["classify"], summary["detect"], summary["video"]
    size = int(c["train_size"])
    out = {("classify", "top-1"): float(c["top1"]), **_other_sizes("classify", c["top1_by_size"], size)}
    out |= {("detect", "AP"): float(d["ap"]), ("detect", "AP50"): float(d["ap50"])}
    out |= _other_sizes("detect", d["ap50_by_size"], _headline_size(d), " AP50")
    for key in FAMILY_ROWS:  # the RT-DETR family's lines of the detect part (an older summary lacks some)
        r, part = d.get(key), f"detect-{key}"
        if r is not None:
            out |= {(part, "AP"): float(r["ap"]), (part, "AP50"): float(r["ap50"])}
            out |= _other_sizes(part, r["ap50_by_size"], int(r["size"]), " AP50")
    out |= {("video", "top-1"): float(v["top1"]), ("video", "top-5"): float(v["top5"]),
            ("video", "top-1 at 12 frames"): float(v["top1_long_clip"])}  # fmt: skip
    return out


def _headline_size(d: Mapping[str, Any]) -> int:
    """DETR's headline size: the middle one of its evaluation sizes."""
    return sorted(int(s) for s in d["ap_by_size"])[len(d["ap_by_size"]) // 2]


def _runs(summaries: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    runs = [summaries] if isinstance(summaries, Mapping) else list(summaries)
    if not runs:
        raise ValueError("no demo summary to render")
    return runs


def bars(summaries: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> dict[Key, float]:
    """``{(row, label): bar}`` of one or several ``tools.demo`` summaries, in the table's order."""
    per_run = [metrics(s) for s in _runs(summaries)]
    keys = list(per_run[0])
    if any(list(m) != keys for m in per_run):
        raise ValueError("the demo summaries do not quote the same metrics (runs of different code?)")
    return {key: bar([m[key] for m in per_run]) for key in keys}


def _rows(table: str) -> list[list[str]]:
    """The ``[part, data, headline]`` cells of the table's body rows."""
    out = []
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] not in ("part", "---"):
            out.append(cells)
    return out


def read_bars(table: str) -> dict[Key, float]:
    """``{(part, label): bar}`` of every metric quoted in the table's rows.

    A metric in the former format (a range ``0.21–0.27`` or one value ``0.99``) gives ``bar([low])``:
    its low end is the lowest value once measured.
    """
    out: dict[Key, float] = {}
    for part, _, headline in _rows(table):
        for label, quoted_bar, low in _NUMBER.findall(headline):
            out[(part, label)] = float(quoted_bar) if quoted_bar else bar([float(low)])
    return out


def _read_seconds(table: str) -> dict[str, Range]:
    """``{part: (low, high)}`` of the seconds the table's rows quote."""
    out = {}
    for part, _, headline in _rows(table):
        m = _SECONDS.search(headline)
        if m:
            out[part] = (float(m[1]), float(m[2] or m[1]))
    return out


def render_table(summaries: Mapping[str, Any] | Sequence[Mapping[str, Any]], previous: str = "") -> str:
    """The demo table (markdown, without the markers) of one or several ``tools.demo`` summaries.

    Each metric is quoted as its :func:`bar` over the summaries; with ``previous`` (a table rendered
    before, its bars or its former ranges), as the lower of that and the bar ``previous`` quotes, and
    the seconds as the union of the measured range and ``previous``'s.
    """
    runs = _runs(summaries)
    quoted = bars(runs)
    old_bars, old_seconds = read_bars(previous), _read_seconds(previous)
    quoted = {key: min(b, old_bars.get(key, b)) for key, b in quoted.items()}
    first = runs[0]
    d = first["detect"]

    def row(part: str, data: str, seconds: Callable[[Mapping[str, Any]], float], extra: str = "") -> str:
        mine = {label: f"{label} {GE} {b:.2f}" for (p, label), b in quoted.items() if p == part}
        head = ", ".join(q for label, q in mine.items() if " px" not in label)
        sizes = ", ".join(q for label, q in mine.items() if " px" in label)
        inner = "; ".join(x for x in (sizes, extra) if x)
        measured = [float(seconds(s)) for s in runs]
        lo, hi = old_seconds.get(part, (math.inf, -math.inf))
        secs = _seconds_text(min(lo, *measured), max(hi, *measured))
        return f"| {part} | {data} | {head}{f' ({inner})' if inner else ''}, {secs} |"

    rows = [
        "| part | data | headline |",
        "|---|---|---|",
        row("classify", f"CPVT-PEG, generated shapes, trained at {int(first['classify']['train_size'])} px",
            lambda s: s["classify"]["seconds"]),
        row("detect", f"DETR-PEG (tiny backbone), synthetic COCO, {_headline_size(d)} px",
            lambda s: s["detect"]["seconds"]),
    ]  # fmt: skip
    for key, model in FAMILY_ROWS.items():
        if (f"detect-{key}", "AP") in quoted:
            rows.append(row(
                f"detect-{key}", f"{model}, same data, trained at {int(d[key]['size'])} px",
                lambda s, key=key: s["detect"][key]["seconds"],
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


def check(readme_text: str, summary: Mapping[str, Any], where: Path = README) -> list[str]:
    """One line per number of the README's table that the summary is below the bar of (empty: clears all)."""
    start, end = _block(readme_text, where)
    quoted = read_bars(readme_text[start:end])
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
        # ``not >=`` so that a NaN fails too; the 1e-9 lets a value equal to its bar (0.85 as 0.8499999) pass
        if not fresh[key] >= quoted[key] - 1e-9:
            problems.append(
                f"{key[0]} {key[1]}: the demo gives {fresh[key]:.3f}, below the README's bar {quoted[key]:.2f}"
            )
    return problems


def replace_table(readme_text: str, summaries: Any, where: Path = README, fresh: bool = False) -> str:
    """``readme_text`` with the demo block regenerated from ``summaries`` (one or several).

    The bars are merged with those the block quotes now (:func:`render_table`'s ``previous``) unless
    ``fresh``.
    """
    start, end = _block(readme_text, where)
    table = render_table(summaries, "" if fresh else readme_text[start:end])
    return readme_text[:start] + "\n" + table + "\n" + readme_text[end:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--summary", type=Path, nargs="+", default=[Path("runs/demo/summary.json")],
                    help="summary.json of one demo run (--check), or of each measured run (--write)")  # fmt: skip
    ap.add_argument("--readme", type=Path, default=README)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="exit 1 when a run is below a quoted bar")
    mode.add_argument("--write", action="store_true", help="regenerate the table from the summaries")
    ap.add_argument(
        "--fresh", action="store_true", help="with --write: ignore the bars the README quotes now"
    )
    args = ap.parse_args(argv)
    if args.check and len(args.summary) != 1:
        print("error: --check takes one summary: --summary", file=sys.stderr)
        return 2
    if args.fresh and not args.write:
        print("error: --fresh only goes with --write: --fresh", file=sys.stderr)
        return 2
    where = args.summary[0]
    try:
        summaries = []
        for where in args.summary:
            summaries.append(read_json(where))
        where = args.readme
        text = args.readme.read_text()
        if args.write:
            args.readme.write_text(replace_table(text, summaries, args.readme, args.fresh))
            how = "" if args.fresh else ", merged with the bars it quoted"
            print(f"wrote the demo table of {args.readme} from {len(summaries)} summaries{how}")
            return 0
        problems = check(text, summaries[0], args.readme)
    except (OSError, ValueError, KeyError, TypeError) as e:  # a missing/odd summary or README: one line
        print(f"error: cannot compare the README with the demo: {e}: {where}", file=sys.stderr)
        return 1
    for line in problems:
        print(f"error: README demo table: {line}", file=sys.stderr)
    if not problems:
        print(f"every number of {args.summary[0]} clears its bar in the README's demo table")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
