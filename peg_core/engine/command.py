"""How every ``python -m peg_*`` command runs and fails: :func:`run_command`, its exit codes, its parser.

:func:`run_command` runs a verb under the failure policy below; :class:`ArgumentParser` is
argparse with the same one-line error; :class:`UserError` and :class:`TrainingDiverged` are
the command line's own exceptions.  (The library's errors live in :mod:`peg_core.errors`.)

The failure policy:

* A user error (a missing or unreadable path, malformed JSON/CSV, a missing key,
  a corrupt, wrong-model or refused checkpoint, a bad option value, ...) is a
  :class:`UserError`: :func:`run_command` prints it as one line
  ``error: <what>: <file, key or value>`` on stderr and returns :data:`EXIT_ERROR`,
  with no traceback unless ``--debug`` is given.
* Library code raises :class:`~peg_core.errors.InputError` (a ``ValueError``: a weights
  file, annotation file or data setting that does not fit); this is the layer that turns it
  into the same one line, exactly like a :class:`UserError`.
* A bad option value is caught by argparse (:class:`ArgumentParser` prints one
  line too) and exits with :data:`EXIT_USAGE`.
* A NaN/inf loss, NaN/inf predictions (a :class:`~peg_core.errors.NonFiniteError` raised in
  the step or the evaluation) or NaN/inf weights after an epoch stop training with
  :data:`EXIT_DIVERGED`; the last good checkpoint stays.
* Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from ..errors import InputError

__all__ = [
    "EXIT_DIVERGED",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "ArgumentParser",
    "TrainingDiverged",
    "UserError",
    "run_command",
]

EXIT_OK = 0
EXIT_ERROR = 1  #: a user error: bad path, file, key or value; too many broken samples
EXIT_USAGE = 2  #: argparse: unknown flag or bad option value
EXIT_DIVERGED = 3  #: NaN/inf loss, predictions or weights; the last good checkpoint is kept
EXIT_INTERRUPTED = 130  #: Ctrl-C


class UserError(Exception):
    """An error the user can fix: printed as ``error: <what>: <where>`` without a traceback.

    Args:
        what: what went wrong, e.g. ``"annotation file is not JSON"``.
        where: the file, key or value it concerns (``None``: the message is ``what`` alone).
    """

    def __init__(self, what: str, where: Any = None) -> None:
        self.what = what
        self.where = None if where is None else str(where)
        super().__init__(what if where is None else f"{what}: {where}")

    def line(self) -> str:
        """The one line printed on stderr."""
        return "error: " + " ".join(str(self).split())  # never more than one line


class TrainingDiverged(FloatingPointError):
    """The loss, the predictions or the weights became NaN/inf; raised on every rank at the same step."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse with the suite's one-line error: ``error: <prog>: <message> (see --help)``, exit 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"error: {self.prog}: {message} (see --help)\n")
        sys.exit(EXIT_USAGE)


def _wants_debug(argv: Sequence[str]) -> bool:
    return "--debug" in argv


def run_command(fn: Callable[[list[str]], Any], argv: Sequence[str]) -> int:
    """Run ``fn(argv)`` under the failure policy and return the exit code.

    ``fn`` returns ``None`` / an int exit code / anything else (taken as success).
    ``--debug`` anywhere in ``argv`` re-raises user errors with their traceback.
    """
    argv = list(argv)
    try:
        result = fn(argv)
    except (UserError, InputError) as e:
        if _wants_debug(argv):
            raise
        line = e.line() if isinstance(e, UserError) else UserError(e.what, e.where).line()
        print(line, file=sys.stderr, flush=True)
        return EXIT_ERROR
    except TrainingDiverged as e:
        if _wants_debug(argv):
            raise
        print("error: " + " ".join(str(e).split()), file=sys.stderr, flush=True)
        return EXIT_DIVERGED
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `configs NAME | head`: the reader left; nothing more to say to it
        _silence_stdout()
        return EXIT_ERROR
    try:
        sys.stdout.flush()  # a closed pipe surfaces here when the output was buffered
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_ERROR
    return result if isinstance(result, int) and not isinstance(result, bool) else EXIT_OK


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's final flush does not raise again (Python docs' recipe)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
