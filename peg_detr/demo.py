"""The detection part of ``make demo``: a tiny DETR-PEG, RT-DETR-PEG, D-FINE-PEG and DEIMv2-PEG on the synthetic shapes.

``run_demo(out_dir)`` writes the synthetic set under ``out_dir/data`` (kept
for the next run), trains the ``demo_tiny`` recipe through the same
``python -m peg_detr train`` code path users run (evaluating with the COCO
evaluator at several input sizes after the last epoch) and returns the headline numbers.

Measured (2026-12-02, 2 shared CPU cores, one torch thread, ``--seed 0``): AP 0.318, AP50 0.716 at
80 px after 8 epochs of 1024 images (2048 steps of batch 4), 80 s with the data already generated
(about 150 s with generation); AP50 at 60 / 100 px: 0.353 / 0.153 (trained at 64-96 px).  The
numbers move with the data order: seeds 0 / 1 / 2 / 42 gave AP50 0.716 / 0.699 / 0.666 / 0.458.

Then RT-DETR-PEG (:func:`run_rtdetr_demo`, the ``rtdetr_demo_tiny`` recipe as it is) on the same
data: one epoch (256 steps of batch 4) at 80 px with the plain augmentation (flip and resize:
``--no-aug-epochs 1`` in the recipe), evaluated at 60 / 80 /
120 / 160 px.  The bars every measured seed and CPU path clears are the README's demo
table (``python -m tools.demo_spread``).  Why the plain augmentation: with RT-DETR's strong one
(photometric distortion, zoom-out, IoU crop) and multi-scale, one epoch is a coin flip (2026-12-03,
AVX-512 / AVX2 kernels, seeds 0-2: AP50 0.02-0.44); with the plain one, seeds 0 / 1 / 2 gave
AP50 0.653 / 0.709 / 0.680 in the same 30-40 s.  D-FINE-PEG (``dfine_demo_tiny``) and DEIMv2-PEG
(``deimv2_demo_tiny``: a 4-block, 32-wide DINOv3 ViT) train the same way (2026-12-05, seed 0: AP50
0.715 and 0.468 at 80 px, 40-50 s each).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from peg_core.jsonfile import JsonError, read_json

from .cli import train
from .data import SyntheticSpec, make_synthetic_coco

__all__ = ["DEMO_DATA", "FAMILY_DEMOS", "make_demo_data", "run_demo", "run_family_demo", "run_rtdetr_demo"]

# (train images, val images, spec): the full demo and the seconds-long smoke run.
DEMO_DATA: dict[bool, tuple[int, int, SyntheticSpec]] = {
    False: (1024, 100, SyntheticSpec(size=80, num_classes=3, min_objects=1, max_objects=3)),
    True: (16, 8, SyntheticSpec(size=48, num_classes=3, min_objects=0, max_objects=2)),
}


def _read_stamp(stamp: Path) -> Any:
    """What the stamp file records; ``None`` when it is missing or not JSON (read by the one JSON reader)."""
    try:
        return read_json(stamp, "demo data stamp")
    except JsonError:
        return None


def make_demo_data(root: Path, quick: bool = False, seed: int = 0) -> Path:
    """The demo's shapes under ``root``, generated once (a stamp file records what was generated)."""
    n_train, n_val, spec = DEMO_DATA[quick]
    stamp = root / "spec.json"
    wanted = {"train": n_train, "val": n_val, "seed": seed, **spec.__dict__}
    if _read_stamp(stamp) != wanted:  # none, another spec or a damaged stamp: generated anew
        make_synthetic_coco(root, n_train, n_val, seed=seed, spec=spec)
        stamp.write_text(json.dumps(wanted))
    return root


def _train(
    name: str, recipe: str, data: Path, out: Path, size: int, eval_sizes: list[int], flags: list[str]
) -> dict[str, Any]:
    """One ``python -m peg_detr train`` run of ``recipe`` in a fresh ``out``; its headline numbers."""
    t0 = time.time()
    # A fresh run each time (the log appends and a stale checkpoint would be confusing); data is kept.
    shutil.rmtree(out, ignore_errors=True)
    argv = [
        "--config", recipe, "--data-root", str(data), "--output-dir", str(out),
        "--val-size", str(size), "--eval-sizes", ",".join(map(str, eval_sizes)), "--workers", "0",
        # the demo model's ops are tiny: one thread avoids OpenMP sync costs (and shared-CPU stalls)
        "--threads", "1", "--no-progress", *flags,
    ]  # fmt: skip
    threads = torch.get_num_threads()
    try:
        report = train(argv)
    finally:
        torch.set_num_threads(threads)  # the next demo part gets the process's setting back
    metrics, table = report["eval"], report["eval"]["sizes"]
    summary = {
        "ap": metrics["ap"],
        "ap50": metrics["ap50"],
        "ap_by_size": {str(s): table[str(s)]["ap"] for s in eval_sizes},
        "ap50_by_size": {str(s): table[str(s)]["ap50"] for s in eval_sizes},
        "final_loss": report["train"]["loss"],
        "size": size,
        "seconds": round(time.time() - t0, 1),
    }
    print(
        f"{name} demo: AP {summary['ap']:.3f}, AP50 {summary['ap50']:.3f} at {size} px "
        f"({summary['seconds']} s)"
    )
    return summary


def run_demo(out_dir: Path, quick: bool = False, seed: int = 0) -> dict[str, Any]:
    """Train and evaluate the demo DETR-PEG, then RT-DETR-PEG, D-FINE-PEG and DEIMv2-PEG on the same data.

    Returns DETR's ``ap``, ``ap50``, ``ap_by_size``, ``ap50_by_size``, ``final_loss``, ``size`` (the
    headline's input size), ``seconds``
    (data generation included) and ``rtdetr`` / ``dfine`` / ``deimv2``: the same keys for each of
    :data:`FAMILY_DEMOS` (:func:`run_family_demo`).
    ``quick`` shrinks data and training to seconds (a smoke run for tests; its numbers mean nothing).
    ``seed`` is both runs' ``--seed`` (initialisation, data order, augmentation); the data are the same.
    """
    t0 = time.time()
    out_dir = Path(out_dir)
    data = make_demo_data(out_dir / ("data_quick" if quick else "data"), quick)
    size = DEMO_DATA[quick][2].size
    eval_sizes = [size * 3 // 4, size, size * 5 // 4]  # 60, 80, 100 for the 80 px demo
    flags = ["--seed", str(seed), *(["--epochs", "1", "--train-sizes", "48"] if quick else [])]
    summary = _train("DETR-PEG", "demo_tiny", data, out_dir / "train", size, eval_sizes, flags)
    summary["seconds"] = round(time.time() - t0, 1)
    for key in FAMILY_DEMOS:  # RT-DETR-PEG, D-FINE-PEG, DEIMv2-PEG on the same data
        summary[key] = run_family_demo(key, out_dir, data, quick, seed)
    return summary


#: the RT-DETR family's lines of the detect part, each on the DETR line's data: summary key -> (name, recipe)
FAMILY_DEMOS: dict[str, tuple[str, str]] = {
    "rtdetr": ("RT-DETR-PEG", "rtdetr_demo_tiny"),
    "dfine": ("D-FINE-PEG", "dfine_demo_tiny"),
    "deimv2": ("DEIMv2-PEG", "deimv2_demo_tiny"),
}


def run_family_demo(
    key: str, out_dir: Path, data: Path, quick: bool = False, seed: int = 0
) -> dict[str, Any]:
    """One of :data:`FAMILY_DEMOS` on the demo data in ``out_dir/<key>``: the keys of :func:`run_demo`.

    The recipe as it is (one epoch at the data's size with RT-DETRv2's plain augmentation: its
    ``stop_epoch`` policy from the first epoch, flip and resize, one size, lr 1e-3), which learns the
    shapes in one epoch on every seed and CPU path, where the strong augmentation does not;
    evaluated at 0.75x, 1x, 1.5x and 2x with the same (EMA) weights.  The README's quick-starts are
    these commands (``tests/docs`` checks that they are).
    """
    name, recipe = FAMILY_DEMOS[key]
    size = DEMO_DATA[quick][2].size
    eval_sizes = [size * 3 // 4, size, size * 3 // 2, size * 2]  # 60, 80, 120, 160
    return _train(name, recipe, data, out_dir / key, size, eval_sizes, ["--seed", str(seed)])


def run_rtdetr_demo(out_dir: Path, data: Path, quick: bool = False, seed: int = 0) -> dict[str, Any]:
    """RT-DETR-PEG's line (:func:`run_family_demo` of ``rtdetr``)."""
    return run_family_demo("rtdetr", out_dir, data, quick, seed)
