"""Map-style Kinetics dataset decoding with decord.

``len()`` is the number of annotated videos, so the dataset works with
``DistributedSampler``.  Only the frames a clip needs are decoded
(``VideoReader.get_batch`` on the unique indices).

Broken videos (missing, zero-byte, truncated, undecodable) are reported to the engine
(``peg_core.engine``), which counts them, lists them in ``report.json`` and stops above
``--max-broken``:

* training substitutes another video (chosen deterministically from the epoch and index, so
  every process still gets a full batch) and reports the broken one in the sample's
  ``"skipped"`` list; when ``max_substitutions`` others are broken too it raises
  :class:`~peg_core.engine.BrokenSample`;
* testing raises :class:`~peg_core.engine.BrokenSample` for it.

Wrap the dataset in :class:`~peg_core.engine.SkipBroken` and batch with :class:`ClipBatches`:
batches are :class:`~peg_core.engine.SampleBatch` holding the usable clips and every broken
video met.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from peg_core.engine import BrokenSample, SampleBatch, skipping_collate
from peg_core.errors import require

from .annotations import Annotations
from .datasets import segment_indices
from .decode import open_video, transform_short_side
from .sampling import multiview_indices, train_clip_indices
from .transforms import ClipTransformConfig, EvalClipTransform, TrainClipTransform, frames_to_clip

decord = require("decord", None, "decord", what="peg_video")  # the clip reader

__all__ = [
    "DECODE_ERRORS",
    "ClipBatches",
    "KineticsVideoDataset",
    "VideoDecodeError",
    "collate_clips",
    "first_line",
    "flatten_repeats",
    "read_frames",
]

#: what decord raises on a truncated or foreign file (its DECORDError is not a RuntimeError)
DECODE_ERRORS = (RuntimeError, decord.DECORDError)


class VideoDecodeError(RuntimeError):
    """A video that cannot be used; the message says why (missing, empty, undecodable...)."""


def first_line(error: BaseException, limit: int = 160) -> str:
    """The first line of an exception's message (decoders write several), or its type name."""
    text = str(error).strip()
    return text.splitlines()[0][:limit] if text else type(error).__name__


def read_frames(
    path: Path, indices_for_length, num_threads: int = 1, max_short_side: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Decode the frames ``indices_for_length(num_video_frames)`` asks for.

    ``max_short_side``: the largest short side the clip transform will scale to; a video well
    above it is decoded at that size (see :mod:`peg_video.data.decode`), ``None`` decodes full frames.

    Returns ``(frames, indices)`` with ``frames`` ``(N, H, W, 3)`` uint8 holding the unique
    sorted indices and ``indices`` mapping each requested frame into ``frames``.
    Raises :class:`VideoDecodeError` with the reason.
    """
    if not path.is_file():
        raise VideoDecodeError("missing file")
    if path.stat().st_size == 0:
        raise VideoDecodeError("empty (zero-byte) file")
    try:
        reader = open_video(path, num_threads, max_short_side)
        length = len(reader)
        if length < 1:
            raise VideoDecodeError("no video frames")
        wanted = np.asarray(indices_for_length(length), dtype=np.int64)
        unique, inverse = np.unique(wanted, return_inverse=True)
        frames = reader.get_batch(unique.tolist())
    except VideoDecodeError:
        raise
    except DECODE_ERRORS as e:
        raise VideoDecodeError(f"undecodable: {first_line(e)}") from None
    if frames.shape[0] != len(unique):
        raise VideoDecodeError(f"decoded {frames.shape[0]} of {len(unique)} frames (truncated?)")
    return frames, inverse.reshape(wanted.shape)


class KineticsVideoDataset(Dataset):
    """Kinetics clips for training (``mode="train"``) or multi-view testing (``mode="test"``).

    Sample dict:
        ``video``: train ``(C, T, S, S)`` (``repeats`` > 1: ``(repeats, C, T, S, S)``, and the
        sample has ``"repeats"``); test ``(num_clips * num_crops, C, T, S, S)`` (views ordered
        clip-major).
        ``label``: class index.  ``index``: index of the video actually used.
        ``skipped``: list of ``(path, reason)`` for broken videos met while building the sample.
    A broken test video, or a training one without a usable substitute, raises
    :class:`~peg_core.engine.BrokenSample`.

    Args:
        annotations: from :func:`~peg_video.data.annotations.load_annotations`.
        num_frames, stride: clip length and frame step.
        num_clips: test clips spread over the video (first and last included).
        transform: spatial recipe (``num_crops`` lives there).
        seed: base seed of the per-sample generators; :meth:`set_epoch` changes them per epoch.
        max_substitutions: how many other videos training tries before giving up.
        sampling: ``"stride"`` (``num_frames`` frames ``stride`` apart) or ``"segment"`` (one
            frame per ``1 / num_frames`` of the whole video, see
            :func:`~peg_video.data.datasets.segment_indices`; ``stride`` is then unused).
        repeats: training clips per visit of a video (repeated augmentation, VideoMAE's
            ``num_sample``): the frames of one sampled clip, spatially augmented ``repeats``
            times, each with its own draws.
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
        sampling: str = "stride",
        repeats: int = 1,
    ) -> None:
        if repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {repeats}")
        self.repeats = repeats
        if mode not in ("train", "test"):
            raise ValueError(f"mode must be 'train' or 'test', got {mode!r}")
        if sampling not in ("stride", "segment"):
            raise ValueError(f"sampling must be 'stride' or 'segment', got {sampling!r}")
        self.sampling = sampling
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
        # Decode large videos at the largest short side the transform asks for; None: full frames.
        self.decode_short_side: int | None = transform_short_side(self.cfg, mode)

    @property
    def num_views(self) -> int:
        return self.num_clips * self.cfg.num_crops if self.mode == "test" else 1

    def __len__(self) -> int:
        return len(self.records)

    def set_epoch(self, epoch: int) -> None:
        """New random clips each epoch; call before creating the epoch's DataLoader iterator."""
        self.epoch = epoch

    def _train_indices(self, video_len: int, rng: np.random.Generator) -> np.ndarray:
        """``(num_frames,)`` frame indices of one training clip."""
        if self.sampling == "segment":
            return segment_indices(video_len, self.num_frames, rng)
        return train_clip_indices(video_len, self.num_frames, self.stride, rng)

    def _test_indices(self, video_len: int) -> np.ndarray:
        """``(num_clips, num_frames)`` frame indices of the test clips."""
        if self.sampling == "segment":
            return segment_indices(video_len, self.num_frames, num_clips=self.num_clips)
        return multiview_indices(video_len, self.num_frames, self.stride, self.num_clips)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self._train_item(index) if self.mode == "train" else self._test_item(index)

    def _train_item(self, index: int) -> dict[str, Any]:
        # Clip, crop and substitutes are functions of (seed, epoch, index): a resumed run sees
        # the same clips whatever worker decodes them.
        rng = np.random.default_rng((self.seed, self.epoch, index))
        skipped: list[tuple[str, str]] = []
        current = index
        for _ in range(self.max_substitutions + 1):
            record = self.records[current]
            try:
                frames, inverse = read_frames(
                    record.path,
                    lambda n: self._train_indices(n, rng),
                    self.decode_threads,
                    self.decode_short_side,
                )
            except VideoDecodeError as e:
                skipped.append((str(record.path), str(e)))
                current = int(rng.integers(len(self.records)))
                continue
            clip = frames_to_clip(torch.from_numpy(frames[inverse]))
            gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
            return {
                "video": self._augment(clip, gen),
                "label": record.label,
                "index": current,
                "skipped": skipped,
                **({"repeats": self.repeats} if self.repeats > 1 else {}),
            }
        path, reason = skipped[0]
        raise BrokenSample(path, f"{reason} (and the {len(skipped) - 1} substitutes tried were broken too)")

    def _augment(self, clip: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """``(C, T, H, W)`` -> ``(C, T, S, S)``, or ``(repeats, C, T, S, S)``: draws one after another."""
        if self.repeats == 1:
            return self.transform(clip, gen)
        return torch.stack([self.transform(clip, gen) for _ in range(self.repeats)])

    def _test_item(self, index: int) -> dict[str, Any]:
        record = self.records[index]
        try:
            frames, inverse = read_frames(
                record.path,
                lambda n: self._test_indices(n),
                self.decode_threads,
                self.decode_short_side,
            )
        except VideoDecodeError as e:
            raise BrokenSample(record.path, str(e)) from None
        frames_t = torch.from_numpy(frames)
        views = [self.transform(frames_to_clip(frames_t[clip_idx])) for clip_idx in inverse]
        # (num_clips * num_crops, C, T, S, S), clip-major
        return {"video": torch.cat(views), "label": record.label, "index": index, "skipped": []}


def collate_clips(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Stack the usable samples; keep the ``skipped`` reports of every sample.

    Returns ``video`` (train ``(B, C, T, S, S)``, test ``(B, V, C, T, S, S)``; ``None`` when no
    sample was usable), ``label`` ``(B,)``, ``index`` ``(B,)`` (video index), ``view_offset``
    ``(B,)`` (first view index of each sample, when the samples carry one) and ``skipped``.
    Training samples with ``repeats`` K (repeated augmentation) give ``K * B`` clips: see
    :func:`flatten_repeats`.
    """
    good = [b for b in items if b.get("video") is not None]
    out: dict[str, Any] = {
        "video": torch.stack([b["video"] for b in good]) if good else None,
        "label": torch.tensor([int(b["label"]) for b in good], dtype=torch.long),
        "index": torch.tensor([int(b["index"]) for b in good], dtype=torch.long),
        "skipped": [s for b in items for s in b.get("skipped", ())],
    }
    if good and "view_offset" in good[0]:
        out["view_offset"] = torch.tensor([int(b["view_offset"]) for b in good], dtype=torch.long)
    if good and "repeats" in good[0]:
        out = flatten_repeats(out)
    return out


def flatten_repeats(batch: dict[str, Any]) -> dict[str, Any]:
    """``video`` ``(B, K, C, T, S, S)`` -> ``(K * B, C, T, S, S)``, clip-major; labels and indices repeated.

    Clip ``k`` of video ``b`` lands at ``k * B + b`` (VideoMAE concatenates video-major): the
    mix pairs each clip with the one before it, which is then another video's whenever ``B > 1``.
    """
    video = batch["video"]
    k = video.shape[1]
    return {
        **batch,
        "video": video.transpose(0, 1).flatten(0, 1),
        "label": batch["label"].repeat(k),
        "index": batch["index"].repeat(k),
    }


class ClipBatches:
    """``collate_fn`` of the video loaders: samples -> :class:`~peg_core.engine.SampleBatch`.

    ``data`` is the :func:`collate_clips` dict without ``skipped`` (``None`` when nothing in the
    batch was usable); ``broken`` lists every broken video met: the markers of
    :class:`~peg_core.engine.SkipBroken` and the samples' ``skipped`` reports.
    A class, not a closure, so DataLoader workers can pickle it.
    """

    def __init__(self) -> None:
        self._collate = skipping_collate(collate_clips)

    def __call__(self, items: list[Any]) -> SampleBatch:
        batch = self._collate(items)
        data = batch.data
        if data is None:
            return batch
        broken = batch.broken + data.pop("skipped")
        return SampleBatch(data if data["video"] is not None else None, broken)
