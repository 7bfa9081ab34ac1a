"""Image classification with a CPVT: ``python -m peg_core make-data|train|eval|predict``.

The task (:class:`ClassifyTask`) supplies the model (:func:`build_model`), the loss, the data
(generated shapes in memory or an ImageFolder tree) and the metrics (top-1 / top-5 at several
input sizes); :mod:`peg_core.engine` runs it.  torch-only on import: torchvision is imported
by the commands that read image files.
"""

from .model import ARCHS, DEMO_CONFIG, build_model, make_optimizer, scaled_sizes, warmup_cosine
from .predict import Prediction, load_classifier, predict_files
from .shapes import CLASS_NAMES, NUM_CLASSES, ShapeScenes, make_shape_splits, sample_scenes
from .task import ClassifyTask, load_model

__all__ = [
    "ARCHS",
    "CLASS_NAMES",
    "DEMO_CONFIG",
    "NUM_CLASSES",
    "ClassifyTask",
    "Prediction",
    "ShapeScenes",
    "build_model",
    "load_classifier",
    "load_model",
    "make_optimizer",
    "make_shape_splits",
    "predict_files",
    "sample_scenes",
    "scaled_sizes",
    "warmup_cosine",
]
