"""Frame indices of training and multi-view test clips, and the spatial test crops."""

import math

import numpy as np
import pytest
import torch

from peg_video.data.sampling import (
    clip_indices,
    clip_span,
    multiview_clip_starts,
    multiview_indices,
    train_clip_indices,
)
from peg_video.data.transforms import ClipTransformConfig, EvalClipTransform, normalize_clip


def test_span_and_clamp():
    assert clip_span(16, 4) == 61 and clip_span(1, 8) == 1
    np.testing.assert_array_equal(clip_indices(3, 4, 2, 100), [3, 5, 7, 9])
    np.testing.assert_array_equal(clip_indices(0, 5, 3, 7), [0, 3, 6, 6, 6])  # last frame repeats
    with pytest.raises(ValueError):
        clip_span(0, 1)


def test_train_clip_covers_all_starts_and_stays_inside():
    rng = np.random.default_rng(0)
    starts = set()
    for _ in range(400):
        idx = train_clip_indices(40, 8, 4, rng)  # span 29 -> starts 0..11
        assert idx.min() >= 0 and idx.max() <= 39
        np.testing.assert_array_equal(np.diff(idx), 4)
        starts.add(int(idx[0]))
    assert starts == set(range(12))


def test_train_clip_short_video_repeats_frames():
    idx = train_clip_indices(5, 8, 2, np.random.default_rng(1))
    np.testing.assert_array_equal(idx, [0, 2, 4, 4, 4, 4, 4, 4])


def test_multiview_first_and_last_clip():
    video_len, frames, stride = 300, 16, 4  # span 61 -> last start 239
    views = multiview_indices(video_len, frames, stride, num_clips=4)
    assert views.shape == (4, 16)
    np.testing.assert_array_equal(views[:, 0], [0, 80, 159, 239])  # round(linspace(0, 239, 4))
    assert views[0, 0] == 0 and views[-1, -1] == video_len - 1
    np.testing.assert_array_equal(np.diff(views, axis=1), 4)


def test_multiview_single_clip_is_centred_and_short_video():
    np.testing.assert_array_equal(multiview_clip_starts(100, 8, 2, 1), [42])  # (100 - 15) // 2
    views = multiview_indices(6, 4, 2, num_clips=3)  # span 7 > 6 frames
    np.testing.assert_array_equal(views, [[0, 2, 4, 5]] * 3)


def _ramp_clip(h: int, w: int) -> torch.Tensor:
    """(3, 2, h, w) clip whose value encodes the pixel position."""
    yy, xx = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    return (yy * 1000 + xx).float().expand(3, 2, h, w).clone()


@pytest.mark.parametrize("h, w", [(8, 14), (13, 8)])
def test_three_crops_along_the_long_side(h, w):
    cfg = ClipTransformConfig(
        crop=8, train_scale=(8, 8), test_scale=8, num_crops=3, mean=(0, 0, 0), std=(1, 1, 1)
    )
    clip = _ramp_clip(h, w)
    views = EvalClipTransform(cfg)(clip)  # short side already 8: no resampling
    assert views.shape == (3, 3, 2, 8, 8)
    long = max(h, w)
    offsets = [0, math.ceil((long - 8) / 2), long - 8]  # left/centre/right or top/centre/bottom
    for view, off in zip(views, offsets):
        expected = clip[..., :, off : off + 8] if w > h else clip[..., off : off + 8, :]
        torch.testing.assert_close(view, expected)


def test_normalize_clip_per_channel():
    clip = torch.ones(3, 2, 2, 2)
    out = normalize_clip(clip, (0.5, 0.0, 1.0), (0.5, 2.0, 1.0))
    torch.testing.assert_close(out[:, 0, 0, 0], torch.tensor([1.0, 0.5, 0.0]))
