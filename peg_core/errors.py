"""The one base class of the errors a caller can fix by changing its input (a file, a key, a shape).

Error policy by layer (see ``docs/architecture.md``):

* library code (``peg_core``, ``peg_core.interop``, the models and data readers of
  ``peg_detr`` / ``peg_video``) raises :class:`InputError` subclasses, which are
  ``ValueError`` s, or plain ``ValueError`` / ``TypeError`` for bad arguments;
* only the command-line layer (:func:`peg_core.engine.run_command`) turns an
  :class:`InputError` into the one line ``error: <what>: <where>``;
* anything else is a bug and keeps its traceback.

This module imports nothing, so any layer may use it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["InputError"]


class InputError(ValueError):
    """A problem with the caller's input; ``what`` says what is wrong, ``where`` names the file, key or value.

    ``str(e)`` is ``"<what>: <where>"`` (``"<what>"`` alone when ``where`` is ``None``).
    """

    def __init__(self, what: str, where: Any = None) -> None:
        self.what = what
        self.where = None if where is None else str(where)
        super().__init__(what if where is None else f"{what}: {where}")
