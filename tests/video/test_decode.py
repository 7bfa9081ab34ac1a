"""Reduced-size decoding (peg_video.data.decode): same clips as decode-full-then-resize.

Tolerance: decord scales with ffmpeg's bicubic swscale (anti-aliased, in YUV before the RGB
conversion), the full path with torch's bilinear resize of the RGB frames.  On smooth content
(the test video has no detail finer than ~40 px) both are samples of the same surface, so
they agree to under 2/255 on average (measured: 0.9-1.7/255); single pixels differ more
(measured up to ~9.4/255, from bicubic vs bilinear weights, the full path's aliasing and x264
noise each resize sees differently), so the maximum is bounded at 12/255.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from peg_video.compat import ensure_pytorchvideo_compat
from peg_video.data import (
    Annotations,
    ClipTransformConfig,
    KineticsVideoDataset,
    VideoRecord,
    read_frames,
)
from peg_video.data.decode import REDUCE_MARGIN, VideoSource, decode_size, source_size, transform_short_side
from peg_video.data.synthetic import write_mp4
from peg_video.data.transforms import frames_to_clip

ensure_pytorchvideo_compat()
from pytorchvideo.transforms.functional import short_side_scale  # noqa: E402

CFG = ClipTransformConfig(crop=112, train_scale=(112, 128), test_scale=128)
MEAN_TOL, MAX_TOL = 2 / 255, 12 / 255


def smooth_video(width: int, height: int, frames: int) -> np.ndarray:
    """``(T, H, W, 3)`` uint8 low-frequency colour waves that drift between frames."""
    t = np.arange(frames, dtype=np.float64)[:, None, None, None]
    y = np.arange(height, dtype=np.float64)[None, :, None, None] / height
    x = np.arange(width, dtype=np.float64)[None, None, :, None] / width
    phase = np.array([0.0, 2.1, 4.2])[None, None, None, :]
    wave = (
        128
        + 60 * np.sin(2 * np.pi * (1.5 * x + 0.05 * t) + phase)
        + 50 * np.cos(2 * np.pi * (y + 0.5 * x) + phase)
    )
    return wave.clip(0, 255).round().astype(np.uint8)


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("decode")
    out = {}
    for name, (w, h) in {
        "wide": (640, 360),
        "tall": (270, 480),
        "small": (160, 128),
        "bad": (96, 80),
    }.items():
        out[name] = root / f"{name}.mp4"
        write_mp4(out[name], smooth_video(w, h, 12), 12)
    return out


def test_decode_size_rules():
    # Short side to the target (rounded up to even), long side as short_side_scale would floor it.
    assert decode_size(640, 360, 128) == (640 * 128 // 360, 128) == (227, 128)
    assert decode_size(1280, 720, 320) == (568, 320)
    assert decode_size(270, 480, 127) == (128, 227)  # portrait, odd target rounded up to even
    # Never at or below the margin above the target, nor without a target.
    assert decode_size(640, int(128 * REDUCE_MARGIN), 128) is None
    assert decode_size(640, int(128 * REDUCE_MARGIN) + 2, 128) == (640 * 128 // 149, 128)
    assert decode_size(160, 128, 128) is None
    assert decode_size(640, 360, None) is None
    assert transform_short_side(CFG, "train") == 128 and transform_short_side(CFG, "test") == 128


def test_source_size_probe(videos, tmp_path):
    assert source_size(videos["wide"]) == (640, 360)
    assert source_size(videos["tall"]) == (270, 480)
    assert source_size(tmp_path / "missing.mp4") is None
    (tmp_path / "text.mp4").write_text("not a video")
    assert source_size(tmp_path / "text.mp4") is None


@pytest.mark.parametrize("name", ["wide", "tall"])
def test_reduced_decode_matches_full_then_resize(videos, name):
    wanted = lambda n: np.array([0, 3, 3, 7, n - 1])  # noqa: E731
    small, inv_s = read_frames(videos[name], wanted, 1, 128)
    full, inv_f = read_frames(videos[name], wanted, 1, None)
    np.testing.assert_array_equal(inv_s, inv_f)
    w, h = decode_size(*source_size(videos[name]), 128)
    assert small.shape == (4, h, w, 3) and full.shape[1:3] == source_size(videos[name])[::-1]
    # The full path's resize to the decode scale gives exactly the reduced frame shape.
    ref = short_side_scale(frames_to_clip(torch.from_numpy(full)), 128).double()
    got = frames_to_clip(torch.from_numpy(small)).double()
    assert got.shape == ref.shape
    diff = (got - ref).abs()
    assert diff.mean() < MEAN_TOL and diff.max() < MAX_TOL, (
        float(diff.mean() * 255),
        float(diff.max() * 255),
    )
    # ...and at a training scale below the decode scale as well.
    ref112 = short_side_scale(frames_to_clip(torch.from_numpy(full)), 112)
    got112 = short_side_scale(frames_to_clip(torch.from_numpy(small)), 112)
    # Below the decode scale the long side may come out one pixel shorter (floor of a slightly
    # smaller aspect ratio): compare the common part.
    long = min(got112.shape[-1], ref112.shape[-1]), min(got112.shape[-2], ref112.shape[-2])
    assert min(got112.shape[-2:]) == min(ref112.shape[-2:]) == 112
    assert abs(got112.shape[-1] - ref112.shape[-1]) + abs(got112.shape[-2] - ref112.shape[-2]) <= 1
    common = (..., slice(0, long[1]), slice(0, long[0]))
    assert (got112[common] - ref112[common]).abs().mean() < MEAN_TOL


def test_dataset_test_views_match_full_decoding(videos):
    ann = Annotations([VideoRecord(videos["wide"], 0), VideoRecord(videos["tall"], 1)], ["a", "b"])
    ds = KineticsVideoDataset(ann, "test", 4, 2, num_clips=2, transform=CFG)
    assert ds.decode_short_side == 128
    reduced = [ds[i]["video"] for i in range(2)]
    ds.decode_short_side = None
    full = [ds[i]["video"] for i in range(2)]
    for r, f in zip(reduced, full):
        assert r.shape == f.shape == (2, 3, 4, 112, 112)
        # Normalised units: a grey level is 1 / (255 * std).
        assert (r - f).abs().mean() < MEAN_TOL / CFG.std[0]


def test_train_clips_have_the_same_shape(videos):
    ann = Annotations([VideoRecord(videos["wide"], 0)], ["a"])
    ds = KineticsVideoDataset(ann, "train", 4, 2, transform=CFG, seed=3)
    clip = ds[0]["video"]
    ds.decode_short_side = None
    assert clip.shape == ds[0]["video"].shape == (3, 4, 112, 112)


def test_small_source_is_not_reduced(videos):
    src = VideoSource(videos["small"], 1, 128)
    assert src.size is None
    a, _ = read_frames(videos["small"], lambda n: np.arange(n), 1, 128)
    b, _ = read_frames(videos["small"], lambda n: np.arange(n), 1, None)
    np.testing.assert_array_equal(a, b)


def test_decord_size_bug_falls_back_to_full_size(videos):
    # decord 0.6 cannot output 48x40 frames; such a video is decoded at full size, not reported broken.
    src = VideoSource(videos["bad"], 1, 40)
    assert src.size == (48, 40)
    frames = src.get_batch([0, 1])
    assert src.size is None and frames.shape == (2, 80, 96, 3)
