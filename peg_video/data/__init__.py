"""Kinetics data: annotations, frame sampling, clip transforms, the decord dataset, the
pytorchvideo alternative and the synthetic generator."""

from .annotations import (
    AnnotationError,
    Annotations,
    VideoRecord,
    is_kinetics_csv,
    load_annotations,
    normalize_label,
    read_class_map,
    read_kinetics_csv,
    read_path_label_list,
    write_class_map,
)
from .datasets import DATASETS, SPLIT_DATASETS, load_dataset, segment_indices
from .decode import decode_size, open_video, source_size
from .kinetics import ClipBatches, KineticsVideoDataset, VideoDecodeError, collate_clips, read_frames
from .sampling import clip_indices, clip_span, multiview_clip_starts, multiview_indices, train_clip_indices
from .synthetic import MOTIONS, FrameSizeError, SyntheticSpec, make_synthetic_dataset, make_synthetic_kinetics
from .transforms import ClipTransformConfig, EvalClipTransform, TrainClipTransform

__all__ = [
    "DATASETS",
    "MOTIONS",
    "SPLIT_DATASETS",
    "AnnotationError",
    "Annotations",
    "ClipBatches",
    "ClipTransformConfig",
    "EvalClipTransform",
    "FrameSizeError",
    "KineticsVideoDataset",
    "SyntheticSpec",
    "TrainClipTransform",
    "VideoDecodeError",
    "VideoRecord",
    "clip_indices",
    "clip_span",
    "collate_clips",
    "decode_size",
    "is_kinetics_csv",
    "load_annotations",
    "load_dataset",
    "make_synthetic_dataset",
    "make_synthetic_kinetics",
    "multiview_clip_starts",
    "multiview_indices",
    "normalize_label",
    "open_video",
    "read_class_map",
    "read_frames",
    "read_kinetics_csv",
    "read_path_label_list",
    "segment_indices",
    "source_size",
    "train_clip_indices",
    "write_class_map",
]
