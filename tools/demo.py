"""`make demo`: the main job on the embedded (generated) data, no downloads.

Runs each part in turn: the CPVT classifier (peg_core), DETR-PEG and then
RT-DETR-PEG on synthetic COCO (peg_detr; the latter under ``detect.rtdetr``) and
the PEG video transformer on synthetic Kinetics (peg_video).  Prints the headline numbers last and writes them to
``runs/demo/summary.json`` (one object per part plus total seconds).

    python -m tools.demo [--parts classify,detect,video] [--quick] [--out runs/demo]
"""

from __future__ import annotations

import argparse
import importlib
import json
import time
from pathlib import Path

# part name -> (module, function): each returns a flat dict of numbers.
PARTS = {
    "classify": ("peg_core.classify.demo", "run_demo"),
    "detect": ("peg_detr.demo", "run_demo"),
    "video": ("peg_video.demo", "run_demo"),
}
HEADLINE = {
    "classify": ("top1",),
    "detect": ("ap", "ap50"),
    "video": ("top1", "top5", "top1_long_clip"),
}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default=",".join(PARTS), help="comma-separated subset of " + ",".join(PARTS))
    ap.add_argument("--out", type=Path, default=Path("runs/demo"))
    ap.add_argument("--quick", action="store_true", help="seconds-long smoke run (used by the tests)")
    args = ap.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        ap.error(f"unknown parts {unknown}; choose from {sorted(PARTS)}")

    args.out.mkdir(parents=True, exist_ok=True)
    summary: dict = {}
    t0 = time.time()
    for name in parts:
        module, fn = PARTS[name]
        print(f"\n=== demo part: {name} ===", flush=True)
        t = time.time()
        result = getattr(importlib.import_module(module), fn)(args.out / name, quick=args.quick)
        result.setdefault("seconds", round(time.time() - t, 1))
        summary[name] = result
    summary["seconds"] = round(time.time() - t0, 1)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")

    print("\n=== demo summary (also in %s) ===" % (args.out / "summary.json"))
    for name in parts:
        nums = ", ".join(f"{k}={_fmt(summary[name].get(k))}" for k in HEADLINE[name])
        print(f"{name:9s} {nums}  ({summary[name]['seconds']} s)")
        rtdetr = summary[name].get("rtdetr") if name == "detect" else None
        if isinstance(rtdetr, dict):  # the RT-DETR-PEG line runs inside the detect part, on its data
            nums = ", ".join(f"{k}={_fmt(rtdetr.get(k))}" for k in HEADLINE[name])
            print(f"  rtdetr  {nums}  ({rtdetr['seconds']} s, RT-DETR-PEG)")
    print(f"total     {summary['seconds']} s")
    return summary


def _fmt(v) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)


if __name__ == "__main__":
    main()
