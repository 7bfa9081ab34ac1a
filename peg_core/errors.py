"""The one base class of the errors a caller can fix by changing its input (a file, a key, a shape).

Error policy by layer (see ``docs/architecture.md``):

* library code (``peg_core``, ``peg_core.interop``, the models and data readers of
  ``peg_detr`` / ``peg_video``) raises :class:`InputError` subclasses, which are
  ``ValueError`` s, or plain ``ValueError`` / ``TypeError`` for bad arguments;
* only the command-line layer (:func:`peg_core.engine.run_command`) turns an
  :class:`InputError` into the one line ``error: <what>: <where>``;
* anything else is a bug and keeps its traceback.

A :class:`NonFiniteError` is no input problem: it says a computation met NaN/inf values (a
model's predictions, as the DETR matcher finds them).  The training engine turns it into the
NaN policy's stop (``TrainingDiverged``, one line, the last good checkpoint kept).

An optional package that is not installed is a :class:`MissingDependency`, raised by
:func:`require` at the one place that imports it: its message names the package and the
``pip install`` line of the extra that brings it.

This module imports only the standard library, so any layer may use it.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

__all__ = ["InputError", "MissingDependency", "NonFiniteError", "require"]


class InputError(ValueError):
    """A problem with the caller's input; ``what`` says what is wrong, ``where`` names the file, key or value.

    ``str(e)`` is ``"<what>: <where>"`` (``"<what>"`` alone when ``where`` is ``None``).
    """

    def __init__(self, what: str, where: Any = None) -> None:
        self.what = what
        self.where = None if where is None else str(where)
        super().__init__(what if where is None else f"{what}: {where}")


class MissingDependency(InputError, ImportError):
    """A package is not installed: ``"<what> needs <module>: pip install '<package>[<extra>]'"``.

    An optional extra of peg-core, or a required dependency of a task package missing from a
    broken installation (``pip install <package>``).

    An :class:`InputError` (the command line prints it as one line, exit 1) and an ``ImportError``
    (code that already falls back on a missing package keeps working).
    """

    def __init__(self, what: str, where: Any = None, *, module: str | None = None) -> None:
        super().__init__(what, where)
        self.name = module  # ImportError's attribute: the module that is missing


class NonFiniteError(ValueError, FloatingPointError):
    """A computation met NaN/inf values, e.g. the predictions a matching cost is built from.

    Raised by library code that cannot go on with such values (the Hungarian matcher); the
    training engine turns it into its NaN/inf stop, exactly like a non-finite loss.  A
    ``ValueError`` (callers that check arguments keep catching it) and a ``FloatingPointError``
    (what it is: an arithmetic result out of range, not a bad argument).
    """


def _install_hint(extra: str | None, package: str = "peg-core") -> str:
    """``pip install 'peg-core[onnx]'`` for an extra; ``pip install decord`` for a plain package."""
    return f"pip install '{package}[{extra}]'" if extra else f"pip install {package}"


def require(module: str, extra: str | None, package: str = "peg-core", what: str | None = None) -> ModuleType:
    """``importlib.import_module(module)``, or a :class:`MissingDependency` naming the extra to install.

    Args:
        module: the dotted module to import, e.g. ``"safetensors.torch"``.
        extra: the extra of ``package`` that brings it (``"onnx"``); ``None``: ``package`` is the
            pip name of the module itself (a required dependency of a task package, e.g. ``"decord"``).
        package: the distribution whose extra it is (``"peg-core"``), or the pip name when ``extra`` is ``None``.
        what: the feature that needs it, e.g. ``"export"`` (``None``: the message says the package
            is not installed).

    Only the absence of ``module``'s own package becomes a :class:`MissingDependency`; a package it
    imports in turn that is missing is a broken installation and keeps its traceback.
    """
    top = module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] != top:
            raise
        problem = f"{what} needs {top}" if what else f"{top} is not installed"
        raise MissingDependency(problem, _install_hint(extra, package), module=module) from e
