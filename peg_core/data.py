"""The generated shapes set; it lives in :mod:`peg_core.classify.shapes` (this name is kept for imports)."""

from .classify.shapes import *  # noqa: F403
from .classify.shapes import __all__  # noqa: F401
