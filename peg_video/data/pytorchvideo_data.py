"""pytorchvideo's own ``labeled_video_dataset`` as an alternative data path (``--data-backend pytorchvideo``).

The same annotations (either format) are written out as a ``<absolute path> <class index>``
list, so both back-ends use identical class indices.  Clips are cut by time, as pytorchvideo
does: ``num_frames * stride / fps`` seconds, then ``UniformTemporalSubsample(num_frames)``;
``fps`` is read from the first decodable video.  Samples are converted to the dict format of
:func:`peg_video.data.collate_clips`, so both back-ends batch with
:class:`~peg_video.data.ClipBatches`.

Broken videos: pytorchvideo passes over a video it cannot open (and gives up after 10 in a
row); a clip it cannot decode raised out of its iterator.  :class:`ReportingVideoDataset`
watches its decoder: every failure becomes a ``(path, reason)`` entry in the next sample's
``skipped`` list, so the engine counts and lists them as for the ``peg`` back-end.

Differences to the ``peg`` back-end, inherent to pytorchvideo: it is an ``IterableDataset``
(its length is an estimate; it shards with ``DistributedSampler`` as the video sampler), its
random augmentation uses the global torch RNG (resume is not bit-exact), and a broken video
is passed over, not substituted, so batches (and, under DDP, the ranks' step counts) can differ.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from torch.utils.data import DistributedSampler, IterableDataset, RandomSampler, SequentialSampler

from peg_core.errors import require

from ..compat import ensure_pytorchvideo_compat
from .annotations import Annotations
from .kinetics import DECODE_ERRORS, first_line
from .transforms import ClipTransformConfig, EvalClipTransform

decord = require("decord", None, "decord", what="peg_video")  # the clip reader

ensure_pytorchvideo_compat()
from pytorchvideo.data import labeled_video_dataset, make_clip_sampler  # noqa: E402
from pytorchvideo.transforms import (  # noqa: E402
    ApplyTransformToKey,
    Div255,
    Normalize,
    RandomShortSideScale,
    UniformTemporalSubsample,
)
from torchvision.transforms import Compose, RandomCrop, RandomHorizontalFlip  # noqa: E402

__all__ = ["ReportingVideoDataset", "build_pytorchvideo_dataset", "probe_fps", "write_path_label_list"]

#: the message of pytorchvideo's RuntimeError after ``_MAX_CONSECUTIVE_FAILURES`` broken videos
_GAVE_UP = "Failed to load video after"


def write_path_label_list(annotations: Annotations, path: str | Path) -> Path:
    """Write ``<absolute path> <label>`` lines (the format pytorchvideo's ``from_csv`` reads)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{r.path.resolve()} {r.label}\n" for r in annotations.records))
    return path


def probe_fps(annotations: Annotations, default: float = 30.0) -> float:
    """Average frame rate of the first video decord can open (``default`` if none)."""
    for record in annotations.records[:50]:
        try:
            return float(decord.VideoReader(str(record.path), num_threads=1).get_avg_fps())
        except DECODE_ERRORS:
            continue
    return default


class _RecordingVideo:
    """A pytorchvideo ``Video`` whose clip decoding failures are recorded, not raised."""

    def __init__(self, video: Any, path: str, fail: Callable[[str, str], None]) -> None:
        self._video, self._path, self._fail = video, path, fail

    def get_clip(self, start_sec: float, end_sec: float) -> dict[str, Any]:
        try:
            clip = self._video.get_clip(start_sec, end_sec)
        except DECODE_ERRORS as e:  # raised out of pytorchvideo's iterator: it would end the epoch
            self._fail(self._path, f"undecodable: {first_line(e)}")
            return {"video": None, "audio": None}
        if clip is None or clip.get("video") is None:
            self._fail(self._path, "no frames decoded for the clip (truncated?)")
        return clip

    def __getattr__(self, name: str) -> Any:  # duration, name, close
        return getattr(self._video, name)


class _RecordingPathHandler:
    """Stands in for pytorchvideo's ``VideoPathHandler``: records why a video cannot be opened."""

    def __init__(self, handler: Any) -> None:
        self.handler = handler
        self.failures: dict[str, str] = {}

    def fail(self, path: str, reason: str) -> None:
        self.failures.setdefault(str(path), reason)

    def video_from_path(self, filepath: str, **kwargs: Any) -> Any:
        path = Path(filepath)
        if not path.is_file():
            self.fail(filepath, "missing file")
            raise FileNotFoundError(filepath)
        if path.stat().st_size == 0:
            self.fail(filepath, "empty (zero-byte) file")
            raise ValueError(f"{filepath} is empty")
        try:
            video = self.handler.video_from_path(filepath, **kwargs)
        except DECODE_ERRORS as e:
            self.fail(filepath, f"undecodable: {first_line(e)}")
            raise
        return _RecordingVideo(video, filepath, self.fail)

    def drain(self) -> list[tuple[str, str]]:
        out, self.failures = list(self.failures.items()), {}
        return out


class ReportingVideoDataset(IterableDataset):
    """pytorchvideo's ``LabeledVideoDataset`` yielding the sample dicts of :func:`~peg_video.data.collate_clips`.

    ``video`` train ``(C, T, S, S)`` / test ``(num_crops, C, T, S, S)``, ``label``, ``index`` (video
    index), ``view_offset`` (test: ``clip_index * num_crops``) and ``skipped``: the videos that
    failed since the previous sample.  Broken videos at the end of the stream come in a last
    sample with ``video=None``.

    Args:
        dataset: a ``LabeledVideoDataset``.
        mode: ``"train"`` or ``"test"``.
        num_crops: test crops per clip.
        length: samples per epoch on this process (an estimate for ``len(loader)``).
    """

    def __init__(self, dataset: Any, mode: str, num_crops: int, length: int) -> None:
        self.dataset = dataset
        self.mode = mode
        self.num_crops = num_crops
        self.length = length
        self.handler = _RecordingPathHandler(dataset.video_path_handler)
        dataset.video_path_handler = self.handler

    def __len__(self) -> int:
        return self.length

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle a ``DistributedSampler`` video sampler for ``epoch``."""
        sampler = self.dataset.video_sampler
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)

    def _convert(self, sample: dict[str, Any]) -> dict[str, Any]:
        out = {
            "video": sample["video"],
            "label": int(sample["label"]),
            "index": int(sample["video_index"]),
            "skipped": self.handler.drain(),
        }
        if self.mode == "test":
            out["view_offset"] = int(sample["clip_index"]) * self.num_crops
        return out

    def __iter__(self) -> Iterator[dict[str, Any]]:
        it = iter(self.dataset)
        while True:
            try:
                sample = next(it)
            except StopIteration:
                break
            except RuntimeError as e:
                if not str(e).startswith(_GAVE_UP):
                    raise
                continue  # 10 broken videos in a row: they are recorded; go on with the next ones
            yield self._convert(sample)
        rest = self.handler.drain()
        if rest:
            yield {"video": None, "label": -1, "index": -1, "skipped": rest}


def build_pytorchvideo_dataset(
    annotations: Annotations,
    list_path: str | Path,
    mode: str,
    num_frames: int,
    stride: int,
    transform: ClipTransformConfig,
    num_clips: int = 1,
    fps: float | None = None,
    world_size: int = 1,
    decoder: str = "decord",
) -> ReportingVideoDataset:
    """A pytorchvideo ``LabeledVideoDataset`` over ``annotations``, wrapped in :class:`ReportingVideoDataset`.

    Training: one random clip per video with ``RandomShortSideScale`` + ``RandomCrop``.
    Testing: ``num_clips`` clips per video (``constant_clips_per_video``), each yielding
    ``transform.num_crops`` crops stacked as ``(num_crops, C, T, S, S)``.
    ``world_size > 1`` shards the videos with ``DistributedSampler``.
    """
    fps = fps or probe_fps(annotations)
    duration = num_frames * stride / fps
    cfg = transform
    distributed = world_size > 1
    if mode == "train":
        steps = [
            UniformTemporalSubsample(num_frames),
            Div255(),
            Normalize(cfg.mean, cfg.std),
            RandomShortSideScale(*cfg.train_scale),
            RandomCrop(cfg.crop),
        ]
        if cfg.hflip:
            steps.append(RandomHorizontalFlip())
        sampler = make_clip_sampler("random", duration)
        video_sampler = DistributedSampler if distributed else RandomSampler
        per_video = 1
    elif mode == "test":
        steps = [UniformTemporalSubsample(num_frames), Div255(), EvalClipTransform(cfg)]
        sampler = make_clip_sampler("constant_clips_per_video", duration, num_clips)
        video_sampler = (
            (lambda data: DistributedSampler(data, shuffle=False)) if distributed else SequentialSampler
        )
        per_video = num_clips
    else:
        raise ValueError(f"mode must be 'train' or 'test', got {mode!r}")
    dataset = labeled_video_dataset(
        str(write_path_label_list(annotations, list_path)),
        clip_sampler=sampler,
        video_sampler=video_sampler,
        transform=ApplyTransformToKey("video", Compose(steps)),
        decode_audio=False,
        decoder=decoder,
    )
    length = math.ceil(len(annotations.records) / world_size) * per_video
    return ReportingVideoDataset(dataset, mode, cfg.num_crops, length)
