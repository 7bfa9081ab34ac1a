"""pytorchvideo's own ``labeled_video_dataset`` as an alternative data path (``--data-backend pytorchvideo``).

The same annotations (either format) are written out as a ``<absolute path> <class index>``
list, so both back-ends use identical class indices.  Clips are cut by time, as pytorchvideo
does: ``num_frames * stride / fps`` seconds, then ``UniformTemporalSubsample(num_frames)``;
``fps`` is read from the first decodable video.  Batches are converted to the dict format of
:func:`peg_video.data.collate_clips`.

Differences to the ``peg`` back-end, inherent to pytorchvideo: it is an ``IterableDataset``
(no ``len``; it shards with ``DistributedSampler`` as the video sampler), its random
augmentation uses the global torch RNG (resume is not bit-exact), and it skips broken videos
internally with a log line (up to 10 in a row) instead of reporting them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import decord
import torch
from torch.utils.data import DistributedSampler, RandomSampler, SequentialSampler

from ..compat import ensure_pytorchvideo_compat
from .annotations import Annotations
from .transforms import ClipTransformConfig, EvalClipTransform

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

__all__ = ["build_pytorchvideo_dataset", "collate_pytorchvideo", "probe_fps", "write_path_label_list"]


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
        except Exception:
            continue
    return default


def build_pytorchvideo_dataset(
    annotations: Annotations,
    list_path: str | Path,
    mode: str,
    num_frames: int,
    stride: int,
    transform: ClipTransformConfig,
    num_clips: int = 1,
    fps: float | None = None,
    distributed: bool = False,
    decoder: str = "decord",
):
    """A pytorchvideo ``LabeledVideoDataset`` over ``annotations``.

    Training: one random clip per video with ``RandomShortSideScale`` + ``RandomCrop``.
    Testing: ``num_clips`` clips per video (``constant_clips_per_video``), each yielding
    ``transform.num_crops`` crops stacked as ``(num_crops, C, T, S, S)``.
    """
    fps = fps or probe_fps(annotations)
    duration = num_frames * stride / fps
    cfg = transform
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
    elif mode == "test":
        steps = [UniformTemporalSubsample(num_frames), Div255(), EvalClipTransform(cfg)]
        sampler = make_clip_sampler("constant_clips_per_video", duration, num_clips)
        video_sampler = (
            (lambda data: DistributedSampler(data, shuffle=False)) if distributed else SequentialSampler
        )
    else:
        raise ValueError(f"mode must be 'train' or 'test', got {mode!r}")
    return labeled_video_dataset(
        str(write_path_label_list(annotations, list_path)),
        clip_sampler=sampler,
        video_sampler=video_sampler,
        transform=ApplyTransformToKey("video", Compose(steps)),
        decode_audio=False,
        decoder=decoder,
    )


def collate_pytorchvideo(batch: list[dict[str, Any]], num_crops: int | None = None) -> dict[str, Any]:
    """pytorchvideo samples -> the batch dict of the training / evaluation loops.

    With ``num_crops`` (testing) the views of clip ``c`` get indices ``c * num_crops + crop``.
    """
    out = {
        "video": torch.stack([b["video"] for b in batch]),
        "label": torch.tensor([int(b["label"]) for b in batch], dtype=torch.long),
        "index": torch.tensor([int(b["video_index"]) for b in batch], dtype=torch.long),
        "skipped": [],
    }
    if num_crops is not None:
        out["view_offset"] = torch.tensor([int(b["clip_index"]) * num_crops for b in batch], dtype=torch.long)
    return out
