"""Missing, zero-byte, truncated and undecodable videos are skipped, counted and reported."""

import re

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from peg_video.data import (
    ClipTransformConfig,
    KineticsVideoDataset,
    SyntheticSpec,
    VideoDecodeError,
    collate_clips,
    load_annotations,
    make_synthetic_kinetics,
    read_frames,
)
from peg_video.data.synthetic import render_video, write_mp4
from peg_video.engine import evaluate

CFG = ClipTransformConfig(crop=32, train_scale=(32, 32), test_scale=32)
SPEC = SyntheticSpec(num_train=6, num_val=6, width=64, height=48, frames=8, seed=1)


FASTSTART = SyntheticSpec(width=64, height=48, frames=24)


def _break(records):
    """Replace videos 0-4 by the five kinds of broken file; returns {index: expected reason}."""
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
    return {
        0: "empty (zero-byte) file",
        1: "undecodable",
        2: "undecodable",
        3: "undecodable",
        4: "missing file",
    }


@pytest.fixture
def broken(tmp_path):
    make_synthetic_kinetics(tmp_path, SPEC)
    ann = load_annotations(tmp_path / "val.csv")
    return ann, _break(ann.records)


def test_read_frames_reasons(broken):
    ann, reasons = broken
    for i, reason in reasons.items():
        with pytest.raises(VideoDecodeError, match=re.escape(reason)):
            read_frames(ann.records[i].path, lambda n: np.arange(4))
    frames, _ = read_frames(ann.records[5].path, lambda n: np.arange(4))
    assert frames.shape == (4, 48, 64, 3)


def test_training_substitutes_another_video(broken):
    ann, reasons = broken
    ds = KineticsVideoDataset(ann, "train", 4, 2, transform=CFG)
    for i in range(len(ds)):
        item = ds[i]
        assert item["video"].shape == (3, 4, 32, 32)
        if i in reasons:
            assert item["index"] == 5  # the only good video
            path, reason = item["skipped"][0]
            assert path == str(ann.records[i].path) and reason.startswith(reasons[i])
        else:
            assert item["index"] == i and item["skipped"] == []


def test_training_gives_up_with_a_clear_error_when_nothing_decodes(tmp_path):
    make_synthetic_kinetics(tmp_path, SyntheticSpec(num_train=2, num_val=1, width=64, height=48, frames=4))
    ann = load_annotations(tmp_path / "train.csv")
    for r in ann.records:
        r.path.write_bytes(b"")
    ds = KineticsVideoDataset(ann, "train", 4, 1, transform=CFG, max_substitutions=3)
    with pytest.raises(RuntimeError, match="4 videos in a row could not be decoded"):
        ds[0]


class _MeanColour(torch.nn.Module):
    """Deterministic stand-in classifier: logits from the mean of each channel."""

    def forward(self, x):
        m = x.mean(dim=(2, 3, 4))
        return torch.cat([m, -m], dim=1)  # (B, 6)


def test_evaluation_skips_and_reports(broken):
    ann, reasons = broken
    ds = KineticsVideoDataset(ann, "test", 4, 2, num_clips=2, transform=CFG)
    loader = DataLoader(ds, batch_size=2, collate_fn=collate_clips, num_workers=1)
    metrics = evaluate(_MeanColour(), loader, 6, torch.device("cpu"), show_progress=False)
    assert metrics["num_videos"] == 1 and metrics["num_views"] == 2
    assert metrics["skipped"] == 5
    listed = {d["path"]: d["reason"] for d in metrics["skipped_videos"]}
    for i, reason in reasons.items():
        assert listed[str(ann.records[i].path)].startswith(reason)
