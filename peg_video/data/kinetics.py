"""Map-style Kinetics dataset decoding with decord.

``len()`` is the number of annotated videos, so the dataset works with
``DistributedSampler``.  Only the frames a clip needs are decoded
(``VideoReader.get_batch`` on the unique indices).

Broken videos (missing, zero-byte, truncated, undecodable) never raise:

* training substitutes another video (chosen deterministically from the epoch and index)
  and reports the broken one in the sample's ``"skipped"`` list;
* testing returns ``video=None`` for it; :func:`collate_clips` drops such samples and
  keeps their ``"skipped"`` entries, so the loop can count and list them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import decord
import numpy as np
import torch
from torch.utils.data import Dataset

from .annotations import Annotations
from .sampling import multiview_indices, train_clip_indices
from .transforms import ClipTransformConfig, EvalClipTransform, TrainClipTransform, frames_to_clip

__all__ = ["KineticsVideoDataset", "VideoDecodeError", "collate_clips", "read_frames"]


class VideoDecodeError(RuntimeError):
    """A video that cannot be used; the message says why (missing, empty, undecodable...)."""


def read_frames(path: Path, indices_for_length, num_threads: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Decode the frames ``indices_for_length(num_video_frames)`` asks for.

    Returns ``(frames, indices)`` with ``frames`` ``(N, H, W, 3)`` uint8 holding the unique
    sorted indices and ``indices`` mapping each requested frame into ``frames``.
    Raises :class:`VideoDecodeError` with the reason.
    """
    if not path.is_file():
        raise VideoDecodeError("missing file")
    if path.stat().st_size == 0:
        raise VideoDecodeError("empty (zero-byte) file")
    try:
        reader = decord.VideoReader(str(path), num_threads=num_threads, ctx=decord.cpu(0))
        length = len(reader)
        if length < 1:
            raise VideoDecodeError("no video frames")
        wanted = np.asarray(indices_for_length(length), dtype=np.int64)
        unique, inverse = np.unique(wanted, return_inverse=True)
        batch = reader.get_batch(unique.tolist())
        # pytorchvideo's decord reader switches decord's global bridge to torch.
        frames = batch.asnumpy() if hasattr(batch, "asnumpy") else batch.numpy()
    except VideoDecodeError:
        raise
    except Exception as e:  # decord raises RuntimeError / DECORDError on truncated or foreign files
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise VideoDecodeError(f"undecodable: {first[:160]}") from None
    if frames.shape[0] != len(unique):
        raise VideoDecodeError(f"decoded {frames.shape[0]} of {len(unique)} frames (truncated?)")
    return frames, inverse.reshape(wanted.shape)


class KineticsVideoDataset(Dataset):
    """Kinetics clips for training (``mode="train"``) or multi-view testing (``mode="test"``).

    Sample dict:
        ``video``: train ``(C, T, S, S)``; test ``(num_clips * num_crops, C, T, S, S)`` (views
        ordered clip-major) or ``None`` when the video is broken.
        ``label``: class index.  ``index``: index of the video actually used.
        ``skipped``: list of ``(path, reason)`` for broken videos met while building the sample.

    Args:
        annotations: from :func:`~peg_video.data.annotations.load_annotations`.
        num_frames, stride: clip length and frame step.
        num_clips: test clips spread over the video (first and last included).
        transform: spatial recipe (``num_crops`` lives there).
        seed: base seed of the per-sample generators; :meth:`set_epoch` changes them per epoch.
        max_substitutions: how many other videos training tries before giving up.
    """

    def __init__(
        self,
        annotations: Annotations,
        mode: str = "train",
        num_frames: int = 16,
        stride: int = 4,
        num_clips: int = 1,
        transform: ClipTransformConfig | None = None,
        seed: int = 0,
        max_substitutions: int = 50,
        decode_threads: int = 1,
    ) -> None:
        if mode not in ("train", "test"):
            raise ValueError(f"mode must be 'train' or 'test', got {mode!r}")
        if not annotations.records:
            raise ValueError("no videos in the annotations")
        self.records = annotations.records
        self.classes = annotations.classes
        self.mode = mode
        self.num_frames, self.stride, self.num_clips = num_frames, stride, num_clips
        self.cfg = transform or ClipTransformConfig()
        # Only the mode's own transform is built: a test-only set may use a larger crop than training.
        self.transform = TrainClipTransform(self.cfg) if mode == "train" else EvalClipTransform(self.cfg)
        self.seed = seed
        self.epoch = 0
        self.max_substitutions = max_substitutions
        self.decode_threads = decode_threads

    @property
    def num_views(self) -> int:
        return self.num_clips * self.cfg.num_crops if self.mode == "test" else 1

    def __len__(self) -> int:
        return len(self.records)

    def set_epoch(self, epoch: int) -> None:
        """New random clips each epoch; call before creating the epoch's DataLoader iterator."""
        self.epoch = epoch

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self._train_item(index) if self.mode == "train" else self._test_item(index)

    def _train_item(self, index: int) -> dict[str, Any]:
        rng = np.random.default_rng((self.seed, self.epoch, index))
        skipped = []
        current = index
        for _ in range(self.max_substitutions + 1):
            record = self.records[current]
            try:
                frames, inverse = read_frames(
                    record.path,
                    lambda n: train_clip_indices(n, self.num_frames, self.stride, rng),
                    self.decode_threads,
                )
            except VideoDecodeError as e:
                skipped.append((str(record.path), str(e)))
                current = int(rng.integers(len(self.records)))
                continue
            clip = frames_to_clip(torch.from_numpy(frames[inverse]))
            gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
            return {
                "video": self.transform(clip, gen),
                "label": record.label,
                "index": current,
                "skipped": skipped,
            }
        raise RuntimeError(
            f"{self.max_substitutions + 1} videos in a row could not be decoded, last {skipped[-1]}; "
            "check the data folder"
        )

    def _test_item(self, index: int) -> dict[str, Any]:
        record = self.records[index]
        item = {"video": None, "label": record.label, "index": index, "skipped": []}
        try:
            frames, inverse = read_frames(
                record.path,
                lambda n: multiview_indices(n, self.num_frames, self.stride, self.num_clips),
                self.decode_threads,
            )
        except VideoDecodeError as e:
            item["skipped"] = [(str(record.path), str(e))]
            return item
        frames_t = torch.from_numpy(frames)
        views = [self.transform(frames_to_clip(frames_t[clip_idx])) for clip_idx in inverse]
        item["video"] = torch.cat(views)  # (num_clips * num_crops, C, T, S, S), clip-major
        return item


def collate_clips(batch: list[dict[str, Any]]) -> dict[str, Any]:
    """Stack the usable samples; keep the ``skipped`` reports of every sample.

    ``video`` is ``None`` when no sample in the batch was usable.
    """
    good = [b for b in batch if b["video"] is not None]
    skipped = [s for b in batch for s in b["skipped"]]
    if not good:
        return {
            "video": None,
            "label": torch.empty(0, dtype=torch.long),
            "index": torch.empty(0, dtype=torch.long),
            "skipped": skipped,
        }
    return {
        "video": torch.stack([b["video"] for b in good]),
        "label": torch.tensor([b["label"] for b in good], dtype=torch.long),
        "index": torch.tensor([b["index"] for b in good], dtype=torch.long),
        "skipped": skipped,
    }
