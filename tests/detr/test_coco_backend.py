"""faster-coco-eval vs pycocotools: the same 12 numbers on awkward data, through CocoEvaluator and the CLI."""

from __future__ import annotations

import contextlib
import io

import pytest
import torch
from pycocotools.coco import COCO
from torchvision.ops import box_convert

import peg_detr.evaluation
from peg_detr.cli import parse_eval_args, parse_train_args
from peg_detr.cli import train as train_main
from peg_detr.data import SyntheticSpec, make_synthetic_coco
from peg_detr.evaluation import STAT_NAMES, CocoEvaluator, coco_stats, faster_ground_truth
from tools.bench_coco_eval import make_coco_data


def _coco(dataset: dict) -> COCO:
    coco = COCO()
    coco.dataset = dataset
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    return coco


@pytest.fixture(scope="module")
def awkward():
    """60 images of random data that has every case the backends could treat differently."""
    dataset, results = make_coco_data(60, num_classes=5, seed=3)
    anns = dataset["annotations"]
    anns[0]["iscrowd"] = anns[5]["iscrowd"] = 1  # certainly some crowd boxes (besides the random 1%)
    gt_imgs = {a["image_id"] for a in anns}
    det_imgs = {r["image_id"] for r in results}
    # a detection on an image with no ground truth, an image without detections
    dataset["images"].append({"id": 1000, "width": 400, "height": 300})
    results.append({"image_id": 1000, "category_id": 2, "bbox": [10.0, 10.0, 50.0, 40.0], "score": 0.9})
    dataset["images"].append({"id": 1001, "width": 400, "height": 300})
    anns.append({"id": 10**6, "image_id": 1001, "category_id": 1, "bbox": [5.0, 5.0, 80.0, 60.0],
                 "area": 4800.0, "iscrowd": 0})  # fmt: skip
    per_image = {i: sum(r["image_id"] == i for r in results) for i in det_imgs}
    assert any(a["iscrowd"] for a in anns)
    assert {im["id"] for im in dataset["images"]} - gt_imgs, "an image without ground truth"
    assert max(per_image.values()) > 100, "more than maxDets=100 detections on an image"
    assert any(r["category_id"] == 6 for r in results), "a category absent from the ground truth"
    return dataset, results


def test_stats_equal_between_backends(awkward):
    dataset, results = awkward
    coco = _coco(dataset)
    ids = sorted(im["id"] for im in dataset["images"])
    assert 1001 not in {r["image_id"] for r in results}
    ref = coco_stats(coco, results, ids, verbose=False, backend="pycocotools")
    fast = coco_stats(coco, results, ids, verbose=False, backend="faster")
    assert 0.01 < ref["ap"] < 0.9 and ref["ar100"] > ref["ar1"]  # a non-degenerate case
    for k in STAT_NAMES:
        assert fast[k] == pytest.approx(ref[k], abs=1e-9), k
    # a subset of images, and a pre-built faster index (reused by CocoEvaluator)
    sub = ids[::3]
    ref = coco_stats(coco, results, sub, verbose=False, backend="pycocotools")
    fast = coco_stats(faster_ground_truth(coco), results, sub, verbose=False, backend="faster")
    assert [fast[k] for k in STAT_NAMES] == pytest.approx([ref[k] for k in STAT_NAMES], abs=1e-9)
    # results and ground truth are left as they were (loadRes adds keys to what it gets)
    assert set(results[0]) == {"image_id", "category_id", "bbox", "score"}
    with pytest.raises(ValueError, match="backend"):
        coco_stats(coco, results, ids, verbose=False, backend="fast")  # type: ignore[arg-type]


def test_evaluator_backends_agree(awkward, capsys):
    dataset, results = awkward
    coco = _coco(dataset)
    preds: dict[int, dict[str, torch.Tensor]] = {im["id"]: {} for im in dataset["images"]}
    for i in preds:
        rs = [r for r in results if r["image_id"] == i]
        boxes = torch.tensor([r["bbox"] for r in rs], dtype=torch.float64).reshape(-1, 4)
        preds[i] = {
            "scores": torch.tensor([r["score"] for r in rs]),
            "labels": torch.tensor([r["category_id"] for r in rs], dtype=torch.int64),
            "boxes": box_convert(boxes, "xywh", "xyxy").float(),
        }
    stats = {}
    for backend in ("pycocotools", "faster"):
        ev = CocoEvaluator(coco, backend=backend)
        ev.update(preds)
        stats[backend] = ev.summarize(verbose=True)
        assert "Average Precision" in capsys.readouterr().out
    for k in STAT_NAMES:
        assert stats["faster"][k] == pytest.approx(stats["pycocotools"][k], abs=1e-9), k
    assert stats["faster"]["ap"] > 0.01
    assert CocoEvaluator(coco).backend == "faster"


def test_flag_parsed_with_faster_default(tmp_path):
    base = ["--data-root", str(tmp_path)]
    assert parse_train_args(base).coco_eval_backend == "faster"
    assert parse_train_args([*base, "--coco-eval-backend", "pycocotools"]).coco_eval_backend == "pycocotools"
    assert parse_eval_args(["--checkpoint", "x.pth"]).coco_eval_backend == "faster"
    with pytest.raises(SystemExit) as e:
        parse_eval_args(["--checkpoint", "x.pth", "--coco-eval-backend", "fast"])
    assert e.value.code == 2


def test_flag_reaches_the_evaluator(tmp_path, monkeypatch):
    """A one-epoch tiny run, evaluated by `eval` with each backend: the backend is used, numbers equal."""
    spec = SyntheticSpec(size=48, num_classes=2, min_objects=1, max_objects=2, min_frac=0.3, max_frac=0.5)
    data = make_synthetic_coco(tmp_path / "data", num_train=4, num_val=4, seed=1, spec=spec)
    out = tmp_path / "run"
    train_main([
        "--data-root", str(data), "--output-dir", str(out), "--epochs", "1", "--backbone", "tiny",
        "--hidden-dim", "16", "--num-heads", "2", "--enc-layers", "1", "--dec-layers", "1",
        "--dim-feedforward", "32", "--num-queries", "5", "--train-sizes", "48", "--max-size", "64",
        "--crop-resize", "off", "--val-size", "48", "--total-batch-size", "4", "--workers", "0",
        "--no-progress", "--coco-eval-backend", "pycocotools",
    ])  # fmt: skip
    used: list[str] = []
    real = peg_detr.evaluation.coco_stats

    def spy(*args, **kwargs):
        used.append(kwargs["backend"])
        return real(*args, **kwargs)

    monkeypatch.setattr(peg_detr.evaluation, "coco_stats", spy)
    reports = {}
    for backend in ("pycocotools", "faster"):
        argv = ["--checkpoint", str(out / "checkpoint.pth"), "--output-dir", str(tmp_path / backend),
                "--workers", "0", "--no-progress", "--coco-eval-backend", backend]  # fmt: skip
        reports[backend] = peg_detr.cli.evaluate(argv)["eval"]
    assert used == ["pycocotools", "faster"]
    for k in STAT_NAMES:
        assert reports["faster"][k] == pytest.approx(reports["pycocotools"][k], abs=1e-9), k
