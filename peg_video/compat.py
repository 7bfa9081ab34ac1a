"""The one place where peg_video patches pytorchvideo 0.1.5 for current torchvision.

pytorchvideo 0.1.5 (the last release) does ``import torchvision.transforms.functional_tensor``
at import time of ``pytorchvideo.transforms``.  torchvision 0.17 renamed that module to the
private ``torchvision.transforms._functional_tensor``, so the import fails on the releases
this project pins.  :func:`ensure_pytorchvideo_compat` registers the renamed module under the
old name in ``sys.modules`` -- only when the old name cannot be imported -- which is all
pytorchvideo needs (it calls ``adjust_brightness``-style helpers that still exist there).

It then imports ``pytorchvideo.transforms`` through :func:`import_pytorchvideo`, which
silences the one warning pytorchvideo 0.1.5 triggers on import under current torch (its
``@torch.jit.script_method`` / ``@torch.jit.script`` decorators: a ``FutureWarning`` that
``torch.jit.script*`` is deprecated, printed on every command and not the user's to act on)
and turns a missing pytorchvideo into a one-line
:class:`~peg_core.errors.MissingDependency`.

Every peg_video module calls :func:`ensure_pytorchvideo_compat` (or :func:`import_pytorchvideo`)
before importing anything from pytorchvideo.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from types import ModuleType

from peg_core.errors import require

__all__ = ["PYTORCHVIDEO", "ensure_pytorchvideo_compat", "import_pytorchvideo"]

_OLD_NAME = "torchvision.transforms.functional_tensor"
#: the pip requirement named when pytorchvideo is missing (the release peg-video pins)
PYTORCHVIDEO = "pytorchvideo==0.1.5"
#: torch's deprecation of the TorchScript decorators that pytorchvideo 0.1.5 applies at import time
_JIT_DEPRECATION = r"`torch\.jit\.script(_method)?` is deprecated"


def ensure_pytorchvideo_compat() -> None:
    """Make ``import pytorchvideo.transforms`` work on torchvision >= 0.17, and import it quietly.

    Idempotent; the module registration is a no-op on torchvision releases that still ship
    ``torchvision.transforms.functional_tensor``.
    """
    import_pytorchvideo("pytorchvideo.transforms")


def _register_functional_tensor() -> None:
    """Register torchvision's renamed ``_functional_tensor`` under the name pytorchvideo imports."""
    try:
        importlib.import_module(_OLD_NAME)
        return  # an older torchvision still has the real module
    except ImportError:
        pass
    from torchvision.transforms import _functional_tensor

    sys.modules[_OLD_NAME] = _functional_tensor


def import_pytorchvideo(module: str) -> ModuleType:
    """``import module`` (a pytorchvideo module) without torch's TorchScript deprecation warning.

    Only that ``FutureWarning`` is filtered, and only during this import; a missing pytorchvideo
    is a :class:`~peg_core.errors.MissingDependency` naming :data:`PYTORCHVIDEO`.
    """
    if _OLD_NAME not in sys.modules:
        _register_functional_tensor()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_JIT_DEPRECATION, category=FutureWarning)
        return require(module, None, PYTORCHVIDEO, what="peg_video")
