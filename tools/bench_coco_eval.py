"""Time COCO bbox evaluation: pycocotools vs faster-coco-eval on the same generated data.

    python tools/bench_coco_eval.py            # COCO-val size: 5,000 images, ~7 gt / ~100 detections each
    python tools/bench_coco_eval.py --quick    # 200 images, a few seconds

The data is generated in-process (seedable): 80 categories, ~1% crowd boxes,
some images without ground truth, detections jittered around the ground truth
plus random false positives (a few of categories absent from the ground truth).
Each backend runs ``peg_detr.evaluation.coco_stats`` (result loading, evaluate,
accumulate, summarize; the faster backend also indexes the ground truth); the
script prints a Markdown table with wall and CPU seconds and the speed-ups, and fails if the
12 numbers differ by more than 1e-9.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import time
from typing import Any

import numpy as np
from pycocotools.coco import COCO

from peg_detr.evaluation import STAT_NAMES, coco_stats

__all__ = ["main", "make_coco_data", "run_bench"]


def make_coco_data(
    num_images: int,
    gt_per_image: float = 7.0,
    dets_per_image: float = 100.0,
    num_classes: int = 80,
    seed: int = 0,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(ground-truth dataset dict, results list)`` of random COCO-like data.

    Ground truth: Poisson(``gt_per_image``) boxes per image (so some images have none), ~1%
    ``iscrowd=1``, sizes spanning COCO's small/medium/large areas, category ids
    ``1..num_classes``.  Detections: Poisson(``dets_per_image``) per image, about a third
    jittered copies of ground-truth boxes, the rest random, 2% of category ``num_classes + 1``
    (absent from the ground truth); a few images get none.
    """
    rng = np.random.default_rng(seed)
    images, anns, results = [], [], []
    categories = [{"id": c, "name": f"c{c}"} for c in range(1, num_classes + 1)]
    for image_id in range(1, num_images + 1):
        w, h = int(rng.integers(320, 641)), int(rng.integers(320, 641))
        images.append({"id": image_id, "width": w, "height": h, "file_name": f"{image_id:012d}.jpg"})
        n_gt = int(rng.poisson(gt_per_image))
        # log-uniform sides give small (<32^2), medium and large (>96^2) boxes
        bw = np.exp(rng.uniform(np.log(4), np.log(w * 0.8), n_gt))
        bh = np.exp(rng.uniform(np.log(4), np.log(h * 0.8), n_gt))
        bx, by = rng.uniform(0, w - bw), rng.uniform(0, h - bh)
        cats = rng.integers(1, num_classes + 1, n_gt)
        crowd = rng.random(n_gt) < 0.01
        for i in range(n_gt):
            anns.append(
                {
                    "id": len(anns) + 1,
                    "image_id": image_id,
                    "category_id": int(cats[i]),
                    "bbox": [float(bx[i]), float(by[i]), float(bw[i]), float(bh[i])],
                    "area": float(bw[i] * bh[i]),
                    "iscrowd": int(crowd[i]),
                }
            )
        n_det = 0 if rng.random() < 0.02 else int(rng.poisson(dets_per_image))
        for _ in range(n_det):
            if n_gt and rng.random() < 0.35:  # near a ground-truth box, usually of its class
                j = int(rng.integers(n_gt))
                s = 1 + rng.normal(0, 0.15, 2)
                dw, dh = bw[j] * abs(s[0]) + 1, bh[j] * abs(s[1]) + 1
                dx, dy = bx[j] + rng.normal(0, 0.1) * bw[j], by[j] + rng.normal(0, 0.1) * bh[j]
                cat = int(cats[j]) if rng.random() < 0.8 else int(rng.integers(1, num_classes + 1))
                score = float(rng.uniform(0.3, 1.0))
            else:
                dw, dh = rng.uniform(2, w / 2), rng.uniform(2, h / 2)
                dx, dy = rng.uniform(0, w - dw), rng.uniform(0, h - dh)
                cat = num_classes + 1 if rng.random() < 0.02 else int(rng.integers(1, num_classes + 1))
                score = float(rng.uniform(0.0, 0.7))
            results.append(
                {
                    "image_id": image_id,
                    "category_id": cat,
                    "bbox": [float(dx), float(dy), float(dw), float(dh)],
                    "score": score,
                }
            )
    gt = {"images": images, "annotations": anns, "categories": categories}
    return gt, results


def run_bench(num_images: int, seed: int = 0, repeat: int = 1) -> dict[str, Any]:
    """Generate the data, time both backends (best of ``repeat``); ``{"seconds", "stats", "max_diff", ...}``."""
    dataset, results = make_coco_data(num_images, seed=seed)
    coco_gt = COCO()
    coco_gt.dataset = dataset
    with contextlib.redirect_stdout(io.StringIO()):  # "creating index..."
        coco_gt.createIndex()
    image_ids = [im["id"] for im in dataset["images"]]
    seconds: dict[str, float] = {}
    cpu: dict[str, float] = {}  # process CPU time: less disturbed than wall time on a shared machine
    stats: dict[str, dict[str, float]] = {}
    for backend in ("pycocotools", "faster"):
        seconds[backend] = cpu[backend] = float("inf")
        for _ in range(repeat):
            t0, c0 = time.perf_counter(), time.process_time()
            stats[backend] = coco_stats(coco_gt, results, image_ids, verbose=False, backend=backend)
            seconds[backend] = min(seconds[backend], time.perf_counter() - t0)
            cpu[backend] = min(cpu[backend], time.process_time() - c0)
    max_diff = max(abs(stats["faster"][k] - stats["pycocotools"][k]) for k in STAT_NAMES)
    return {
        "images": num_images,
        "gt_boxes": len(dataset["annotations"]),
        "detections": len(results),
        "seconds": seconds,
        "cpu_seconds": cpu,
        "stats": stats,
        "max_diff": max_diff,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="200 images instead of 5,000")
    p.add_argument("--images", type=int, help="number of images (overrides --quick)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=1, help="best of this many runs per backend")
    a = p.parse_args(argv)
    n = a.images or (200 if a.quick else 5000)
    r = run_bench(n, a.seed, a.repeat)
    sec, cpu = r["seconds"], r["cpu_seconds"]
    print(f"{r['images']} images, {r['gt_boxes']} gt boxes, {r['detections']} detections (seed {a.seed})")
    print("| backend | seconds | speed-up | CPU seconds | CPU speed-up |")
    print("|---|---:|---:|---:|---:|")
    print(f"| pycocotools | {sec['pycocotools']:.2f} | 1.0x | {cpu['pycocotools']:.2f} | 1.0x |")
    print(
        f"| faster-coco-eval | {sec['faster']:.2f} | {sec['pycocotools'] / sec['faster']:.1f}x "
        f"| {cpu['faster']:.2f} | {cpu['pycocotools'] / cpu['faster']:.1f}x |"
    )
    print(f"AP {r['stats']['faster']['ap']:.4f}; max |stat difference| {r['max_diff']:.2e}")
    if r["max_diff"] > 1e-9:
        print("error: the backends disagree", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
