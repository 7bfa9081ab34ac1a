"""VideoMAE's random-resized training crop: ``--train-crop rrc``, ``--rrc-scale``, ``--rrc-ratio``."""

from __future__ import annotations

import argparse
import json

import pytest
import torch
from torchvision.transforms.v2 import functional as F

from peg_core.engine.distributed import DistInfo
from peg_video.__main__ import main
from peg_video.cli import parse_train_args
from peg_video.configs import CONFIGS, FINETUNE_CONFIGS
from peg_video.data import ClipTransformConfig, KineticsVideoDataset, load_annotations
from peg_video.data.loaders import LoaderOptionError, make_loader
from peg_video.data.transforms import (
    RRC_RATIO,
    RRC_SCALE,
    ClipResizedCrop,
    EvalClipTransform,
    TrainClipTransform,
)
from tests.video.runs import TINY


def _clip(t: int = 5, h: int = 48, w: int = 64, same: bool = False, seed: int = 0) -> torch.Tensor:
    """A ``(3, T, H, W)`` float clip in [0, 1]; ``same``: every frame is frame 0."""
    g = torch.Generator().manual_seed(seed)
    clip = torch.rand(3, 1 if same else t, h, w, generator=g)
    return (clip.expand(3, t, h, w) if same else clip).contiguous()


# ------------------------------------------------------------------------------------ the crop


def test_one_box_for_every_frame():
    """Identical frames stay identical; frame t is v2's resized crop of frame t alone with the clip's box."""
    crop = ClipResizedCrop(32)
    same = _clip(same=True)
    clip = _clip(seed=1)
    boxes = set()
    for seed in range(8):
        out = crop(same, seed)
        assert all(torch.equal(out[:, t], out[:, 0]) for t in range(1, same.shape[1])), seed
        out = crop(clip, seed)
        top, left, h, w = box = crop.box(clip, seed)
        boxes.add(box)
        for t in range(clip.shape[1]):
            alone = F.resized_crop(clip[:, t], top, left, h, w, [32, 32], antialias=True)
            torch.testing.assert_close(out[:, t], alone, rtol=0, atol=1e-6)
    assert len(boxes) == 8  # the box changes with the seed


@pytest.mark.parametrize("hw", [(48, 64), (64, 40), (20, 24)])  # landscape, portrait, smaller than the crop
def test_output_size(hw):
    clip = _clip(t=3, h=hw[0], w=hw[1])
    out = ClipResizedCrop(32)(clip, 0)
    assert out.shape == (3, 3, 32, 32) and out.dtype == torch.float32
    cfg = ClipTransformConfig(crop=32, train_scale=(24, 28), train_crop="rrc")  # jitter < crop: fine for rrc
    assert TrainClipTransform(cfg)(clip, torch.Generator().manual_seed(0)).shape == (3, 3, 32, 32)
    with pytest.raises(ValueError, match=r"train_scale \(24, 28\) must be >= crop 32"):
        TrainClipTransform(ClipTransformConfig(crop=32, train_scale=(24, 28)))


def _within(box: tuple[int, int, int, int], size: tuple[int, int], scale, ratio) -> bool:
    """Whether the integer box is v2's rounding of a box with area fraction in ``scale`` and w / h in ``ratio``."""
    top, left, h, w = box
    area = size[0] * size[1]
    inside = top >= 0 and top + h <= size[0] and left >= 0 and left + w <= size[1]
    # w and h are rounded to the nearest pixel: the real-valued box lies within half a pixel of them
    area_ok = (w - 0.5) * (h - 0.5) / area <= scale[1] and (w + 0.5) * (h + 0.5) / area >= scale[0]
    ratio_ok = (w - 0.5) / (h + 0.5) <= ratio[1] and (w + 0.5) / (h - 0.5) >= ratio[0]
    return inside and area_ok and ratio_ok


@pytest.mark.parametrize(
    "size, scale, ratio", [((48, 64), RRC_SCALE, RRC_RATIO), ((128, 128), (0.25, 0.5), (0.5, 2.0))]
)
def test_box_area_and_aspect_within_the_ranges(size, scale, ratio):
    clip = _clip(t=1, h=size[0], w=size[1])
    crop = ClipResizedCrop(16, scale, ratio)
    boxes = [crop.box(clip, seed) for seed in range(300)]
    assert all(_within(b, size, scale, ratio) for b in boxes), [
        b for b in boxes if not _within(b, size, scale, ratio)
    ]
    areas = [h * w / (size[0] * size[1]) for _, _, h, w in boxes]
    aspects = [w / h for _, _, h, w in boxes]
    lo, hi = scale
    # the draws cover the ranges, not one corner of them
    assert min(areas) < lo + 0.1 * (hi - lo) and max(areas) > hi - 0.1 * (hi - lo), (min(areas), max(areas))
    assert min(aspects) < ratio[0] * 1.1 and max(aspects) > ratio[1] / 1.1, (min(aspects), max(aspects))


def test_seeding_is_the_clips_own():
    """Same generator seed -> the same clip; the global generator is neither read nor moved."""
    clip = _clip(seed=2)
    tf = TrainClipTransform(ClipTransformConfig(crop=32, train_scale=(32, 36), train_crop="rrc", hflip=True))
    state = torch.get_rng_state()
    a = tf(clip, torch.Generator().manual_seed(7))
    torch.manual_seed(123)  # another global state: no effect on the clip
    b = tf(clip, torch.Generator().manual_seed(7))
    assert torch.equal(a, b) and not torch.equal(a, tf(clip, torch.Generator().manual_seed(8)))
    torch.set_rng_state(state)
    tf(clip, torch.Generator().manual_seed(7))
    assert torch.equal(torch.get_rng_state(), state)


def test_jitter_is_the_default_and_unchanged():
    clip = _clip(t=4, h=40, w=48, seed=3)
    plain = TrainClipTransform(ClipTransformConfig(crop=32, train_scale=(32, 36)))
    jitter = TrainClipTransform(ClipTransformConfig(crop=32, train_scale=(32, 36), train_crop="jitter"))
    assert plain.resized_crop is None
    assert torch.equal(
        plain(clip, torch.Generator().manual_seed(5)), jitter(clip, torch.Generator().manual_seed(5))
    )


def test_config_refuses_bad_values():
    for kw, match in (
        ({"train_crop": "inception"}, "train_crop must be one of jitter, rrc, got 'inception'"),
        ({"rrc_scale": (0.5, 0.1)}, r"rrc_scale: expected area fractions 0 < LO <= HI <= 1, got 0.5,0.1"),
        ({"rrc_scale": (0.5, 1.5)}, "rrc_scale: expected area fractions"),
        ({"rrc_ratio": (-1.0, 2.0)}, r"rrc_ratio: expected aspect ratios 0 < LO <= HI, got -1,2"),
    ):
        with pytest.raises(ValueError, match=match):
            ClipTransformConfig(**kw)


# ------------------------------------------------------------------------------------- data sets


VIDEOS = dict(num_train=6, num_val=2, seed=5)  # the module's ``data`` (tests/video/conftest.py)


JITTER = ClipTransformConfig(crop=32, train_scale=(32, 40), test_scale=32)
RRC = ClipTransformConfig(crop=32, train_scale=(32, 40), test_scale=32, train_crop="rrc")


def test_dataset_clips_are_functions_of_seed_epoch_index(data):
    """What resume relies on: a rebuilt data set gives the same clips; another epoch other crops."""
    ann = load_annotations(data / "train.csv")
    a = KineticsVideoDataset(ann, "train", 4, 2, transform=RRC, seed=1)
    b = KineticsVideoDataset(ann, "train", 4, 2, transform=RRC, seed=1)
    first = a[2]["video"]
    assert first.shape == (3, 4, 32, 32) and torch.equal(first, b[2]["video"])
    b.set_epoch(1)
    assert not torch.equal(first, b[2]["video"])


def _args(**kw) -> argparse.Namespace:
    base = dict(hflip=False, dataset="kinetics", crop=32, scale_jitter=[32, 40], test_scale=32, num_crops=1,
                num_clips=2, mean=None, std=None, batch_size=2, workers=0, data_backend="peg", sampling="stride",
                num_frames=4, stride=2, seed=0, rand_augment=None, random_erasing=0.0, repeated_aug=1,
                train_crop="jitter", rrc_scale=list(RRC_SCALE), rrc_ratio=list(RRC_RATIO))  # fmt: skip
    return argparse.Namespace(**{**base, **kw})


def test_eval_is_unaffected_and_pytorchvideo_refuses(data, tmp_path):
    ann = load_annotations(data / "val.csv")
    clip = _clip(t=4)
    assert torch.equal(EvalClipTransform(RRC)(clip), EvalClipTransform(JITTER)(clip))
    jitter, _ = make_loader(_args(), ann, "test", DistInfo(), tmp_path)
    rrc, _ = make_loader(_args(train_crop="rrc"), ann, "test", DistInfo(), tmp_path)
    for a, b in zip(jitter, rrc, strict=True):
        assert a.data["video"].shape == (1, 2, 3, 4, 32, 32) and torch.equal(a.data["video"], b.data["video"])
    with pytest.raises(LoaderOptionError, match=r"no --train-crop rrc in this back-end"):
        make_loader(_args(data_backend="pytorchvideo", train_crop="rrc"), ann, "train", DistInfo(), tmp_path)


# ------------------------------------------------------------------------------------ train command


def _train(data, out, *extra) -> int:
    return main(["train", "--train-ann", str(data / "train.csv"), "--val-ann", str(data / "val.csv"),
                 "--output-dir", str(out), *TINY, "--epochs", "1", *extra])  # fmt: skip


def _losses(out) -> list[float]:
    records = map(json.loads, (out / "log.jsonl").read_text().splitlines())
    return [r["loss"] for r in records if r["tag"] == "train"]


def test_train_with_rrc_and_jitter_bit_identical(data, tmp_path):
    assert _train(data, tmp_path / "plain", "--eval-every", "0") == 0
    assert _train(data, tmp_path / "jitter", "--eval-every", "0", "--train-crop", "jitter") == 0
    assert _losses(tmp_path / "plain") == _losses(tmp_path / "jitter")
    rrc = tmp_path / "rrc"
    # a jitter below --crop is refused for jitter (BAD below), not for rrc, which resizes its box
    assert _train(data, rrc, "--eval-every", "1", "--train-crop", "rrc", "--rrc-scale", "0.2,1",
                  "--scale-jitter", "24,30") == 0  # fmt: skip
    assert _losses(rrc) != _losses(tmp_path / "plain")
    run = json.loads((rrc / "args.json").read_text())
    assert (run["train_crop"], run["rrc_scale"], run["rrc_ratio"]) == ("rrc", [0.2, 1.0], list(RRC_RATIO))
    report = json.loads((rrc / "report.json").read_text())
    assert report["eval"]["num_views"] == 2 * 2  # 2 videos x 2 clips x 1 crop, as without rrc


BAD = {
    "--rrc-scale 0.5,0.1": "argument --rrc-scale: expected area fractions 0 < LO <= HI <= 1, got 0.5,0.1",
    "--rrc-scale 0.5": "argument --rrc-scale: expected two comma-separated numbers LO,HI, got '0.5'",
    "--rrc-ratio -1,2": "argument --rrc-ratio: expected aspect ratios 0 < LO <= HI, got -1,2",
    "--rrc-ratio 1,inf": "argument --rrc-ratio: expected aspect ratios 0 < LO <= HI, got 1,inf",
    "--train-crop inception": "argument --train-crop: invalid choice: 'inception' (choose from 'jitter', 'rrc')",
    "--train-crop rrc --data-backend pytorchvideo": "argument --train-crop: rrc needs --data-backend peg "
    "(pytorchvideo has its own pipeline)",
    "--scale-jitter 24,30": "argument --scale-jitter: 24,30 must be >= --crop 32",
    "--rrc-ratio 0.5,2": "argument --rrc-ratio: shapes the random-resized crop, which needs --train-crop rrc "
    "(not jitter)",
}


@pytest.mark.parametrize("flags", BAD)
def test_bad_value_is_a_one_line_error(flags, data, tmp_path, capsys):
    """The parse stops with exactly one ``error:`` line (exit status 2)."""
    with pytest.raises(SystemExit) as e:
        _train(data, tmp_path / "bad", *flags.split())
    assert e.value.code == 2
    assert capsys.readouterr().err == f"error: python -m peg_video train: {BAD[flags]} (see --help)\n"


def test_videomae_recipes_use_rrc(data):
    """The four VideoMAE fine-tuning recipes crop as VideoMAE; SSv2 still without flips; no other recipe."""
    for name in FINETUNE_CONFIGS:
        recipe = CONFIGS[name]
        assert recipe["train_crop"] == "rrc" and recipe["hflip"] is (not name.startswith("ssv2")), name
    assert all("train_crop" not in r for n, r in CONFIGS.items() if n not in FINETUNE_CONFIGS)
    args = parse_train_args(["--train-ann", str(data / "train.csv"), "--output-dir", "x"])
    assert (args.train_crop, args.rrc_scale, args.rrc_ratio) == ("jitter", [0.08, 1.0], [0.75, 1.3333])
