"""Data for DETR: checked COCO-format datasets, DETR's v2 augmentation, DEIM's mosaic / mixup, synthetic shapes."""

from ..labels import LABEL_MODES, LabelMap, match_label_names
from .annotations import CocoAnnotationError, CocoAnnotations, CocoDataError, load_coco_annotations
from .coco import CocoDetr, collate_detr, infer_num_classes, read_rgb, resolve_coco_paths
from .dense_o2o import DenseO2O, MixupCollate, Mosaic, MosaicDataset, active_augmentations
from .synthetic import SHAPES, SyntheticSpec, make_synthetic_coco
from .transforms import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    RTDETR_SIZE,
    RTDETR_TRAIN_SIZES,
    MultiScaleCollate,
    RandomSizeCrop,
    StopEpochTransforms,
    make_rtdetr_train_transforms,
    make_rtdetr_val_transforms,
    make_train_transforms,
    make_val_transforms,
    scaled_max_size,
    to_detr_target,
)

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "LABEL_MODES",
    "RTDETR_SIZE",
    "RTDETR_TRAIN_SIZES",
    "SHAPES",
    "CocoAnnotationError",
    "CocoAnnotations",
    "CocoDataError",
    "CocoDetr",
    "DenseO2O",
    "LabelMap",
    "MixupCollate",
    "Mosaic",
    "MosaicDataset",
    "MultiScaleCollate",
    "RandomSizeCrop",
    "StopEpochTransforms",
    "SyntheticSpec",
    "active_augmentations",
    "collate_detr",
    "infer_num_classes",
    "load_coco_annotations",
    "make_rtdetr_train_transforms",
    "make_rtdetr_val_transforms",
    "make_synthetic_coco",
    "make_train_transforms",
    "make_val_transforms",
    "match_label_names",
    "read_rgb",
    "resolve_coco_paths",
    "scaled_max_size",
    "to_detr_target",
]
