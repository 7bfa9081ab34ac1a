"""`make demo`: the main job on the embedded (generated) data, no downloads.

Runs each part in turn: the CPVT classifier (peg_core), DETR-PEG and then
RT-DETR-PEG, D-FINE-PEG and DEIMv2-PEG on synthetic COCO (peg_detr; under ``detect.rtdetr``,
``detect.dfine``, ``detect.deimv2``) and
the PEG video transformer on synthetic Kinetics (peg_video).  Prints the headline numbers last and writes them to
``runs/demo/summary.json`` (one object per part plus total seconds).

    python -m tools.demo [--parts classify,detect,video] [--quick] [--seed 0] [--out runs/demo]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import time
from pathlib import Path

import torch

# part name -> (module, function): each returns a flat dict of numbers.
PARTS = {
    "classify": ("peg_core.classify.demo", "run_demo"),
    "detect": ("peg_detr.demo", "run_demo"),
    "video": ("peg_video.demo", "run_demo"),
}
#: the detect part's lines after DETR's (peg_detr.demo.FAMILY_DEMOS): summary key -> name
FAMILY_LINES = {"rtdetr": "RT-DETR-PEG", "dfine": "D-FINE-PEG", "deimv2": "DEIMv2-PEG"}
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
    ap.add_argument(
        "--seed", type=int, default=0, help="every part's training --seed (the data stay the same)"
    )
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
        result = getattr(importlib.import_module(module), fn)(
            args.out / name, quick=args.quick, seed=args.seed
        )
        result.setdefault("seconds", round(time.time() - t, 1))
        summary[name] = result
    summary["seconds"] = round(time.time() - t0, 1)
    summary["seed"] = args.seed
    summary["cpu"] = cpu_path()
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")

    print("\n=== demo summary (also in %s) ===" % (args.out / "summary.json"))
    for name in parts:
        nums = ", ".join(f"{k}={_fmt(summary[name].get(k))}" for k in HEADLINE[name])
        print(f"{name:9s} {nums}  ({summary[name]['seconds']} s)")
        for key in FAMILY_LINES if name == "detect" else ():  # inside the detect part, on its data
            line = summary[name].get(key)
            if isinstance(line, dict):
                nums = ", ".join(f"{k}={_fmt(line.get(k))}" for k in HEADLINE[name])
                print(f"  {key:7s} {nums}  ({line['seconds']} s, {FAMILY_LINES[key]})")
    print(f"total     {summary['seconds']} s")
    return summary


#: what selects a CPU kernel path: ATen's own dispatch, and that of MKL and oneDNN (which torch's CPU
#: wheels call for matrix products and convolutions); tools.demo_spread sets all three to emulate AVX2
CPU_PATH_VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")


def cpu_path() -> dict[str, str]:
    """The kernel path this process runs: ATen's capability and the variables that choose it."""
    path = {"capability": torch.backends.cpu.get_cpu_capability()}
    return path | {k: os.environ[k] for k in CPU_PATH_VARIABLES if k in os.environ}


def _fmt(v) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)


if __name__ == "__main__":
    main()
