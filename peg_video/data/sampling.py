"""Which frames and crops make a clip.

A clip is ``num_frames`` frames ``stride`` apart, spanning ``(num_frames - 1) * stride + 1``
frames of the video.  Indices past the last frame are clamped to it, so a video shorter than
the span repeats its last frames instead of failing (the temporal speed stays the one the
model was trained at).
"""

from __future__ import annotations

import numpy as np

__all__ = ["clip_indices", "clip_span", "multiview_clip_starts", "multiview_indices", "train_clip_indices"]


def clip_span(num_frames: int, stride: int) -> int:
    """Number of video frames one clip covers."""
    if num_frames < 1 or stride < 1:
        raise ValueError(f"num_frames and stride must be >= 1, got {num_frames}, {stride}")
    return (num_frames - 1) * stride + 1


def clip_indices(start: int, num_frames: int, stride: int, video_len: int) -> np.ndarray:
    """``(num_frames,)`` int64 frame indices from ``start``, clamped to ``[0, video_len - 1]``."""
    if video_len < 1:
        raise ValueError("video has no frames")
    return np.minimum(start + stride * np.arange(num_frames, dtype=np.int64), video_len - 1)


def train_clip_indices(video_len: int, num_frames: int, stride: int, rng: np.random.Generator) -> np.ndarray:
    """One clip at a uniformly random start (start 0 when the video is shorter than the span)."""
    max_start = max(video_len - clip_span(num_frames, stride), 0)
    return clip_indices(int(rng.integers(0, max_start + 1)), num_frames, stride, video_len)


def multiview_clip_starts(video_len: int, num_frames: int, stride: int, num_clips: int) -> np.ndarray:
    """Starts of ``num_clips`` clips spread evenly over the whole video.

    With two or more clips the first starts at frame 0 and the last ends on the last frame;
    a single clip is centred.
    """
    if num_clips < 1:
        raise ValueError(f"num_clips must be >= 1, got {num_clips}")
    max_start = max(video_len - clip_span(num_frames, stride), 0)
    if num_clips == 1:
        return np.array([max_start // 2], dtype=np.int64)
    return np.round(np.linspace(0, max_start, num_clips)).astype(np.int64)


def multiview_indices(video_len: int, num_frames: int, stride: int, num_clips: int) -> np.ndarray:
    """``(num_clips, num_frames)`` frame indices of the test clips."""
    starts = multiview_clip_starts(video_len, num_frames, stride, num_clips)
    return np.stack([clip_indices(int(s), num_frames, stride, video_len) for s in starts])
