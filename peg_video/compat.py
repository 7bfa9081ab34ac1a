"""The one place where peg_video patches pytorchvideo 0.1.5 for current torchvision.

pytorchvideo 0.1.5 (the last release) does ``import torchvision.transforms.functional_tensor``
at import time of ``pytorchvideo.transforms``.  torchvision 0.17 renamed that module to the
private ``torchvision.transforms._functional_tensor``, so the import fails on the releases
this project pins.  :func:`ensure_pytorchvideo_compat` registers the renamed module under the
old name in ``sys.modules`` -- only when the old name cannot be imported -- which is all
pytorchvideo needs (it calls ``adjust_brightness``-style helpers that still exist there).

Every peg_video module calls it before importing anything from pytorchvideo.
"""

from __future__ import annotations

import importlib
import sys

__all__ = ["ensure_pytorchvideo_compat"]

_OLD_NAME = "torchvision.transforms.functional_tensor"


def ensure_pytorchvideo_compat() -> None:
    """Make ``import pytorchvideo.transforms`` work on torchvision >= 0.17.

    Idempotent and a no-op on torchvision releases that still ship
    ``torchvision.transforms.functional_tensor``.
    """
    if _OLD_NAME in sys.modules:
        return
    try:
        importlib.import_module(_OLD_NAME)
        return  # an older torchvision still has the real module
    except ImportError:
        pass
    from torchvision.transforms import _functional_tensor

    sys.modules[_OLD_NAME] = _functional_tensor
