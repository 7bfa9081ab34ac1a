"""RT-DETR's recipe details: the AdamW groups of lyuwenyu/RT-DETR's 6x configs, ``--no-aug-epochs``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torchvision import tv_tensors

from peg_core.engine import UserError
from peg_detr.cli import parse_train_args
from peg_detr.configs import CONFIGS
from peg_detr.data import (
    MultiScaleCollate,
    StopEpochTransforms,
    SyntheticSpec,
    make_rtdetr_train_transforms,
    make_synthetic_coco,
)
from peg_detr.models.rtdetr.build import build_rtdetr
from peg_detr.task import _train_loader, _train_set, rtdetr_optimizer_groups, rtdetr_stop_epoch

_SMALL = {"hidden_dim": 32, "num_heads": 2, "dim_feedforward": 64, "dec_layers": 1, "num_queries": 10,
          "num_denoising": 5, "encoder_expansion": 0.5}  # fmt: skip


def _groups_by_name(model: nn.Module) -> dict[str, tuple[str, float, float | None]]:
    groups = rtdetr_optimizer_groups(model, lr_backbone=1e-5, weight_decay=1e-4)
    ids = {id(p): n for n, p in model.named_parameters()}
    return {ids[id(p)]: (g["name"], g["weight_decay"], g.get("lr")) for g in groups for p in g["params"]}


@pytest.mark.parametrize("backbone", ["r18vd", "tiny"])
def test_groups_follow_rtdetr_r18vd_trainable_backbone_norms(backbone):
    model, _, _ = build_rtdetr(backbone, "peg", **_SMALL)  # R18vd: trainable backbone BN
    got = _groups_by_name(model)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert set(got) == trainable  # each trainable parameter once
    backbone_bn = "backbone.embedder.embedder.0.normalization"
    assert got["backbone.embedder.embedder.0.convolution.weight"] == ("backbone", 1e-4, 1e-5)
    assert got[f"{backbone_bn}.weight"] == got[f"{backbone_bn}.bias"] == ("backbone_no_decay", 0.0, 1e-5)
    # encoder / decoder: weights decayed at the main lr; biases and every norm's parameters not,
    # the BatchNorm / LayerNorm inside Sequentials (``input_proj.0.1``, ``enc_output.1``) included
    for name in (
        "encoder.input_proj.0.0.weight",
        "decoder.enc_output.0.weight",
        "denoising_class_embed.weight",
    ):
        assert got[name] == ("main", 1e-4, None), name
    for name in ("encoder.input_proj.0.1.weight", "encoder.input_proj.0.1.bias", "decoder.enc_output.0.bias",
                 "decoder.enc_output.1.weight", "decoder.enc_output.1.bias"):  # fmt: skip
        assert got[name] == ("main_no_decay", 0.0, None), name
    pegs = [n for n in got if ".pegs." in n]
    assert pegs and all(got[n][1] == (0.0 if n.endswith("bias") else 1e-4) for n in pegs)
    assert all(got[n][1] == 0.0 for n in got if "norm" in n)


def test_groups_of_r50vd_frozen_backbone_norms():
    model, _, _ = build_rtdetr("r50vd", "sincos", **_SMALL)
    got = _groups_by_name(model)
    backbone = {n: g for n, g in got.items() if n.startswith("backbone.")}
    assert backbone and all(g == ("backbone", 1e-4, 1e-5) for g in backbone.values())  # BN: buffers
    assert not any("normalization" in n for n in backbone)


def test_recipes_train_the_backbone_at_the_published_lr():
    for name in ("rtdetr_r18vd_6x", "rtdetr_r50vd_6x", "rtdetr_r18vd_6x_peg", "rtdetr_r50vd_6x_peg"):
        assert (CONFIGS[name]["lr"], CONFIGS[name]["lr_backbone"], CONFIGS[name]["weight_decay"]) == (
            1e-4,
            1e-5,
            1e-4,
        )


# ------------------------------------------------------------------ --no-aug-epochs (stop_epoch policy)


def _sample():
    image = tv_tensors.Image(torch.rand(3, 80, 120))
    boxes = tv_tensors.BoundingBoxes([[10.0, 10.0, 60.0, 50.0]], format="XYXY", canvas_size=(80, 120))
    return image, {"boxes": boxes, "labels": torch.tensor([1])}


def test_plain_transforms_drop_only_the_strong_ops():
    strong = [type(t).__name__ for t in make_rtdetr_train_transforms(64).transforms]
    plain = [type(t).__name__ for t in make_rtdetr_train_transforms(64, strong=False).transforms]
    assert strong[:3] == ["RandomPhotometricDistort", "RandomZoomOut", "RandomApply"]
    assert plain == strong[3:]


def test_stop_epoch_transforms_and_collate_switch_at_the_stop_epoch():
    policy = StopEpochTransforms(
        make_rtdetr_train_transforms(64), make_rtdetr_train_transforms(64, strong=False), 3
    )
    collate = MultiScaleCollate([32, 96], stop_epoch=3)
    torch.manual_seed(0)
    for epoch in range(5):
        policy.set_epoch(epoch)
        collate.set_epoch(epoch)
        assert policy.current is (policy.strong if epoch < 3 else policy.plain)
        image, target = policy(*_sample())
        batch, _ = collate([(image, target), (image, target)])
        side = batch.tensors.shape[-1]
        assert side in ((32, 96) if epoch < 3 else (64,))
    # from the stop epoch on: only flip and resize, so the box is the resized one (or its mirror)
    image, target = policy(*_sample())
    want = torch.tensor([10 / 120, 10 / 80, 60 / 120, 50 / 80]) * 64  # xyxy pixels of the 64 x 64 image
    got = target["boxes"]
    assert got.shape == (1, 4) and image.shape == (3, 64, 64)
    flipped = torch.tensor([64 - want[2], want[1], 64 - want[0], want[3]])
    assert any(torch.allclose(got[0].as_subclass(torch.Tensor), w, atol=1e-4) for w in (want, flipped))


@pytest.mark.parametrize(("epochs", "n", "stop"), [(72, 0, None), (72, 1, 71), (120, 3, 117), (2, 5, 0)])
def test_no_aug_epochs_flag_gives_the_stop_epoch(epochs, n, stop):
    args = parse_train_args(["--config", "rtdetr_r18vd_6x", "--data-root", "x", "--epochs", str(epochs),
                             "--no-aug-epochs", str(n)])  # fmt: skip
    assert args.no_aug_epochs == n and rtdetr_stop_epoch(args) == stop
    assert parse_train_args(["--config", "rtdetr_r50vd_6x", "--data-root", "x"]).no_aug_epochs == 0


def test_no_aug_epochs_is_refused_for_detr_and_when_negative(capsys):
    args = parse_train_args(["--data-root", "x", "--no-aug-epochs", "2"])
    with pytest.raises(UserError, match="applies to the RT-DETR family only"):
        rtdetr_stop_epoch(args)
    with pytest.raises(SystemExit):
        parse_train_args(["--config", "rtdetr_r18vd_6x", "--data-root", "x", "--no-aug-epochs", "-1"])
    assert "--no-aug-epochs" in capsys.readouterr().err


def test_train_loader_turns_the_policy_off_for_the_last_epochs(tmp_path):
    spec = SyntheticSpec(size=96, num_classes=2, min_objects=1, max_objects=1, min_frac=0.3, max_frac=0.5)
    data = make_synthetic_coco(tmp_path, num_train=4, num_val=1, seed=0, spec=spec)
    args = parse_train_args(["--config", "rtdetr_demo_tiny", "--data-root", str(data), "--epochs", "3",
                             "--no-aug-epochs", "1", "--workers", "0"])  # fmt: skip
    ds, _ = _train_set(args)
    ctx = SimpleNamespace(dist=SimpleNamespace(world_size=1, rank=0))
    loader, on_epoch_start = _train_loader(ds, 2, args, ctx)
    sides = []
    for epoch in range(3):
        on_epoch_start(epoch)
        assert ds.transforms.current is (ds.transforms.strong if epoch < 2 else ds.transforms.plain)
        sides.append({batch.data[0].tensors.shape[-1] for batch in loader})
    assert sides[2] == {args.val_size} and args.val_size == 96
    assert all(s <= {64, 96, 128} for s in sides)
