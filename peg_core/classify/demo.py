"""The classify part of ``make demo``: ``--config demo`` trained and evaluated at four sizes.

Equivalent to::

    python -m peg_core train --config demo --output-dir OUT
    python -m peg_core eval --checkpoint OUT/checkpoint.pth --eval-sizes 36,48,72,96 --output-dir OUT/eval
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from .cli import evaluate, train
from .configs import CONFIGS
from .model import scaled_sizes
from .shapes import NUM_CLASSES

__all__ = ["run_demo"]


def run_demo(out_dir: str | os.PathLike, quick: bool = False, seed: int = 0) -> dict[str, Any]:
    """Train the small CPVT-PEG on the generated shapes; evaluate it at 0.75x..2x the training size.

    6 epochs of 2048 images at 48 px (768 steps of batch 16; ``quick``: 2 epochs of 512, near chance); ``seed``
    is the training run's ``--seed`` (initialisation and data order; the data are the same).
    Writes ``classify.json`` to ``out_dir`` (the run's checkpoint, logs and report.json too) and returns
    ``{"top1", "top5", "top1_by_size", "train_size", "chance", "epochs", "final_loss", "seconds"}``.
    """
    t0 = time.time()
    out_dir = Path(out_dir)
    config = "demo_quick" if quick else "demo"
    size = CONFIGS[config]["img_size"]
    sizes = ",".join(str(s) for s in scaled_sizes(size))
    # --overwrite: a demo run replaces the one an earlier `make demo` left in out_dir
    trained = train(["--config", config, "--output-dir", str(out_dir), "--workers", "0", "--seed", str(seed),
                     "--overwrite"])  # fmt: skip
    checked = evaluate([
        "--checkpoint", str(out_dir / "checkpoint.pth"), "--eval-sizes", sizes,
        "--output-dir", str(out_dir / "eval"), "--workers", "0",
    ])["eval"]  # fmt: skip
    by_size = {int(s): v for s, v in checked["top1_by_size"].items()}
    result = {
        "top1": by_size[size],
        "top5": checked.get("top5_by_size", {}).get(str(size)),
        "top1_by_size": by_size,
        "train_size": size,
        "chance": 1.0 / NUM_CLASSES,
        "epochs": CONFIGS[config]["epochs"],
        "final_loss": trained["train"].get("loss"),
        "seconds": round(time.time() - t0, 1),
    }
    (out_dir / "classify.json").write_text(json.dumps({**result, "train": trained["train"]}, indent=2) + "\n")
    print("classify (CPVT-PEG, generated shapes): " + ", ".join(f"{s}px {a:.3f}" for s, a in by_size.items()))
    return result
