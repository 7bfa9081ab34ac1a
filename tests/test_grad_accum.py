"""``--grad-accum-steps N``: N micro-batches per optimizer step equal the N-times batch.

The engine's split (:func:`peg_core.engine.accum.split_batch`), the DETR family's box
normalisation by the step's boxes (each criterion's ``num_boxes``), and whole runs of the
classifier and the video ViT: the epoch losses and the final weights of ``--batch-size 2B`` and
of ``--batch-size B --grad-accum-steps 2`` agree within float tolerance.
"""

from __future__ import annotations

import json

import pytest
import torch

from peg_core.engine.accum import batch_length, split_batch
from peg_detr.models import SetCriterion
from peg_detr.models.dfine.criterion import DFineCriterion
from peg_detr.models.matcher import HungarianMatcher
from peg_detr.models.rtdetr.criterion import RTDETRCriterion
from peg_detr.structures import ImageBatch

# ------------------------------------------------------------------------------------------ split


def test_split_batch_structures():
    x, y = torch.arange(10).view(5, 2), torch.arange(5)
    parts = split_batch([x, y], 2)
    assert [n for _, n in parts] == [3, 2]
    assert torch.equal(parts[1][0][0], x[3:]) and torch.equal(parts[1][0][1], y[3:])
    # DETR: (ImageBatch, [target dict per image]); video: a dict with a per-sample list
    targets = [{"labels": torch.zeros(i + 1), "boxes": torch.zeros(i + 1, 4)} for i in range(3)]
    batch = (ImageBatch(torch.zeros(3, 3, 4, 4), torch.zeros(3, 4, 4, dtype=torch.bool)), targets)
    (first, n0), (second, n1) = split_batch(batch, 2)
    assert (n0, n1) == (2, 1) and first[0].tensors.shape[0] == 2 and first[1] == targets[:2]
    assert second[1][0] is targets[2] and isinstance(second[0], ImageBatch)
    video = {"video": torch.zeros(4, 3, 2, 8, 8), "label": torch.arange(4), "path": list("abcd")}
    micro = [b for b, _ in split_batch(video, 4)]
    assert [m["path"] for m in micro] == [["a"], ["b"], ["c"], ["d"]] and batch_length(video) == 4
    assert len(split_batch([x, y], 9)) == 5  # never an empty micro-batch


# ------------------------------------------------------------------- DETR-family box normalisation


def _target(g: torch.Generator, n: int, classes: int) -> dict[str, torch.Tensor]:
    centre = 0.3 + 0.4 * torch.rand(n, 2, generator=g)
    return {
        "labels": torch.randint(classes, (n,), generator=g),
        "boxes": torch.cat([centre, 0.1 + 0.2 * torch.rand(n, 2, generator=g)], 1),
    }


def _slice(outputs, start, stop):
    """Images ``start:stop`` of a criterion's outputs (tensors over images; lists of layers)."""
    if isinstance(outputs, torch.Tensor):
        return outputs[start:stop] if outputs.dim() >= 2 else outputs
    if isinstance(outputs, dict):
        return {k: _slice(v, start, stop) for k, v in outputs.items()}
    if isinstance(outputs, list):
        return [_slice(v, start, stop) for v in outputs]
    return outputs


def _outputs(g, images, queries, classes, layers=2, corners=0):
    def layer():
        out = {
            "pred_logits": torch.randn(images, queries, classes, generator=g),
            "pred_boxes": torch.cat(
                [
                    0.3 + 0.4 * torch.rand(images, queries, 2, generator=g),
                    0.1 + 0.2 * torch.rand(images, queries, 2, generator=g),
                ],
                -1,
            ),
        }
        if corners:
            out["pred_corners"] = torch.randn(images, queries, 4 * (corners + 1), generator=g)
            out["ref_points"] = out["pred_boxes"].clone()
        return out

    main = layer()
    main["aux_outputs"] = [layer() for _ in range(layers - 1)]
    return main


def _criteria():
    matcher = HungarianMatcher(1.0, 5.0, 2.0)
    yield (
        "detr",
        SetCriterion(
            4, matcher, {"loss_bbox": 5.0, "loss_giou": 2.0, "loss_bbox_0": 5.0, "loss_giou_0": 2.0}, 1.0
        ),
        4,
    )
    yield "rtdetr", RTDETRCriterion(4, dec_layers=2), 4
    dfine = DFineCriterion(4, losses=("vfl", "boxes"), reg_max=8, use_uni_set=False, dec_layers=2)
    yield "dfine", dfine, 4


@pytest.mark.parametrize("name", ["detr", "rtdetr", "dfine"])
def test_micro_batches_normalised_by_the_steps_boxes_equal_the_large_batch(name):
    """Box losses of micro-batches normalised by ``share x`` the step's boxes, times ``share``, sum to the large batch's."""
    crit, classes = next((c, k) for n, c, k in _criteria() if n == name)
    g = torch.Generator().manual_seed(0)
    counts = [3, 1, 4, 2]  # boxes per image: the micro-batches' counts differ
    targets = [_target(g, n, classes) for n in counts]
    outputs = _outputs(g, 4, 6, classes + (1 if name == "detr" else 0))
    if name == "dfine":
        for o in [outputs, *outputs["aux_outputs"]]:
            o.update(pred_corners=torch.randn(4, 6, 36, generator=g), ref_points=o["pred_boxes"].clone())
        outputs.update(up=torch.tensor([0.5]), reg_scale=torch.tensor([4.0]))
    large = crit(outputs, targets)
    keys = [k for k in crit.weight_dict if k in large and ("bbox" in k or "giou" in k or "vfl" in k)]
    assert len(keys) >= 4
    total = float(sum(counts))
    for split in ([(0, 2), (2, 4)], [(0, 1), (1, 4)]):
        summed = dict.fromkeys(keys, 0.0)
        for a, b in split:
            share = (b - a) / 4
            micro = crit(_slice(outputs, a, b), targets[a:b], num_boxes=torch.tensor(total * share))
            for k in keys:
                summed[k] += share * micro[k]
        for k in keys:
            assert torch.allclose(summed[k], large[k], rtol=1e-5, atol=1e-6), (name, k)
        # without the step's count each micro-batch divides by its own boxes: not the large batch's loss
        own = sum((b - a) / 4 * crit(_slice(outputs, a, b), targets[a:b])[keys[0]] for a, b in split)
        assert not torch.allclose(own, large[keys[0]], rtol=1e-3)


# --------------------------------------------------------------------------------------- whole runs


def _weights(path):
    return torch.load(path, map_location="cpu", weights_only=False)["model"]


def _train_losses(out):
    return [
        r["loss"]
        for r in map(json.loads, (out / "log.jsonl").read_text().splitlines())
        if r["tag"] == "train"
    ]


def _assert_same_run(a, b):
    la, lb = _train_losses(a), _train_losses(b)
    assert len(la) == len(lb) == 2 and la == pytest.approx(lb, rel=1e-5, abs=1e-6), (la, lb)
    wa, wb = _weights(a / "checkpoint.pth"), _weights(b / "checkpoint.pth")
    assert wa.keys() == wb.keys()
    for k in wa:
        if wa[k].is_floating_point():
            assert torch.allclose(wa[k], wb[k], rtol=1e-4, atol=1e-5), k
    report_a = json.loads((a / "report.json").read_text())
    report_b = json.loads((b / "report.json").read_text())
    assert report_a["steps"] == report_b["steps"]


def test_classifier_accumulation_equals_the_large_batch(tmp_path):
    from peg_core.__main__ import main
    from tests.core.classify_runs import tiny

    def run(out, *extra):
        argv = tiny(40, 8, "--epochs", "2", "--lr", "1e-3", "--output-dir", str(out), *extra)
        assert main(["train", *argv]) == 0

    run(tmp_path / "large", "--batch-size", "16")  # 40 images: steps of 16, 16 and 8
    run(tmp_path / "accum", "--batch-size", "8", "--grad-accum-steps", "2")
    _assert_same_run(tmp_path / "large", tmp_path / "accum")
    # multi-scale: one side per optimizer step, whatever the micro-batches
    sizes = ("--train-sizes", "16,24,32")
    run(tmp_path / "large_ms", "--batch-size", "16", *sizes)
    run(tmp_path / "accum_ms", "--batch-size", "8", "--grad-accum-steps", "2", *sizes)
    _assert_same_run(tmp_path / "large_ms", tmp_path / "accum_ms")


def test_video_accumulation_equals_the_large_batch(tmp_path):
    from peg_video.__main__ import main
    from tests.video.runs import TINY, synthetic_set

    data = synthetic_set(tmp_path / "data", 10, 4)

    def run(out, *extra):
        argv = ["train", "--train-ann", str(data / "train.csv"), "--val-ann", str(data / "val.csv"),
                "--output-dir", str(out), *TINY, "--epochs", "2", "--device", "cpu", "--threads", "1", *extra]  # fmt: skip
        assert main(argv) == 0

    run(tmp_path / "large", "--batch-size", "6")
    run(tmp_path / "accum", "--batch-size", "3", "--grad-accum-steps", "2")
    _assert_same_run(tmp_path / "large", tmp_path / "accum")


def test_rtdetr_run_accumulates_with_the_steps_boxes_and_one_side_per_step(tmp_path, monkeypatch):
    """End to end: RT-DETR with --grad-accum-steps 2 steps once per 2 micro-batches, each normalised by
    the step's boxes (:func:`peg_detr.task.step_num_boxes`), both at the step's multi-scale side."""
    import peg_detr.task as task
    from peg_detr.__main__ import main
    from peg_detr.data import SyntheticSpec, make_synthetic_coco

    spec = SyntheticSpec(size=96, num_classes=3, min_objects=1, max_objects=2, min_frac=0.3, max_frac=0.5)
    data = make_synthetic_coco(tmp_path / "data", num_train=8, num_val=2, seed=1, spec=spec)
    seen = []
    original = task.step_num_boxes

    def spy(ctx):
        value = original(ctx)
        images, targets = ctx.micro.step_batch
        seen.append(
            (
                ctx.micro.index,
                ctx.micro.share,
                images.tensors.shape[-1],
                float(value),
                sum(len(t["labels"]) for t in targets),
            )
        )
        return value

    monkeypatch.setattr(task, "step_num_boxes", spy)
    argv = ["train", "--config", "rtdetr_demo_tiny", "--data-root", str(data), "--output-dir", str(tmp_path / "run"),
            "--epochs", "1", "--batch-size", "2", "--grad-accum-steps", "2", "--workers", "0", "--device", "cpu",
            "--no-progress", "--threads", "1"]  # fmt: skip
    assert main(argv) == 0
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["steps"] == 2 and [i for i, *_ in seen] == [0, 1, 0, 1]
    for _index, share, _side, value, boxes in seen:
        assert share == 0.5 and value == pytest.approx(share * boxes)


def test_resume_keeps_the_runs_accumulation(tmp_path, capsys):
    from peg_core.__main__ import main
    from tests.core.classify_runs import one_line_error, tiny

    argv = ["train", *tiny(16, 4, "--epochs", "2", "--output-dir", str(tmp_path))]
    assert main([*argv, "--grad-accum-steps", "2", "--stop-after-epoch", "1"]) == 0
    capsys.readouterr()
    err = one_line_error(capsys, main([*argv, "--resume", "auto"]))
    assert "trained with --grad-accum-steps 2" in err and err.endswith("--grad-accum-steps 1"), err


@pytest.mark.slow
def test_two_process_accumulation_equals_the_large_batch(tmp_path, prewarmed):
    """torchrun, 2 processes (gloo): DDP syncs the gradients once per optimizer step, after the micro-batches.

    The launcher is forked from the prewarmed server (``tests/prewarmed.py``); its workers are fresh processes."""
    import os
    from pathlib import Path

    from tests.core.classify_runs import tiny

    def run(out, *extra):
        args = ["--standalone", "--nproc_per_node", "2", "-m", "peg_core", "train",
                *tiny(40, 8, "--epochs", "2", "--lr", "1e-3", "--output-dir", str(out), *extra)]  # fmt: skip
        proc = prewarmed.run(
            "torch.distributed.run",
            args,
            cwd=Path.cwd(),
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            timeout=300,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    run(tmp_path / "large", "--batch-size", "8")  # per process: 20 images, steps of 8, 8, 4
    run(tmp_path / "accum", "--batch-size", "4", "--grad-accum-steps", "2")
    _assert_same_run(tmp_path / "large", tmp_path / "accum")
