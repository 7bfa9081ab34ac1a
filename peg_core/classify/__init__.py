"""Image classification with a CPVT: ``python -m peg_core make-data|train|eval|predict``.

The task (:class:`ClassifyTask`) supplies the model (:func:`build_model`), the loss, the data
(generated shapes in memory or an ImageFolder tree) and the metrics (top-1 / top-5 at several
input sizes); :mod:`peg_core.engine` runs it.  torch-only on import: torchvision is imported
by the commands that read image files.
"""

from .configs import CONFIGS, DEFAULTS
from .model import ARCHS, DEMO_CONFIG, build_model, load_init_weights, load_model, scaled_sizes
from .predict import Prediction, Predictor, predict_files
from .shapes import CLASS_NAMES, NUM_CLASSES, ShapeScenes, make_shape_splits, sample_scenes
from .task import ClassifyTask

__all__ = [
    "ARCHS",
    "CLASS_NAMES",
    "CONFIGS",
    "DEFAULTS",
    "DEMO_CONFIG",
    "NUM_CLASSES",
    "ClassifyTask",
    "Prediction",
    "Predictor",
    "ShapeScenes",
    "build_model",
    "load_init_weights",
    "load_model",
    "make_shape_splits",
    "predict_files",
    "sample_scenes",
    "scaled_sizes",
]
