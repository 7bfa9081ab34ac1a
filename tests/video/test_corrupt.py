"""Missing, zero-byte, truncated and undecodable videos are skipped, counted and listed with reasons."""

import json
import re

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from peg_core.engine import BrokenSample, RunContext, SkipBroken, UserError
from peg_core.engine.distributed import DistInfo
from peg_video.__main__ import main
from peg_video.data import (
    ClipBatches,
    ClipTransformConfig,
    KineticsVideoDataset,
    SyntheticSpec,
    VideoDecodeError,
    load_annotations,
    make_synthetic_kinetics,
    read_frames,
)
from peg_video.data.synthetic import render_video, write_mp4
from peg_video.evaluation import evaluate_views
from tests.video.runs import TINY

CFG = ClipTransformConfig(crop=32, train_scale=(32, 32), test_scale=32)
SPEC = SyntheticSpec(num_train=6, num_val=6, width=64, height=48, frames=8, seed=1)
FASTSTART = SyntheticSpec(width=64, height=48, frames=24)
REASONS = {
    0: "empty (zero-byte) file",
    1: "undecodable",
    2: "undecodable",
    3: "undecodable",
    4: "missing file",
}


def _break(records):
    """Replace videos 0-4 by the five kinds of broken file (reasons in REASONS)."""
    paths = [r.path for r in records]
    paths[0].write_bytes(b"")
    data = paths[1].read_bytes()
    paths[1].write_bytes(data[: len(data) // 2])  # index (moov) at the end: cut off
    frames = render_video(0, FASTSTART, np.random.default_rng(0))
    write_mp4(paths[2], frames, 12, faststart=True)  # index first, frame data cut off
    data = paths[2].read_bytes()
    paths[2].write_bytes(data[: len(data) // 2])
    paths[3].write_text("this is a text file renamed to .mp4\n")
    paths[4].unlink()


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    """Synthetic set whose train and val splits each have 5 broken videos of 6."""
    root = tmp_path_factory.mktemp("broken")
    make_synthetic_kinetics(root, SPEC)
    for split in ("train", "val"):
        _break(load_annotations(root / f"{split}.csv").records)
    return root


def test_read_frames_reasons(broken):
    ann = load_annotations(broken / "val.csv")
    for i, reason in REASONS.items():
        with pytest.raises(VideoDecodeError, match=re.escape(reason)):
            read_frames(ann.records[i].path, lambda n: np.arange(4))
    frames, _ = read_frames(ann.records[5].path, lambda n: np.arange(4))
    assert frames.shape == (4, 48, 64, 3)


def test_training_substitutes_another_video(broken):
    ann = load_annotations(broken / "val.csv")
    ds = KineticsVideoDataset(ann, "train", 4, 2, transform=CFG)
    for i in range(len(ds)):
        item = ds[i]
        assert item["video"].shape == (3, 4, 32, 32)
        if i in REASONS:
            assert item["index"] == 5  # the only good video
            path, reason = item["skipped"][0]
            assert path == str(ann.records[i].path) and reason.startswith(REASONS[i])
        else:
            assert item["index"] == i and item["skipped"] == []


def test_training_without_a_usable_substitute_is_a_broken_sample(tmp_path):
    make_synthetic_kinetics(tmp_path, SyntheticSpec(num_train=2, num_val=1, width=64, height=48, frames=4))
    ann = load_annotations(tmp_path / "train.csv")
    for r in ann.records:
        r.path.write_bytes(b"")
    ds = KineticsVideoDataset(ann, "train", 4, 1, transform=CFG, max_substitutions=3)
    with pytest.raises(BrokenSample) as e:
        ds[0]
    assert e.value.path == str(ann.records[0].path)
    assert e.value.reason == "empty (zero-byte) file (and the 3 substitutes tried were broken too)"


class _MeanColour(torch.nn.Module):
    """Deterministic stand-in classifier: logits from the mean of each channel."""

    def forward(self, x):
        m = x.mean(dim=(2, 3, 4))
        return torch.cat([m, -m], dim=1)  # (B, 6)


def _ctx(tmp_path, max_broken=1.0):
    return RunContext(DistInfo(), tmp_path, show_progress=False, max_broken=max_broken)


def test_evaluation_skips_counts_and_lists(broken, tmp_path):
    ann = load_annotations(broken / "val.csv")
    ds = KineticsVideoDataset(ann, "test", 4, 2, num_clips=2, transform=CFG)
    loader = DataLoader(SkipBroken(ds), batch_size=2, collate_fn=ClipBatches(), num_workers=1)
    ctx = _ctx(tmp_path)
    metrics = evaluate_views(_MeanColour(), loader, ctx, 6, len(ds))
    assert metrics["num_videos"] == 1 and metrics["num_views"] == 2
    log = ctx.broken["val"].report()
    assert log["count"] == 5 and log["total"] == 6
    listed = {d["path"]: d["reason"] for d in log["samples"]}
    for i, reason in REASONS.items():
        assert listed[str(ann.records[i].path)].startswith(reason)
    # the default 1% stops the evaluation with one line naming the first broken video
    with pytest.raises(UserError, match=r"too many broken samples in split 'val': 5 of 6 .*first: /"):
        evaluate_views(_MeanColour(), loader, _ctx(tmp_path, 0.01), 6, len(ds))


def test_report_lists_broken_videos_of_train_and_val(broken, tmp_path):
    out = tmp_path / "run"
    argv = ["train", "--train-ann", str(broken / "train.csv"), "--val-ann", str(broken / "val.csv"),
            "--output-dir", str(out), *TINY, "--epochs", "1", "--max-broken", "90%"]  # fmt: skip
    assert main(argv) == 0
    report = json.loads((out / "report.json").read_text())
    for split in ("train", "val"):
        ann = load_annotations(broken / f"{split}.csv")
        log = report["broken"][split]
        assert (log["count"], log["total"]) == (5, 6), split
        reasons = {d["path"]: d["reason"] for d in log["samples"]}
        for i, reason in REASONS.items():
            assert reasons[str(ann.records[i].path)].startswith(reason), (split, i)
    assert report["eval"]["num_videos"] == 1 and report["train"]["broken"] == 5
