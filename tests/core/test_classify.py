"""Generated shapes set (determinism, labels, rendering) and the classifier trainer / evaluator."""

from __future__ import annotations

import pytest
import torch

from peg_core.data import NUM_CLASSES, PALETTE, make_shape_splits, render_scenes, sample_scenes
from tools.classify import evaluate, evaluate_sizes, scaled_sizes, train_classifier


def test_scenes_deterministic_and_balanced():
    a, b, c = sample_scenes(50, seed=3), sample_scenes(50, seed=3), sample_scenes(50, seed=4)
    assert torch.equal(a.labels, b.labels) and torch.equal(a.images(24), b.images(24))
    assert not torch.equal(a.center, c.center)
    counts = torch.bincount(a.labels, minlength=NUM_CLASSES)
    assert counts.max() - counts.min() <= 1 and len(counts) == NUM_CLASSES == 12
    # the label's quadrant holds the whole shape
    qy, qx = a.quadrant // 2, a.quadrant % 2
    lo_y, lo_x = qy * 0.5, qx * 0.5
    r = a.radius
    assert ((a.center[:, 0] - r >= lo_y) & (a.center[:, 0] + r <= lo_y + 0.5)).all()
    assert ((a.center[:, 1] - r >= lo_x) & (a.center[:, 1] + r <= lo_x + 0.5)).all()
    assert torch.equal(a.labels, a.shape * 4 + a.quadrant)
    train, val = make_shape_splits(20, 10, seed=0)
    assert len(train) == 20 and len(val) == 10 and not torch.equal(train.center[:10], val.center)


def test_render_hand_case():
    s = sample_scenes(1, seed=0, noise=0.0)
    s = type(s)(
        shape=torch.tensor([0]), quadrant=torch.tensor([0]), center=torch.tensor([[0.25, 0.25]]),
        radius=torch.tensor([0.125]), color=torch.tensor([[1.0, 0.0, 0.5]]),
        background=torch.tensor([[0.0, 0.0, 0.0]]), seed=0, noise=0.0,
    )  # fmt: skip
    img = render_scenes(s, 16)  # values 2 * rgb - 1
    assert img.shape == (1, 3, 16, 16)
    # pixel centres (i + 0.5) / 16 within [0.125, 0.375] -> rows and columns 2..5
    inside = torch.zeros(16, 16, dtype=torch.bool)
    inside[2:6, 2:6] = True
    torch.testing.assert_close(img[0, 0], torch.where(inside, 1.0, -1.0))
    torch.testing.assert_close(img[0, 2], torch.where(inside, 0.0, -1.0))


def test_same_scenes_at_other_sizes():
    s = sample_scenes(12, seed=1, noise=0.0)
    for size in (32, 64):
        img = (s.images(size) + 1) / 2  # back to rgb
        # the shape's pixels (its colour) lie in the labelled quadrant
        is_shape = (img - s.color[:, :, None, None]).abs().sum(1) < 1e-5  # (N, H, W)
        ys, xs = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
        for i in range(len(s)):
            assert is_shape[i].any()
            qy, qx = int(s.quadrant[i]) // 2, int(s.quadrant[i]) % 2
            assert ((ys[is_shape[i]] >= qy * size // 2) & (ys[is_shape[i]] < (qy + 1) * size // 2)).all()
            assert ((xs[is_shape[i]] >= qx * size // 2) & (xs[is_shape[i]] < (qx + 1) * size // 2)).all()
    assert s.color.shape == (12, 3) and PALETTE.shape == (3, 3)


TINY = {"embed_dim": 32, "depth": 2, "num_heads": 2, "mlp_ratio": 2.0, "peg_at": (0, 1)}


@pytest.mark.slow
def test_short_training_loss_falls_and_evaluates_at_two_sizes():
    data = make_shape_splits(256, 96, seed=0)
    model, history = train_classifier(
        "peg", epochs=4, seed=0, img_size=32, data=data, batch_size=16, lr=5e-3, model_kwargs=TINY
    )
    losses = [h["loss"] for h in history]
    assert len(history) == 4 and losses[0] > 2.4 and losses[-1] < losses[0] - 0.2, losses  # ln 12 = 2.48
    assert not model.training
    acc = evaluate_sizes(model, data[1], scaled_sizes(32, (1.0, 1.5)))
    assert list(acc) == [32, 48] and all(0.0 <= a <= 1.0 for a in acc.values())
    assert acc[32] == pytest.approx(history[-1]["val_top1"])
    assert acc[32] > 1.0 / NUM_CLASSES  # above chance after 64 small steps
    # evaluate() is plain top-1: recompute it by hand at the other size
    with torch.no_grad():
        pred = model(data[1].images(48)).argmax(-1)
    assert acc[48] == pytest.approx((pred == data[1].labels).float().mean().item())


def test_evaluate_learned_mode_and_tensor_data():
    torch.manual_seed(0)
    data = make_shape_splits(8, 24, seed=2)
    model, _ = train_classifier("learned", epochs=1, img_size=32, data=data, batch_size=8, model_kwargs=TINY)
    assert model.pos_interpolation == "bicubic"
    val = data[1]
    with torch.no_grad():
        model.pos_interpolation = "nearest"
        ref = (model(val.images(48)).argmax(-1) == val.labels).float().mean().item()
        model.pos_interpolation = "bicubic"
    assert evaluate(model, val, 48, mode="nearest") == pytest.approx(ref)
    assert model.pos_interpolation == "bicubic"  # restored
    # (images, labels) pairs are resized to the asked size
    pair = (val.images(32), val.labels)
    assert evaluate(model, pair, 32) == evaluate(model, val, 32)
    assert 0.0 <= evaluate(model, pair, 40) <= 1.0


def test_image_folder_path(tmp_path):
    from PIL import Image

    data = sample_scenes(16, seed=5)
    for split in ("train", "val"):
        for i in range(len(data)):
            folder = tmp_path / split / f"class_{int(data.quadrant[i])}"  # 4 classes: the quadrant
            folder.mkdir(parents=True, exist_ok=True)
            img = ((data.images(40)[i] + 1) * 127.5).clamp(0, 255).to(torch.uint8)
            Image.fromarray(img.permute(1, 2, 0).numpy()).save(folder / f"{i}.png")
    model, history = train_classifier(
        "peg", epochs=1, img_size=32, data=tmp_path, batch_size=8, workers=0, model_kwargs=TINY
    )
    assert model.head.out_features == 4 and len(history) == 1
    assert history[0]["val_top1"] in {k / 16 for k in range(17)}  # 16 validation images
    assert evaluate(model, tmp_path / "val", 48, workers=0) in {k / 16 for k in range(17)}
    with pytest.raises(FileNotFoundError, match="must hold train/<class>"):
        train_classifier("peg", epochs=1, data=tmp_path / "val")
