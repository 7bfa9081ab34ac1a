"""DEIM's dense one-to-one matching data: mosaic and mixup raise the targets per image, on schedule.

Hand-checked mosaics of coloured rectangles (boxes follow the pixels, degenerate and cut boxes are
dropped, crowd flags and masks stay with their boxes), the batch mixup's ratio and targets, the
epoch windows, seeding independent of ``--workers``, and the off state equal to the plain pipeline.
"""

from __future__ import annotations

import argparse
import json
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from peg_core.engine import SkipBroken, skipping_collate
from peg_core.errors import InputError
from peg_detr.data import (
    CocoDetr,
    MultiScaleCollate,
    SyntheticSpec,
    make_rtdetr_train_transforms,
    make_synthetic_coco,
)
from peg_detr.data.dense_o2o import (
    DenseO2O,
    MixupCollate,
    Mosaic,
    MosaicDataset,
    active_augmentations,
    dense_o2o_from_args,
    make_mosaic_transforms,
    mixup_batch,
)
from peg_detr.data.transforms import make_boxes
from peg_detr.task import _train_loader, _train_set

BACKGROUND = 10
RED, GREEN, BLUE, YELLOW, MAGENTA = (200, 0, 0), (0, 200, 0), (0, 0, 200), (200, 200, 0), (200, 0, 200)


def _tile(h: int, w: int, rects: list[tuple[tuple[float, ...], tuple[int, int, int] | None, int]]):
    """A ``(3, h, w)`` uint8 image with filled rectangles and its target (boxes, labels, iscrowd, masks).

    ``rects``: ``((x0, y0, x1, y1), colour or None for a box not drawn, label)``; ``iscrowd`` is
    ``label % 2`` and each mask is 1 inside its (integer part of the) box.
    """
    image = torch.full((3, h, w), BACKGROUND, dtype=torch.uint8)
    masks = torch.zeros(len(rects), h, w, dtype=torch.uint8)
    for k, ((x0, y0, x1, y1), colour, _) in enumerate(rects):
        if colour is not None:
            image[:, int(y0) : int(y1), int(x0) : int(x1)] = torch.tensor(colour, dtype=torch.uint8)[
                :, None, None
            ]
        masks[k, int(y0) : int(y1), int(x0) : int(x1)] = 1
    labels = torch.tensor([label for *_, label in rects], dtype=torch.int64)
    target = {
        "boxes": make_boxes(torch.tensor([r for r, *_ in rects], dtype=torch.float32), (h, w)),
        "labels": labels,
        "iscrowd": labels % 2,
        "masks": tv_tensors.Mask(masks),
        "image_id": torch.tensor(7),
    }
    return image, target


def _four_tiles():
    """Four tiles (one 16 px high, one 16 px wide) with 7 boxes, 2 of them degenerate."""
    return [
        _tile(20, 20, [((2, 2, 8, 8), RED, 1), ((10, 10, 10, 15), None, 9)]),  # zero width
        _tile(16, 20, [((0, 0, 5, 5), GREEN, 2), ((12, 4, 12.5, 10), None, 8)]),  # 0.5 px wide
        _tile(20, 16, [((3, 3, 13, 9), BLUE, 3)]),
        _tile(20, 20, [((1, 1, 4, 4), YELLOW, 4), ((10, 12, 19, 19), MAGENTA, 5)]),
    ]


def _plain_mosaic(**kw) -> Mosaic:
    return Mosaic(output_size=None, degrees=0.0, translate=None, scale=None, **kw)


def _assert_box_colours(image: torch.Tensor, boxes: torch.Tensor, labels: torch.Tensor) -> None:
    colours = {1: RED, 2: GREEN, 3: BLUE, 4: YELLOW, 5: MAGENTA}
    for (x0, y0, x1, y1), label in zip(boxes.round().int().tolist(), labels.tolist()):
        region = image[:, y0:y1, x0:x1]
        assert region.numel() > 0
        expected = torch.tensor(colours[label], dtype=image.dtype)[:, None, None]
        assert torch.equal(region, expected.expand_as(region)), (label, (x0, y0, x1, y1))


def test_mosaic_hand_checked_boxes_follow_pixels_and_degenerate_ones_are_dropped():
    image, target = _plain_mosaic(min_size=1.0)(_four_tiles())
    # canvas: twice the largest tile sides (20 x 20); tiles at the quadrants' top-left corners
    assert isinstance(image, tv_tensors.Image) and image.shape == (3, 40, 40)
    assert isinstance(target["boxes"], tv_tensors.BoundingBoxes) and target["boxes"].canvas_size == (40, 40)
    expected = torch.tensor(
        [[2, 2, 8, 8], [20, 0, 25, 5], [3, 23, 13, 29], [21, 21, 24, 24], [30, 32, 39, 39]],
        dtype=torch.float32,
    )
    # 7 boxes in, the zero-width and the 0.5 px wide ones out: 2 + 2 + 1 + 2 - 2 = 5 targets
    assert torch.equal(target["boxes"].as_subclass(torch.Tensor), expected)
    assert target["labels"].tolist() == [1, 2, 3, 4, 5]
    _assert_box_colours(image, expected, target["labels"])
    # the 16 px high tile leaves rows 16..20 of its quadrant at the fill value, the 16 px wide one columns
    assert (image[:, 16:20, 20:40] == 0).all() and (image[:, 20:40, 16:20] == 0).all()
    # crowd flags and masks moved and were dropped with their boxes
    assert torch.equal(target["iscrowd"], target["labels"] % 2)
    masks = target["masks"]
    assert isinstance(masks, tv_tensors.Mask) and masks.shape == (5, 40, 40)
    for mask, (x0, y0, x1, y1) in zip(masks, expected.int().tolist()):
        ys, xs = torch.nonzero(mask, as_tuple=True)
        assert (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1) == (x0, y0, x1, y1)
    assert int(target["image_id"]) == 7  # the first sample's


def test_mosaic_blank_tile_and_min_size_rule():
    tiles = _four_tiles()
    image, target = _plain_mosaic(min_size=0.25)([tiles[0], tiles[1], None, tiles[3]])
    # the blank tile contributes nothing; the 0.5 px box passes min_size 0.25, the zero-width one never
    assert target["labels"].tolist() == [1, 2, 8, 4, 5]
    assert (image[:, 20:40, 0:20] == 0).all()
    with pytest.raises(ValueError, match="four"):
        _plain_mosaic()([None, *tiles[1:]])
    # an entry one tile lacks cannot stay aligned with the boxes: left out, not misaligned
    del tiles[2][1]["iscrowd"], tiles[2][1]["masks"]
    _, target = _plain_mosaic()(tiles)
    assert "iscrowd" not in target and "masks" not in target and len(target["labels"]) == 5


class _Shift(v2.Transform):
    """A fixed integer translation (a deterministic stand-in for the mosaic's random affine)."""

    def __init__(self, dx: int, dy: int) -> None:
        super().__init__()
        self.dx, self.dy = dx, dy

    def transform(self, inpt, params):
        return self._call_kernel(
            F.affine, inpt, angle=0.0, translate=[self.dx, self.dy], scale=1.0, shear=[0.0, 0.0], fill=0
        )


@pytest.mark.parametrize("min_visible, kept_red", [(0.4, True), (0.6, False)])
def test_mosaic_clips_cut_boxes_and_drops_mostly_hidden_ones(min_visible, kept_red):
    mosaic = _plain_mosaic(min_visible=min_visible)
    mosaic.affine = _Shift(-5, 0)
    image, target = mosaic(_four_tiles())
    boxes = target["boxes"].as_subclass(torch.Tensor)
    # red (2, 2, 8, 8) -> (-3, 2, 3, 8): half of it stays, clipped to (0, 2, 3, 8)
    # blue (3, 23, 13, 29) -> (-2, 23, 8, 29): 80 % stays; the others stay whole
    expected = [[15, 0, 20, 5], [0, 23, 8, 29], [16, 21, 19, 24], [25, 32, 34, 39]]
    expected_labels = [2, 3, 4, 5]
    if kept_red:
        expected, expected_labels = [[0, 2, 3, 8], *expected], [1, *expected_labels]
    assert boxes.tolist() == expected
    assert target["labels"].tolist() == expected_labels
    assert torch.equal(target["iscrowd"], target["labels"] % 2) and len(target["masks"]) == len(boxes)
    assert (boxes >= 0).all() and (boxes[:, 0::2] <= 40).all() and (boxes[:, 1::2] <= 40).all()
    _assert_box_colours(image, boxes, target["labels"])


def test_mosaic_random_affine_keeps_boxes_inside_and_entries_aligned():
    mosaic = Mosaic(output_size=24)  # DEIM's recipe affine: rotation 10, translation 0.1, scale 0.5..1.5
    counts = []
    for seed in range(12):
        torch.manual_seed(seed)
        image, target = mosaic(_four_tiles())
        boxes = target["boxes"].as_subclass(torch.Tensor)
        h, w = image.shape[-2:]
        assert target["boxes"].canvas_size == (h, w)
        assert (boxes >= 0).all() and (boxes[:, 0::2] <= w).all() and (boxes[:, 1::2] <= h).all()
        wh = boxes[:, 2:] - boxes[:, :2]
        assert (wh >= 1).all()
        assert torch.equal(target["iscrowd"], target["labels"] % 2)
        assert set(target["labels"].tolist()) <= {1, 2, 3, 4, 5}
        # each mask lies inside its box (the rotated rectangle's hull)
        for mask, (x0, y0, x1, y1) in zip(target["masks"], boxes.tolist()):
            ys, xs = torch.nonzero(mask, as_tuple=True)
            if len(xs):
                # within a pixel: the mask is resampled nearest, the box corners exactly
                assert x0 - 1 <= xs.min() and xs.max() <= x1 + 1 and y0 - 1 <= ys.min() and ys.max() <= y1 + 1
        counts.append(len(boxes))
    assert max(counts) == 5 and min(counts) >= 1


# --------------------------------------------------------------------------------------------- mixup


def _mix_sample(
    value: float, image_id: int, boxes: list[list[float]], labels: list[int], h: int = 8, w: int = 8
):
    return torch.full((3, h, w), value), {
        "boxes": torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4),
        "labels": torch.tensor(labels, dtype=torch.int64),
        "image_id": torch.tensor(image_id),
        "size": torch.tensor([h, w]),
    }


def _mix_batch():
    return [
        _mix_sample(0.2, 1, [[0.5, 0.5, 0.2, 0.2]], [1]),
        _mix_sample(0.6, 2, [[0.25, 0.25, 0.1, 0.1], [0.75, 0.75, 0.1, 0.1]], [2, 3]),
        _mix_sample(1.0, 3, [], []),
    ]


def test_mixup_blends_with_the_ratio_and_concatenates_targets():
    beta = 0.45
    out = mixup_batch(_mix_batch(), beta)
    # image i with image i - 1 (cyclic), as DEIM's images.roll(1)
    for (image, target), own, other, n_own, n_other in zip(
        out, (0.2, 0.6, 1.0), (1.0, 0.2, 0.6), (1, 2, 0), (0, 1, 2)
    ):
        assert torch.allclose(image, torch.full((3, 8, 8), beta * own + (1 - beta) * other))
        assert len(target["boxes"]) == len(target["labels"]) == n_own + n_other
        assert target["mixup"].tolist() == pytest.approx([beta] * n_own + [1 - beta] * n_other)
    assert out[0][1]["labels"].tolist() == [1] and out[1][1]["labels"].tolist() == [2, 3, 1]
    assert out[2][1]["labels"].tolist() == [2, 3] and int(out[1][1]["image_id"]) == 2
    assert torch.equal(out[1][1]["boxes"][2], torch.tensor([0.5, 0.5, 0.2, 0.2]))


def test_mixup_of_two_sizes_renormalises_boxes_on_the_common_canvas():
    wide = _mix_sample(1.0, 1, [[0.5, 0.5, 1.0, 1.0]], [1], h=4, w=8)
    tall = _mix_sample(0.5, 2, [[0.5, 0.5, 1.0, 1.0]], [2], h=8, w=4)
    (image, target), _ = mixup_batch([wide, tall], 0.5)
    assert image.shape == (3, 8, 8) and target["size"].tolist() == [8, 8]
    assert torch.allclose(image[:, :4, :4], torch.full((3, 4, 4), 0.75))  # both
    assert torch.allclose(image[:, :4, 4:], torch.full((3, 4, 4), 0.5))  # the wide one alone
    assert torch.allclose(image[:, 4:, :4], torch.full((3, 4, 4), 0.25))  # the tall one alone
    assert torch.allclose(image[:, 4:, 4:], torch.zeros(3, 4, 4))
    assert torch.allclose(target["boxes"], torch.tensor([[0.5, 0.25, 1.0, 0.5], [0.25, 0.5, 0.5, 1.0]]))


def test_mixup_collate_schedule_seed_and_inner_collate():
    dense = DenseO2O(mixup_prob=1.0, mixup_epochs=(2, 4))
    inner = MultiScaleCollate((8,), stop_epoch=3, seed=0)
    collate = MixupCollate(inner, dense, seed=0)
    for epoch, mixed in ((1, False), (2, True), (3, True), (4, False)):
        collate.set_epoch(epoch)
        assert inner.epoch == epoch and inner.multi_scale == (epoch < 3)
        _, targets = collate(_mix_batch())
        assert ("mixup" in targets[0]) == mixed
        assert len(targets[1]["labels"]) == (3 if mixed else 2)
    collate.set_epoch(2)
    beta = collate.ratio([t for _, t in _mix_batch()])
    assert 0.45 <= beta <= 0.55 and beta == collate.ratio([t for _, t in _mix_batch()])
    assert collate.ratio([_mix_batch()[0][1]]) is None  # a batch of one is never mixed with itself
    half = MixupCollate(inner, DenseO2O(mixup_prob=0.5, mixup_epochs=(0, 1)), seed=0)
    drawn = [
        half.ratio([{"image_id": torch.tensor(i)}, {"image_id": torch.tensor(i + 1)}]) for i in range(200)
    ]
    assert 60 < sum(b is not None for b in drawn) < 140


# ------------------------------------------------------------------------------------------ schedule


def test_schedule_windows_and_deim_recipe():
    dense = DenseO2O.deim(50)  # DEIM's L / X recipes: policy [4, 29, 50], mixup_epochs [4, 29]
    assert dense == DenseO2O(0.5, (4, 29), 0.5, (4, 29))
    assert dense.active(3) == frozenset()
    assert dense.active(4) == dense.active(28) == {"mosaic", "mixup"}
    assert dense.active(29) == frozenset()
    assert DenseO2O.deim(120).mosaic_epochs == (4, 64)  # the S recipe
    only_mosaic = DenseO2O(mosaic_prob=1.0, mosaic_epochs=(0, 10), mixup_prob=0.5, mixup_epochs=(5, 8))
    assert [sorted(only_mosaic.active(e)) for e in (0, 5, 8, 10)] == [
        ["mosaic"],
        ["mixup", "mosaic"],
        ["mosaic"],
        [],
    ]
    assert active_augmentations(None, 5) == frozenset()
    assert active_augmentations(only_mosaic, 5) == {"mosaic", "mixup"}
    assert DenseO2O.from_json(json.loads(json.dumps(dense.to_json()))) == dense
    with pytest.raises(InputError, match="mosaic_prob"):
        DenseO2O(mosaic_prob=1.5)
    with pytest.raises(InputError, match="start <= end"):
        DenseO2O(mixup_prob=0.5, mixup_epochs=(5, 3))


def test_schedule_from_args():
    assert dense_o2o_from_args(argparse.Namespace()) is None
    assert dense_o2o_from_args(argparse.Namespace(mosaic_prob=0.0, mixup_prob=0.0)) is None
    assert (
        dense_o2o_from_args(argparse.Namespace(mosaic_prob=0.5, mosaic_epochs=None)) is None
    )  # empty window
    dense = dense_o2o_from_args(argparse.Namespace(mosaic_prob=0.5, mosaic_epochs=[4, 29], mixup_epochs=9))
    assert dense == DenseO2O(mosaic_prob=0.5, mosaic_epochs=(4, 29), mixup_epochs=(0, 9))
    assert dense.uses_mosaic and not dense.uses_mixup
    assert dense_o2o_from_args(argparse.Namespace(mixup_prob=1, mixup_epochs=[3])).mixup_epochs == (0, 3)
    with pytest.raises(InputError, match="--mixup-prob"):
        dense_o2o_from_args(argparse.Namespace(mixup_prob=2.0))
    with pytest.raises(InputError, match="--mosaic-epochs"):
        dense_o2o_from_args(argparse.Namespace(mosaic_prob=0.5, mosaic_epochs=[9, 2]))


# ----------------------------------------------------------------------------------------- data sets


@pytest.fixture(scope="module")
def shapes_root(tmp_path_factory):
    spec = SyntheticSpec(size=64, num_classes=3, min_objects=1, max_objects=3, min_frac=0.25, max_frac=0.4)
    return make_synthetic_coco(tmp_path_factory.mktemp("dense"), num_train=12, num_val=2, seed=5, spec=spec)


def _coco(root, seed=0) -> CocoDetr:
    ann = root / "annotations" / "instances_train2017.json"
    return CocoDetr(root / "train2017", ann, make_rtdetr_train_transforms(64), seed=seed)


def _same(a, b) -> bool:
    (ia, ta), (ib, tb) = a, b
    return torch.equal(ia, ib) and ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)


def test_mosaic_dataset_raises_the_targets_and_is_the_plain_set_outside_its_window(shapes_root):
    ds = _coco(shapes_root)
    mds = MosaicDataset(ds, DenseO2O(mosaic_prob=1.0, mosaic_epochs=(1, 2)), _plain_mosaic(), None)
    for epoch in (0, 2):  # outside the window: the data set's samples, bit for bit
        mds.set_epoch(epoch)
        assert ds.epoch == epoch
        assert all(mds.partners(i) is None and _same(mds[i], ds[i]) for i in range(len(ds)))
    mds.set_epoch(1)
    plain = MosaicDataset(ds, mds.dense, _plain_mosaic(), make_mosaic_transforms(64))
    plain.set_epoch(1)
    for i in range(4):
        partners = plain.partners(i)
        assert partners is not None and len(partners) == 3 and partners == plain.partners(i)
        labels = torch.cat([ds.load_item(j)[1]["labels"] for j in [i, *partners]])
        image, target = plain[i]
        # no affine: every box of the four images is a target, in tile order (the flip keeps the order)
        assert image.shape == (3, 64, 64) and target["labels"].tolist() == labels.tolist()
        assert len(target["boxes"]) > len(ds[i][1]["boxes"])
        assert ((target["boxes"] >= 0) & (target["boxes"] <= 1)).all()
        assert _same(plain[i], (image, target))  # seeded: the same sample again
    # DEIM's recipe mosaic (random affine) still raises the mean count of targets per image
    deim = MosaicDataset(ds, mds.dense, Mosaic(output_size=32), make_mosaic_transforms(64))
    deim.set_epoch(1)
    n_plain = sum(len(ds[i][1]["labels"]) for i in range(len(ds)))
    n_mosaic = sum(len(deim[i][1]["labels"]) for i in range(len(ds)))
    assert n_mosaic > 1.5 * n_plain
    assert deim.coco is ds.coco and deim.categories == ds.categories and len(deim) == len(ds)


def _batches(ds, collate, workers: int) -> list:
    sampler = DistributedSampler(ds, 1, 0, shuffle=True, seed=0)
    sampler.set_epoch(1)
    loader = DataLoader(
        SkipBroken(ds), 4, sampler=sampler, collate_fn=skipping_collate(collate), num_workers=workers,
        drop_last=True, generator=torch.Generator().manual_seed(1),
    )  # fmt: skip
    return [b.data for b in loader]


def test_same_batches_whatever_the_worker_count(shapes_root):
    dense = DenseO2O(mosaic_prob=0.5, mosaic_epochs=(0, 3), mixup_prob=0.5, mixup_epochs=(0, 3))
    ds = MosaicDataset(_coco(shapes_root), dense, Mosaic(output_size=32), make_mosaic_transforms(64))
    collate = MixupCollate(MultiScaleCollate((64, 96), seed=0), dense, seed=0)
    ds.set_epoch(1)
    collate.set_epoch(1)
    runs = [_batches(ds, collate, workers) for workers in (0, 2)]
    assert len(runs[0]) == len(runs[1]) == 3
    targets = [t for _, batch in runs[0] for t in batch]
    assert any("mixup" in t for t in targets) and any("mixup" not in t for t in targets)  # both drawn
    assert max(len(t["labels"]) for t in targets) > 3  # a synthetic image holds at most 3 shapes
    for (images0, targets0), (images1, targets1) in zip(*runs):
        assert torch.equal(images0.tensors, images1.tensors) and torch.equal(images0.mask, images1.mask)
        assert all(_same((torch.zeros(()), a), (torch.zeros(()), b)) for a, b in zip(targets0, targets1))


def _args(root, **dense) -> argparse.Namespace:
    return argparse.Namespace(
        data_root=root, train_json=None, arch="rtdetr", val_size=64, no_aug_epochs=0, epochs=4,
        train_scales=[64, 96], seed=0, workers=0, **dense,
    )  # fmt: skip


def test_off_state_is_the_plain_pipeline_and_on_epoch_start_reaches_the_wrappers(shapes_root):
    ctx = SimpleNamespace(dist=SimpleNamespace(world_size=1, rank=0))
    reference = _coco(shapes_root)
    for off in ({}, {"mosaic_prob": 0.0, "mixup_prob": 0.0}, {"mosaic_prob": 0.5, "mosaic_epochs": [3, 3]}):
        ds, _ = _train_set(_args(shapes_root, **off))
        assert type(ds) is CocoDetr
        loader, on_epoch_start = _train_loader(ds, 4, _args(shapes_root, **off), ctx)
        assert type(loader.collate_fn.collate_fn) is MultiScaleCollate
        on_epoch_start(1)
        reference.set_epoch(1)
        assert all(_same(ds[i], reference[i]) for i in range(3))
    on = {"mosaic_prob": 0.5, "mosaic_epochs": [0, 2], "mixup_prob": 0.5, "mixup_epochs": [1, 2]}
    ds, _ = _train_set(_args(shapes_root, **on))
    assert isinstance(ds, MosaicDataset) and ds.mosaic.resize is not None
    loader, on_epoch_start = _train_loader(ds, 4, _args(shapes_root, **on), ctx)
    collate = loader.collate_fn.collate_fn
    assert isinstance(collate, MixupCollate) and isinstance(collate.collate, MultiScaleCollate)
    on_epoch_start(1)
    assert ds.epoch == ds.dataset.epoch == collate.epoch == collate.collate.epoch == 1
    batch = next(iter(loader)).data
    assert batch[0].tensors.shape[-2:] in ((64, 64), (96, 96))


def test_detr_family_mosaic_and_mixup_of_unequal_sizes(shapes_root):
    on = {"mosaic_prob": 1.0, "mosaic_epochs": [0, 1], "mixup_prob": 1.0, "mixup_epochs": [0, 1]}
    args = _args(shapes_root, **on)
    args.arch, args.train_scales, args.max_size, args.crop_resize, args.crop_size = (
        "detr",
        [48, 64],
        96,
        [],
        [32, 48],
    )
    ds, _ = _train_set(args)
    assert isinstance(ds, MosaicDataset) and ds.mosaic_transforms is None  # DETR's own pipeline follows
    loader, on_epoch_start = _train_loader(
        ds, 4, args, SimpleNamespace(dist=SimpleNamespace(world_size=1, rank=0))
    )
    on_epoch_start(0)
    images, targets = next(iter(loader)).data
    for image_mask, target in zip(images.mask, targets):
        h, w = target["size"].tolist()  # the mixed canvas: unpadded where the mask says so
        assert not image_mask[:h, :w].any() and image_mask.sum() == image_mask.numel() - h * w
        assert "mixup" in target and len(target["boxes"]) == len(target["labels"]) == len(target["mixup"])
        assert ((target["boxes"] >= 0) & (target["boxes"] <= 1)).all()
