"""Decoding at a reduced size: let decord scale frames while it decodes them.

Kinetics videos are mostly 720p or 360p-480p, and training scales their short side down to
256-320 anyway.  Decoding full frames and then scaling them in torch spends most of the
loader's time on pixels that are thrown away; decord's ``VideoReader(width=, height=)``
scales inside the decoder (ffmpeg's swscale, bicubic with a filter widened for downscaling,
so it is also anti-aliased where ``short_side_scale``'s bilinear resize is not).

The decode size is the largest short side the transform can ask for (training: the top of
``train_scale``; testing: ``test_scale``), rounded up to even, and it is used only when the
video's short side exceeds it by more than :data:`REDUCE_MARGIN`: the transform then still
downsamples from the decoded frames, never upsamples, and videos already near the training
scale are decoded untouched (a second resize of a nearly-same-size frame would only blur).

The source size is read once per video and process from the container header with PyAV
(about a millisecond, no frame decoded) and cached.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from peg_core.errors import require

if TYPE_CHECKING:
    from .transforms import ClipTransformConfig

av = require("av", None, "av", what="peg_video")  # the video encoder / decoder (PyAV)
decord = require("decord", None, "decord", what="peg_video")  # the clip reader

__all__ = [
    "REDUCE_MARGIN",
    "VideoSource",
    "decode_size",
    "open_video",
    "source_size",
    "transform_short_side",
]

#: reduce only when the source short side is more than this factor above the decode size
REDUCE_MARGIN = 1.15


def transform_short_side(cfg: ClipTransformConfig, mode: str) -> int:
    """The largest short side a :class:`~peg_video.data.transforms.ClipTransformConfig` asks for.

    ``mode`` is ``"train"`` (the top of ``train_scale``) or ``"test"`` (``test_scale``).
    """
    return int(cfg.train_scale[1]) if mode == "train" else int(cfg.test_scale)


def decode_size(
    width: int, height: int, short_side: int | None, margin: float = REDUCE_MARGIN
) -> tuple[int, int] | None:
    """``(width, height)`` to decode a ``width x height`` video at, or ``None`` for full size.

    The short side becomes ``short_side`` rounded up to even; the long side is
    ``floor(long * new_short / short)``, the width ``short_side_scale`` itself would give at
    that scale, so testing at an even ``test_scale`` sees exactly the frame shape of full decoding
    (at other scales the long side may come out one pixel shorter).
    """
    if short_side is None or short_side <= 0:
        return None
    target = short_side + short_side % 2
    short, long = min(width, height), max(width, height)
    if short <= margin * target:
        return None
    new_long = (long * target) // short
    return (new_long, target) if width >= height else (target, new_long)


@lru_cache(maxsize=1 << 18)
def _probe(path: str, mtime_ns: int, size: int) -> tuple[int, int] | None:
    # Keyed on (path, mtime, size) so a file replaced in place (e.g. by ``prepare``) is probed again.
    try:
        with av.open(path) as container:
            if not container.streams.video:
                return None
            stream = container.streams.video[0]
            w, h = int(stream.width or 0), int(stream.height or 0)
    except (av.FFmpegError, OSError, UnicodeDecodeError, ValueError):
        return None
    return (w, h) if w > 0 and h > 0 else None


def source_size(path: str | Path) -> tuple[int, int] | None:
    """``(width, height)`` of the first video stream from the container header, or ``None``
    when the file cannot be probed (decord then reports the real reason)."""
    try:
        st = Path(path).stat()
    except OSError:
        return None
    return _probe(str(path), st.st_mtime_ns, st.st_size)


class VideoSource:
    """A decord reader, at a reduced size when that is safe; the interface ``read_frames`` uses.

    Attributes:
        size: ``(width, height)`` frames are decoded at (``None``: the video's own size).
    """

    def __init__(self, path: str | Path, num_threads: int = 1, short_side: int | None = None) -> None:
        self.path = str(path)
        self.num_threads = num_threads
        src = source_size(path) if short_side else None
        self.size = decode_size(*src, short_side) if src else None
        self.reader = self._open(self.size)

    def _open(self, size: tuple[int, int] | None) -> decord.VideoReader:
        w, h = size if size else (-1, -1)
        return decord.VideoReader(
            self.path, ctx=decord.cpu(0), width=w, height=h, num_threads=self.num_threads
        )

    def __len__(self) -> int:
        return len(self.reader)

    def get_batch(self, indices: list[int]) -> np.ndarray:
        """Frames ``(N, H, W, 3)`` uint8 of ``indices``.

        decord 0.6 mis-sizes a few output sizes (it fails with a size-mismatch error): such a
        video is decoded again at full size rather than reported broken.
        """
        try:
            return _to_numpy(self.reader.get_batch(indices))
        except decord.DECORDError:
            if self.size is None:
                raise
        self.size = None
        self.reader = self._open(None)
        return _to_numpy(self.reader.get_batch(indices))


def _to_numpy(batch) -> np.ndarray:
    # pytorchvideo's decord reader switches decord's global bridge to torch.
    return batch.asnumpy() if hasattr(batch, "asnumpy") else batch.numpy()


def open_video(path: str | Path, num_threads: int = 1, short_side: int | None = None) -> VideoSource:
    """Open ``path`` for decoding frames whose short side need not exceed ``short_side``
    (``None``: full size).  Raises decord's errors for undecodable files."""
    return VideoSource(path, num_threads, short_side)
