"""COCO evaluator: same numbers as pycocotools called directly; AP independent of the eval batch size."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import torch
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval
from torch.utils.data import DataLoader

from peg_core.engine import RunContext, SkipBroken, skipping_collate
from peg_core.engine.distributed import DistInfo
from peg_detr import build_detr
from peg_detr.data import CocoDetr, SyntheticSpec, collate_detr, make_synthetic_coco, make_val_transforms
from peg_detr.evaluation import STAT_NAMES, CocoEvaluator, coco_stats, evaluate_coco, to_coco_results

# one intra-op thread for the module and its fixtures (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("one_thread_module")


@pytest.fixture(scope="module")
def gt_root(tmp_path_factory):
    spec = SyntheticSpec(size=96, min_size=48, num_classes=3, min_objects=0, max_objects=4, min_frac=0.1)
    return make_synthetic_coco(tmp_path_factory.mktemp("gt"), num_train=1, num_val=10, seed=5, spec=spec)


def _gt(root) -> COCO:
    with contextlib.redirect_stdout(io.StringIO()):
        return COCO(str(root / "annotations" / "instances_val2017.json"))


def _noisy_predictions(coco: COCO, seed: int = 0) -> dict[int, dict[str, torch.Tensor]]:
    """GT boxes jittered (some with a wrong class) plus random false positives, xyxy absolute."""
    g = torch.Generator().manual_seed(seed)
    preds = {}
    for image_id in coco.getImgIds():
        anns = coco.loadAnns(coco.getAnnIds(imgIds=[image_id]))
        boxes, labels = [], []
        for a in anns:
            x, y, w, h = a["bbox"]
            jitter = (torch.rand(4, generator=g) - 0.5) * 0.3 * torch.tensor([w, h, w, h])
            boxes.append(torch.tensor([x, y, x + w, y + h]) + jitter)
            labels.append(a["category_id"] if torch.rand((), generator=g) > 0.2 else 1 + a["category_id"] % 3)
        for _ in range(3):
            xy = torch.rand(2, generator=g) * 80
            boxes.append(torch.cat([xy, xy + 10 + torch.rand(2, generator=g) * 30]))
            labels.append(int(torch.randint(1, 4, (), generator=g)))
        preds[image_id] = {
            "boxes": torch.stack(boxes),
            "labels": torch.tensor(labels),
            "scores": torch.rand(len(boxes), generator=g),
        }
    return preds


def _direct(coco: COCO, results_file) -> list[float]:
    with contextlib.redirect_stdout(io.StringIO()):
        ev = COCOeval(coco, coco.loadRes(str(results_file)), iouType="bbox")
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return [float(v) for v in ev.stats]


def test_numbers_equal_direct_pycocotools(gt_root, tmp_path, capsys):
    coco = _gt(gt_root)
    preds = _noisy_predictions(coco)
    ev = CocoEvaluator(coco)
    ev.update(dict(list(preds.items())[:5]))
    ev.update(dict(list(preds.items())[5:]))
    ev.update(dict(list(preds.items())[:2]))  # a repeated image (distributed padding) counts once
    stats = ev.summarize()
    assert "Average Precision  (AP) @[ IoU=0.50:0.95" in capsys.readouterr().out
    path = ev.write_results(tmp_path / "results.json")
    assert len(json.loads(path.read_text())) == sum(len(p["scores"]) for p in preds.values())
    assert list(stats) == list(STAT_NAMES)
    # default backend faster-coco-eval: equal to pycocotools up to float summation order
    assert [stats[k] for k in STAT_NAMES] == pytest.approx(_direct(coco, path), abs=1e-9)
    assert 0.05 < stats["ap"] < 0.95 and stats["ap50"] > stats["ap75"]  # a real, partial score


def test_perfect_and_empty_predictions(gt_root):
    coco = _gt(gt_root)
    perfect = {}
    for image_id in coco.getImgIds():
        anns = coco.loadAnns(coco.getAnnIds(imgIds=[image_id]))
        xywh = torch.tensor([a["bbox"] for a in anns]).reshape(-1, 4)
        perfect[image_id] = {
            "boxes": torch.cat([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], 1),
            "labels": torch.tensor([a["category_id"] for a in anns], dtype=torch.int64),
            "scores": torch.ones(len(anns)),
        }
    ev = CocoEvaluator(coco)
    ev.update(perfect)
    stats = ev.summarize(verbose=False)
    assert stats["ap"] == pytest.approx(1.0) and stats["ar100"] == pytest.approx(1.0)
    assert coco_stats(coco, [], coco.getImgIds(), verbose=False) == dict.fromkeys(STAT_NAMES, 0.0)
    with pytest.raises(RuntimeError, match="no image"):
        CocoEvaluator(coco).summarize()


def test_to_coco_results_boxes_are_xywh():
    res = to_coco_results(
        {
            7: {
                "boxes": torch.tensor([[10.0, 20.0, 40.0, 60.0]]),
                "labels": torch.tensor([3]),
                "scores": torch.tensor([0.5]),
            }
        }
    )
    assert res == [{"image_id": 7, "category_id": 3, "bbox": [10.0, 20.0, 30.0, 40.0], "score": 0.5}]


def _tiny_peg():
    torch.manual_seed(0)
    model, _, post = build_detr(
        "tiny",
        "peg",
        num_classes=4,
        num_queries=8,
        hidden_dim=32,
        num_heads=2,
        enc_layers=1,
        dec_layers=1,
        dim_feedforward=64,
        dropout=0.0,
    )
    # Non-trivial PEG weights: a zero-initialised PEG would hide padding leaks.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "peg" in name:
                p.normal_(0, 0.2)
    return model.eval(), post


def test_ap_independent_of_eval_batch_size(gt_root, tmp_path):
    """Images of mixed sizes (multiples of 16): batch 1 (no padding) vs batch 4 (padding + mask).

    The tiny backbone has no stride-1 convolution, so with sides that are
    multiples of 16 padding does not leak into real features; what remains is
    float summation order, hence the small tolerance.
    """
    model, post = _tiny_peg()
    assert any("peg" in n for n, _ in model.named_parameters())
    ds = CocoDetr(
        gt_root / "val2017", gt_root / "annotations" / "instances_val2017.json", make_val_transforms(None)
    )
    sizes = {tuple(ds.coco.imgs[i][k] for k in ("height", "width")) for i in ds.ids}
    assert len(sizes) > 3

    def run(batch_size):
        loader = DataLoader(ds, batch_size, collate_fn=collate_detr)
        if batch_size == 1:  # also through evaluate_coco, as train / eval run it
            ctx = RunContext(DistInfo(), tmp_path, show_progress=False)
            skipping = DataLoader(SkipBroken(ds), 1, collate_fn=skipping_collate(collate_detr))
            stats = evaluate_coco(model, post, skipping, ds.coco, ctx, "val", len(ds))
            assert stats.pop("images") == len(ds) and ctx.broken["val"].count == 0
        ev = CocoEvaluator(ds.coco)
        with torch.no_grad():
            for batch, targets in loader:
                assert batch_size == 1 or batch.mask.any()
                res = post(model(batch), torch.stack([t["orig_size"] for t in targets]))
                ev.update({int(t["image_id"]): r for t, r in zip(targets, res)})
        if batch_size == 1:
            assert ev.summarize(verbose=False) == stats
        return ev.predictions, ev.summarize(verbose=False)

    single, stats1 = run(1)
    padded, stats4 = run(4)
    assert sorted(single) == sorted(padded) == sorted(ds.ids)
    for image_id, r in single.items():
        torch.testing.assert_close(padded[image_id]["scores"], r["scores"], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(padded[image_id]["boxes"], r["boxes"], atol=1e-3, rtol=1e-4)
        assert torch.equal(padded[image_id]["labels"], r["labels"])
    for k in STAT_NAMES:
        assert stats4[k] == pytest.approx(stats1[k], abs=1e-6)
