"""Generated shapes set (determinism, labels, rendering) and the classifier's parts: data, model, metrics."""

from __future__ import annotations

import math

import pytest
import torch

from peg_core.classify import DEMO_CONFIG, build_model, scaled_sizes
from peg_core.classify.data import ImageFolderError, ShapeImages, load_image, open_image_folder
from peg_core.classify.metrics import accuracy
from peg_core.classify.shapes import (
    CLASS_NAMES,
    NUM_CLASSES,
    PALETTE,
    QUADRANTS,
    SHAPES,
    make_shape_splits,
    render_scenes,
    sample_scenes,
)
from peg_core.engine import BrokenSample, RunContext, param_groups, warmup_cosine
from peg_core.engine.distributed import DistInfo


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


def test_class_names_follow_the_labels():
    s = sample_scenes(24, seed=0)
    for label, shape, quadrant in zip(s.labels.tolist(), s.shape.tolist(), s.quadrant.tolist()):
        assert CLASS_NAMES[label] == f"{SHAPES[shape]}_{QUADRANTS[quadrant]}"
    assert len(set(CLASS_NAMES)) == NUM_CLASSES and CLASS_NAMES[5] == "ring_top_right"


def test_shape_images_normalisation_and_class_order():
    s = sample_scenes(12, seed=1)
    half = ShapeImages(s, 16)
    assert torch.equal(half.images, s.images(16)) and torch.equal(half.labels, s.labels)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    imagenet = ShapeImages(s, 16, mean, std)
    rgb = imagenet.images * torch.tensor(std).view(3, 1, 1) + torch.tensor(mean).view(3, 1, 1)
    torch.testing.assert_close(rgb * 2 - 1, s.images(16))
    # A model trained on a make-data folder knows the classes in folder (alphabetical) order.
    by_name = ShapeImages(s, 16, classes=sorted(CLASS_NAMES))
    assert [by_name.classes[i] for i in by_name.labels.tolist()] == [
        CLASS_NAMES[i] for i in s.labels.tolist()
    ]


def test_demo_model_optimizer_groups_and_schedule():
    model = build_model({"arch": "demo", "num_classes": 12, "img_size": 48, "pos_enc": "peg"})
    assert (model.embed_dim, len(model.blocks), model.patch_size, model.global_pool) == (64, 4, 8, "token")
    assert sorted(int(k) for k in model.pos_blocks) == list(DEMO_CONFIG["peg_at"])
    learned = build_model(
        {"arch": "demo", "num_classes": 3, "img_size": 32, "pos_enc": "learned", "depth": 1}
    )
    # the task's optimiser: AdamW over the engine's groups, in the order [decayed, not decayed]
    opt = torch.optim.AdamW(param_groups(learned, 0.05), lr=1e-3, weight_decay=0.05)
    assert [g["name"] for g in opt.param_groups] == ["main", "main_no_decay"]
    decay, no_decay = ({id(p) for p in g["params"]} for g in opt.param_groups)
    named = dict(learned.named_parameters())
    assert id(named["cls_token"]) in no_decay and id(named["pos_enc.pos_embed"]) in no_decay
    assert id(named["blocks.0.norm1.weight"]) in no_decay and id(named["head.bias"]) in no_decay
    assert id(named["blocks.0.attn.qkv.weight"]) in decay and opt.param_groups[1]["weight_decay"] == 0.0
    assert len(decay) + len(no_decay) == len(named)
    sched = warmup_cosine(opt, warmup_steps=2, total_steps=6)
    lrs = []
    for _ in range(6):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    expected = [0.5, 1.0] + [0.5 * (1 + math.cos(math.pi * k / 4)) for k in range(4)]
    assert lrs == pytest.approx([1e-3 * f for f in expected])
    assert scaled_sizes(48) == [36, 48, 72, 96]


def test_accuracy_top1_top5_by_hand(tmp_path):
    torch.manual_seed(0)
    model = build_model({"arch": "demo", "num_classes": 12, "img_size": 16, "depth": 1, "embed_dim": 16,
                         "num_heads": 2, "peg_at": [0]}).eval()  # fmt: skip
    ds = ShapeImages(sample_scenes(20, seed=3), 16)
    ctx = RunContext(DistInfo(), tmp_path, show_progress=False)
    got = accuracy(model, ds, ctx, "val", batch_size=6)
    with torch.no_grad():
        logits = model(ds.images)
    top5 = logits.topk(5, -1).indices
    assert got["samples"] == 20
    assert got["top1"] == pytest.approx((logits.argmax(-1) == ds.labels).float().mean().item())
    assert got["top5"] == pytest.approx((top5 == ds.labels[:, None]).any(-1).float().mean().item())
    assert got["loss"] == pytest.approx(torch.nn.functional.cross_entropy(logits, ds.labels).item(), rel=1e-5)
    assert ctx.broken["val"].count == 0 and not model.training


def _png(path, size=8):
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (size, size), (200, 30, 30)).save(path)
    return path


def test_broken_images_raise_broken_sample(tmp_path):
    good = _png(tmp_path / "good.png", 32)
    assert load_image(good).size == (32, 32)
    cut = tmp_path / "cut.png"
    cut.write_bytes(good.read_bytes()[:60])
    text = tmp_path / "notes.jpg"
    text.write_text("not a jpeg")
    with pytest.raises(BrokenSample, match="cannot decode image") as e:
        load_image(cut)
    assert e.value.path == str(cut)
    with pytest.raises(BrokenSample, match="not an image"):
        load_image(text)


def test_open_image_folder_classes_and_errors(tmp_path):
    for split, cls in (("train", "cat"), ("train", "dog"), ("val", "dog")):
        _png(tmp_path / split / cls / "a.png")
    (tmp_path / "train" / "dog" / "readme.txt").write_text("ignored: no image extension")
    data = open_image_folder(tmp_path)
    assert data.classes == ["cat", "dog"] and len(data.train) == 2
    assert data.val == [(str(tmp_path / "val" / "dog" / "a.png"), 1)]  # indices follow train/
    _png(tmp_path / "val" / "cow" / "a.png")
    with pytest.raises(ImageFolderError, match="class folder 'cow' is not one of the model's 2 classes"):
        open_image_folder(tmp_path)
    (tmp_path / "train" / "eel").mkdir()
    with pytest.raises(ImageFolderError, match=r"class folder holds no images .*: .*train/eel$"):
        open_image_folder(tmp_path)
