"""The video part of ``make demo``: synthetic Kinetics, a brief CPU training, multi-view evaluation.

1. generate the synthetic moving-shapes set (Kinetics CSV + ``path label`` lists);
2. train the PEG video transformer (config ``synthetic_tiny``: 2 blocks, 64 wide, a 3D PEG
   before each block, ``peg_at=[-1, 0]``, 8 frames at stride 2, 32 px crops) on the CPU;
3. evaluate with the multi-view protocol (2 clips per video), then the same weights on
   clips 1.5× longer (12 frames), which the PEG handles without any change.

Decoding runs in one loader worker and the model in one thread: on two cores that is faster
than two intra-op threads for a model this small.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from peg_core.jsonfile import JsonError, read_json

from . import cli
from .data.synthetic import GENERATOR_VERSION, SyntheticSpec, make_synthetic_kinetics

__all__ = ["demo_data", "run_demo"]


def _read_stamp(stamp: Path) -> Any:
    """What the stamp file records; ``None`` when it is missing or not JSON (read by the one JSON reader)."""
    try:
        return read_json(stamp, "demo data stamp")
    except JsonError:
        return None


def demo_data(root: Path, spec: SyntheticSpec) -> Path:
    """The synthetic set of ``spec`` in ``root``, generated unless ``root`` already holds exactly that.

    ``root/spec.json`` records the spec and :data:`GENERATOR_VERSION`; anything else in ``root``
    (another spec, an older generator, no stamp) is removed and generated anew.
    """
    stamp = root / "spec.json"
    # through JSON once, so that tuples compare as the lists the stamp reads back
    wanted = json.loads(json.dumps({"generator_version": GENERATOR_VERSION, **dataclasses.asdict(spec)}))
    if _read_stamp(stamp) == wanted:  # none, another spec or a damaged stamp: generated anew
        return root
    shutil.rmtree(root, ignore_errors=True)
    make_synthetic_kinetics(root, spec)
    stamp.write_text(json.dumps(wanted))
    return root


LONG_CLIP = 12  # frames at evaluation; training uses 8


def run_demo(out_dir: Path, quick: bool = False, seed: int = 0) -> dict[str, Any]:
    """Run the demo under ``out_dir`` (``seed``: the training run's ``--seed``; the data are the same).

    Returns top-1/top-5, top-1 at the longer clip, counts, seconds.
    """
    t0 = time.time()
    out_dir = Path(out_dir)
    spec = (
        SyntheticSpec(num_train=12, num_val=6, seed=0) if quick else SyntheticSpec(num_train=240, num_val=60)
    )
    data = demo_data(out_dir / "data", spec)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        flags = ["--train-ann", str(data / "train.csv"), "--val-ann", str(data / "val.csv")]
        # --overwrite: a demo run replaces the one an earlier `make demo` left there
        flags += ["--config", "synthetic_tiny", "--output-dir", str(out_dir / "run"), "--workers", "1"]
        flags += ["--seed", str(seed), "--overwrite"]
        if quick:
            flags += ["--epochs", "1", "--no-progress"]
        report = cli.train(flags)
        argv = ["--checkpoint", report["checkpoint"], "--num-frames", str(LONG_CLIP), "--workers", "1"]
        argv += ["--output-dir", str(out_dir / f"eval_{LONG_CLIP}_frames"), "--no-progress"]
        long = cli.evaluate(argv)
    finally:
        torch.set_num_threads(threads)
    metrics = report["eval"]
    result = {
        "top1": metrics["top1"],
        "top5": metrics["top5"],
        "top1_long_clip": long["eval"]["top1"],
        "videos_evaluated": metrics["num_videos"],
        "skipped": sum(log["count"] for log in report["broken"].values()),
        "seconds": round(time.time() - t0, 1),
    }
    print(
        f"video: top1 {result['top1']:.3f}  top5 {result['top5']:.3f}  (8 frames, 2 clips)  "
        f"top1 at {LONG_CLIP} frames {result['top1_long_clip']:.3f}  "
        f"videos {result['videos_evaluated']}, skipped {result['skipped']}, {result['seconds']} s"
    )
    return result
