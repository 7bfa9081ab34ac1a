"""VideoMAE's fine-tuning augmentations: ``--rand-augment``, ``--random-erasing``, ``--repeated-aug``."""

from __future__ import annotations

import argparse
import json
import math

import pytest
import torch
from torch.utils.data import DataLoader

from peg_core.engine import SkipBroken, read_checkpoint
from peg_core.engine.distributed import DistInfo
from peg_video.__main__ import main
from peg_video.data import (
    Annotations,
    ClipBatches,
    ClipTransformConfig,
    KineticsVideoDataset,
    VideoRecord,
    load_annotations,
)
from peg_video.data.loaders import LoaderOptionError, make_loader
from peg_video.data.transforms import (
    TrainClipTransform,
    clip_rand_augment,
    clip_random_erasing,
    normalize_clip,
    parse_rand_augment,
)
from tests.video.runs import TINY

MEAN, STD = (0.45, 0.45, 0.45), (0.225, 0.225, 0.225)


def _bytes_clip(t: int = 6, h: int = 24, w: int = 32, same: bool = False, seed: int = 0) -> torch.Tensor:
    """A ``(3, T, H, W)`` float clip of byte values in [0, 1]; ``same``: every frame is frame 0."""
    g = torch.Generator().manual_seed(seed)
    frames = torch.randint(0, 256, (3, 1 if same else t, h, w), generator=g)
    if same:
        frames = frames.expand(3, t, h, w)
    return frames.float().div(255.0).contiguous()


# --------------------------------------------------------------------------------- RandAugment


def test_rand_augment_spec():
    assert parse_rand_augment("m7-n4") == (4, 7) and parse_rand_augment(" M10-N1 ") == (1, 10)
    for bad in ("7,4", "m7", "m11-n2", "m7-n0", "n4-m7", "rand-m7-n4"):
        with pytest.raises(ValueError, match="expected"):
            parse_rand_augment(bad)
    with pytest.raises(ValueError, match="random_erasing must be a probability"):
        ClipTransformConfig(random_erasing=1.5)


def test_rand_augment_applies_one_draw_to_every_frame():
    """Identical frames stay identical; each frame of a clip is that frame augmented alone with the seed."""
    augment = clip_rand_augment("m9-n4", MEAN)
    same = _bytes_clip(same=True)
    changed = 0
    for seed in range(16):
        out = augment(same, seed)
        assert out.shape == same.shape and out.dtype == torch.float32
        for t in range(1, same.shape[1]):
            assert torch.equal(out[:, t], out[:, 0]), (seed, t)
        # the ops run on bytes (the dtype v2's RandAugment documents): values stay on the 1/255 grid
        assert (out.mul(255) - out.mul(255).round()).abs().max() < 1e-4
        changed += not torch.equal(out, same)
    assert changed >= 14  # 4 ops of 14 are all Identity at most rarely
    clip = _bytes_clip(same=False, seed=1)
    for seed in range(6):
        out = augment(clip, seed)
        alone = augment(clip[:, 5:6], seed)  # the same draws on frame 5 only
        assert torch.equal(out[:, 5:6], alone), seed
    # the global generator is left as it was: the draws are the seed's alone
    state = torch.get_rng_state()
    assert torch.equal(augment(clip, 3), augment(clip, 3)) and not torch.equal(
        augment(clip, 3), augment(clip, 4)
    )
    assert torch.equal(torch.get_rng_state(), state)


def test_rand_augment_fills_borders_with_the_mean():
    """A geometric op's uncovered border is the normalisation mean, so it normalises to ~0."""
    clip = _bytes_clip(same=True, t=2)
    fill = torch.tensor([round(255 * m) / 255 for m in (0.2, 0.5, 0.8)]).view(3, 1, 1, 1)
    augment = clip_rand_augment("m10-n1", (0.2, 0.5, 0.8))
    found = False
    for seed in range(40):
        out = augment(clip, seed)
        border = (out == fill).all(0).all(0)  # (H, W): pixels of exactly the fill colour in all frames
        found |= bool(border.sum() > 20)
    assert found


# ------------------------------------------------------------------------------ random erasing


def test_random_erasing_erases_one_box_the_same_in_every_frame():
    clip = normalize_clip(_bytes_clip(seed=2), MEAN, STD)  # distinct frames
    erase = clip_random_erasing(1.0)
    areas = []
    for seed in range(8):
        out = erase(clip, seed)
        changed = (out != clip).any(0)  # (T, H, W)
        assert all(torch.equal(changed[t], changed[0]) for t in range(clip.shape[1])), seed
        rows, cols = changed[0].any(1).nonzero(), changed[0].any(0).nonzero()
        box = changed[0, rows.min() : rows.max() + 1, cols.min() : cols.max() + 1]
        assert box.all()  # one rectangle
        areas.append(box.numel() / changed[0].numel())
        # the box holds the same noise in every frame (VideoMAE draws it per frame)
        inside = out[:, :, rows.min() : rows.max() + 1, cols.min() : cols.max() + 1]
        assert all(torch.equal(inside[:, t], inside[:, 0]) for t in range(clip.shape[1]))
    assert all(0.01 < a < 0.4 for a in areas), areas  # v2's (timm's) 2 % .. 33 % of the frame
    assert torch.equal(clip_random_erasing(1e-9)(clip, 0), clip)  # p ~ 0: nothing erased
    hits = sum(not torch.equal(clip_random_erasing(0.25)(clip, s), clip) for s in range(200))
    assert 30 <= hits <= 70  # p 0.25 of 200


def test_train_transform_without_augmentations_is_unchanged():
    """The augmentations draw from the clip's generator only when on: off, a clip is bit-identical."""
    clip = _bytes_clip(t=4, h=40, w=48, seed=3)
    plain = TrainClipTransform(ClipTransformConfig(crop=32, train_scale=(32, 36)))
    off = TrainClipTransform(ClipTransformConfig(crop=32, train_scale=(32, 36), rand_augment=None,
                                                 random_erasing=0.0))  # fmt: skip
    on = TrainClipTransform(ClipTransformConfig(crop=32, train_scale=(32, 36), rand_augment="m7-n4",
                                                random_erasing=0.25))  # fmt: skip
    a, b = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert torch.equal(plain(clip, a), off(clip, b))
    outs = [on(clip, torch.Generator().manual_seed(s)) for s in range(4)]
    assert all(o.shape == (3, 4, 32, 32) for o in outs)
    assert not torch.equal(outs[0], plain(clip, torch.Generator().manual_seed(0)))


# ---------------------------------------------------------------------------- repeated augmentation


VIDEOS = dict(num_train=7, num_val=2, seed=4)  # the module's ``data`` (tests/video/conftest.py)


CFG = ClipTransformConfig(crop=32, train_scale=(32, 40), test_scale=32)


def test_repeated_aug_gives_k_differing_clips_of_one_video(data):
    ann = load_annotations(data / "train.csv")
    one = KineticsVideoDataset(ann, "train", 4, 2, transform=CFG, seed=1)
    three = KineticsVideoDataset(ann, "train", 4, 2, transform=CFG, seed=1, repeats=3)
    for i in range(3):
        a, b = one[i], three[i]
        assert a["video"].shape == (3, 4, 32, 32) and "repeats" not in a
        assert b["video"].shape == (3, 3, 4, 32, 32) and b["repeats"] == 3
        assert torch.equal(b["video"][0], a["video"])  # the first clip is the K = 1 clip
        clips = b["video"]
        assert not torch.equal(clips[0], clips[1]) and not torch.equal(clips[1], clips[2])
        assert torch.equal(clips, three[i]["video"])  # a function of (seed, epoch, index)
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        KineticsVideoDataset(ann, "train", 4, 2, transform=CFG, repeats=0)


def _args(**kw) -> argparse.Namespace:
    base = dict(hflip=False, dataset="kinetics", crop=32, scale_jitter=[32, 40], test_scale=32,
                num_crops=1, num_clips=1, mean=None, std=None, batch_size=3, workers=0, data_backend="peg",
                sampling="stride", num_frames=4, stride=2, seed=0, rand_augment=None, random_erasing=0.0,
                repeated_aug=2)  # fmt: skip
    return argparse.Namespace(**{**base, **kw})


def test_repeated_aug_batches_ddp_shards_and_steps(data, tmp_path):
    """Each rank: ceil(ceil(7 / 2) / 3) = 2 steps; a step holds K x its videos, clip-major."""
    ann = load_annotations(data / "train.csv")
    seen = []
    for rank in (0, 1):
        loader, ds = make_loader(_args(), ann, "train", DistInfo(rank=rank, world_size=2), tmp_path)
        loader.sampler.set_epoch(0)
        assert len(loader) == 2 == math.ceil(math.ceil(7 / 2) / 3)
        batches = [b.data for b in loader]
        assert [b["video"].shape[0] for b in batches] == [
            6,
            2,
        ]  # 3 + 1 videos (DistributedSampler pads 7 to 8)
        for b in batches:
            n = b["video"].shape[0] // 2
            assert torch.equal(b["label"][:n], b["label"][n:]) and torch.equal(b["index"][:n], b["index"][n:])
            for v in range(n):  # clip k of video v at k * n + v, and the two differ
                assert torch.equal(b["video"][v], ds[int(b["index"][v])]["video"][0])
                assert not torch.equal(b["video"][v], b["video"][n + v])
            seen += b["index"][:n].tolist()
    assert sorted(set(seen)) == list(range(7))
    test_loader, _ = make_loader(_args(), ann, "test", DistInfo(), tmp_path)  # testing: one clip per view
    assert next(iter(test_loader)).data["video"].shape[1:] == (1, 3, 4, 32, 32)
    with pytest.raises(LoaderOptionError, match=r"no --random-erasing, --repeated-aug in this back-end"):
        make_loader(
            _args(data_backend="pytorchvideo", random_erasing=0.5), ann, "train", DistInfo(), tmp_path
        )


def test_repeated_aug_with_broken_videos(data, tmp_path):
    """A substitute gives its K clips; a sample without one is dropped with its K clips, and listed."""
    records = load_annotations(data / "train.csv").records[:3]
    broken = tmp_path / "empty.mp4"
    broken.write_bytes(b"")
    ann = Annotations([VideoRecord(broken, records[0].label), *records[1:]], ["a"] * 7)
    ds = KineticsVideoDataset(ann, "train", 4, 2, transform=CFG, repeats=2)
    item = ds[0]
    assert item["video"].shape[0] == 2 and item["index"] != 0 and item["skipped"][0][0] == str(broken)
    strict = KineticsVideoDataset(ann, "train", 4, 2, transform=CFG, repeats=2, max_substitutions=0)
    batch = next(iter(DataLoader(SkipBroken(strict), batch_size=3, collate_fn=ClipBatches())))
    assert batch.data["video"].shape == (4, 3, 4, 32, 32) and batch.data["index"].tolist() == [1, 2, 1, 2]
    assert [p for p, _ in batch.broken] == [str(broken)]


# ------------------------------------------------------------------------------------ train command


def _train(data, out, *extra) -> int:
    return main(["train", "--train-ann", str(data / "train.csv"), "--val-ann", str(data / "val.csv"),
                 "--output-dir", str(out), *TINY, *extra])  # fmt: skip


def _log(out, key):
    records = map(json.loads, (out / "log.jsonl").read_text().splitlines())
    return [r[key] for r in records if r["tag"] == "train"]


AUG = ("--rand-augment", "m7-n4", "--random-erasing", "0.25", "--repeated-aug", "2")


def test_train_with_all_three_resumes_exactly(data, tmp_path, capsys):
    """7 videos, batch 4: 2 steps an epoch with 2 clips per video; a stopped run resumes exactly."""
    common = ("--epochs", "2", "--eval-every", "2", *AUG)
    assert _train(data, tmp_path / "straight", *common) == 0
    assert "2 epochs x 2 steps (2 clips per video)" in capsys.readouterr().out
    cut = tmp_path / "cut"
    assert _train(data, cut, *common, "--stop-after-epoch", "1") == 0
    assert _train(data, cut, *common, "--resume", "auto") == 0
    assert _log(tmp_path / "straight", "steps") == [2, 2]
    assert _log(tmp_path / "straight", "loss") == _log(cut, "loss")
    a = read_checkpoint(tmp_path / "straight" / "checkpoint.pth", "video")
    b = read_checkpoint(cut / "checkpoint.pth", "video")
    assert all(torch.equal(v, b["model"][k]) for k, v in a["model"].items())
    run_args = json.loads((cut / "args.json").read_text())
    assert [run_args[k] for k in ("rand_augment", "random_erasing", "repeated_aug")] == ["m7-n4", 0.25, 2]
    # eval reads the run's options (training-only augmentations included) and tests one clip per view
    argv = [
        "eval",
        "--checkpoint",
        str(cut / "checkpoint.pth"),
        "--output-dir",
        str(tmp_path / "e"),
        "--no-progress",
    ]
    assert main(argv) == 0
    report = json.loads((tmp_path / "e" / "report.json").read_text())
    assert report["eval"]["num_views"] == 2 * 2  # 2 videos x 2 clips x 1 crop


def test_flags_at_their_off_values_are_the_plain_run(data, tmp_path):
    common = ("--epochs", "1", "--eval-every", "0")
    assert _train(data, tmp_path / "plain", *common) == 0
    off = ("--rand-augment", "off", "--random-erasing", "0", "--repeated-aug", "1")
    assert _train(data, tmp_path / "off", *common, *off) == 0
    assert _log(tmp_path / "plain", "loss") == _log(tmp_path / "off", "loss")
    assert _train(data, tmp_path / "on", *common, "--rand-augment", "m7-n4") == 0
    assert _log(tmp_path / "on", "loss") != _log(tmp_path / "plain", "loss")


BAD = {
    "--rand-augment 7,4": "argument --rand-augment: expected mM-nN (magnitude M, N ops; e.g. m7-n4) or off, "
    "got '7,4'",
    "--rand-augment m12-n2": "argument --rand-augment: expected N >= 1 ops and a magnitude M in 0..10, "
    "got 'm12-n2'",
    "--random-erasing 1.5": "argument --random-erasing: expected a fraction in [0, 1] (or a percentage like "
    "1%), got '1.5'",
    "--repeated-aug 0": "argument --repeated-aug: expected a repeat count in 1..16, got '0'",
    "--repeated-aug 2 --data-backend pytorchvideo": "argument --repeated-aug: needs --data-backend peg "
    "(pytorchvideo has its own pipeline)",
}


def test_bad_values_are_one_line_errors(data, tmp_path, capsys):
    """Each bad value stops the parse with exactly one ``error:`` line (exit status 2)."""
    for flags, message in BAD.items():
        with pytest.raises(SystemExit) as e:
            _train(data, tmp_path / "bad", *flags.split())
        assert e.value.code == 2, flags
        assert capsys.readouterr().err == f"error: python -m peg_video train: {message} (see --help)\n", flags


def test_videomae_recipes_set_the_published_augmentations():
    """run_class_finetuning.py: --aa rand-m7-n4-mstd0.5-inc1, --reprob 0.25; ViT-S scripts: --num_sample 2."""
    from peg_video.configs import CONFIGS, FINETUNE_CONFIGS

    for name in FINETUNE_CONFIGS:
        recipe = CONFIGS[name]
        assert (recipe["rand_augment"], recipe["random_erasing"], recipe["repeated_aug"]) == (
            "m7-n4",
            0.25,
            2,
        )
    others = [r for n, r in CONFIGS.items() if n not in FINETUNE_CONFIGS]
    assert all("rand_augment" not in r and "repeated_aug" not in r for r in others)
