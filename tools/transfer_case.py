"""The README's measured transfer case: classes carried over by name keep what the start learned.

    python -m tools.transfer_case --out runs/transfer

1. A source RT-DETR-PEG (``rtdetr_demo_tiny``, the recipe as it is) trained on the demo's shapes
   (1,024 images at 80 px; :data:`peg_detr.demo.DEMO_DATA`), evaluated on their 100 validation images.
2. The same images relabelled as a user's data set would name them: other category ids (9, 4, 6),
   another order, other case and spacing (``SQUARE``, ``  Triangle``) and one synonym (``circle``, mapped
   to the source's ``disc`` by ``--class-map``).
3. ``kept``: fine-tuned from the source's checkpoint on 16 of those images at a learning rate far too
   small to learn a classifier (1e-9): its AP50 is the source's, because every class kept its rows.
4. ``fresh``: the same with names that match none of the source's (apple, banana, cherry): every
   class row starts fresh (the focal prior), and AP50 is near zero.

The numbers are printed as one table and written to ``OUT/transfer.json``; ``tests/tools`` checks
the two claims and the README quotes a run.  Nothing here is a library: it drives ``python -m
peg_detr train`` as a user would.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

from peg_core.engine import read_checkpoint
from peg_core.jsonfile import read_json
from peg_detr.cli import train
from peg_detr.demo import DEMO_DATA, make_demo_data

#: source category -> (new id, new name) of the relabelled set that keeps its classes
KEPT = {"square": (9, "SQUARE"), "disc": (4, "circle"), "triangle": (6, "  Triangle")}
#: the synonym a user maps by hand (``--class-map``)
CLASS_MAP = {"circle": "disc"}
#: the same ids with names the source does not know
FRESH = {"square": (9, "apple"), "disc": (4, "banana"), "triangle": (6, "cherry")}
#: training images of the fine-tuning set (a few steps: the learning rate makes them no-ops)
FINETUNE_IMAGES = 16
#: the fine-tuning learning rate: far too small to learn a classifier in 4 steps
TINY_LR = "1e-9"


def relabel_set(source: Path, out: Path, names: dict[str, tuple[int, str]], num_train: int) -> Path:
    """``source`` (COCO layout) under new category ids / names, its first ``num_train`` training images; returns ``out``.

    The image folders are symbolic links to the source's: the pictures are the same.
    """
    (out / "annotations").mkdir(parents=True, exist_ok=True)
    for split, limit in (("train", num_train), ("val", None)):
        doc = read_json(source / "annotations" / f"instances_{split}2017.json", "annotation file", kind=dict)
        new_id = {c["id"]: names[c["name"]][0] for c in doc["categories"]}
        images = sorted(doc["images"], key=lambda im: im["id"])[:limit]
        kept = {im["id"] for im in images}
        doc = {
            **doc,
            "images": images,
            "annotations": [
                {**a, "category_id": new_id[a["category_id"]]}
                for a in doc["annotations"]
                if a["image_id"] in kept
            ],
            # another order than the ids': the data set lists its classes as it likes
            "categories": [
                {"id": names[c["name"]][0], "name": names[c["name"]][1], "supercategory": "fruit"}
                for c in reversed(doc["categories"])
            ],
        }
        (out / "annotations" / f"instances_{split}2017.json").write_text(json.dumps(doc))
        link = out / f"{split}2017"
        if not link.exists():
            os.symlink((source / f"{split}2017").resolve(), link, target_is_directory=True)
    return out


def _run(argv: list[str], quiet: bool) -> dict[str, Any]:
    threads = torch.get_num_threads()
    try:
        if quiet:
            with open(os.devnull, "w") as sink:
                stdout, sys.stdout = sys.stdout, sink
                try:
                    return train(argv)
                finally:
                    sys.stdout = stdout
        return train(argv)
    finally:
        torch.set_num_threads(threads)


def run_transfer_case(out: Path, seed: int = 0, quiet: bool = True) -> dict[str, Any]:
    """Train the source, then fine-tune ``kept`` and ``fresh`` from it; their headline AP50 at 80 px."""
    out = Path(out)
    data = make_demo_data(out / "data")
    size = DEMO_DATA[False][2].size
    common = ["--config", "rtdetr_demo_tiny", "--val-size", str(size), "--eval-sizes", str(size), "--workers", "0",
              "--threads", "1", "--no-progress", "--seed", str(seed), "--overwrite"]  # fmt: skip
    source = _run(["--data-root", str(data), "--output-dir", str(out / "source"), *common], quiet)
    checkpoint = out / "source" / "checkpoint.pth"
    (out / "class_map.json").write_text(json.dumps(CLASS_MAP))
    result: dict[str, Any] = {"source": {"ap50": source["eval"]["ap50"], "ap": source["eval"]["ap"]}}
    for name, names, extra in (
        ("kept", KEPT, ["--class-map", str(out / "class_map.json")]),
        ("fresh", FRESH, []),
    ):
        relabelled = relabel_set(data, out / f"data_{name}", names, FINETUNE_IMAGES)
        report = _run(
            ["--data-root", str(relabelled), "--output-dir", str(out / name), "--init", str(checkpoint),
             "--lr", TINY_LR, "--lr-backbone", TINY_LR, *extra, *common],
            quiet,
        )  # fmt: skip
        result[name] = {"ap50": report["eval"]["ap50"], "ap": report["eval"]["ap"]}
        meta = read_checkpoint(out / name / "checkpoint.pth", "detect")["meta"]
        result[name]["classes"] = meta["init_classes"]
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.transfer_case", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("runs/transfer"), help="data, runs and transfer.json")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    result = run_transfer_case(args.out, args.seed)
    (args.out / "transfer.json").write_text(json.dumps(result, indent=1))
    print("| start | AP50 at 80 px |\n|---|---|")
    print(f"| source (trained on the shapes) | {result['source']['ap50']:.3f} |")
    print(
        f"| kept: relabelled, names matched (one by --class-map), lr {TINY_LR} | {result['kept']['ap50']:.3f} |"
    )
    print(f"| fresh: names that match nothing, lr {TINY_LR} | {result['fresh']['ap50']:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
