"""The one reader of the JSON files the suite is given: size and nesting limits, one error type.

Every JSON that comes from outside (a Hugging Face ``config.json`` / ``preprocessor_config.json``,
COCO annotations, a video class file, a run's ``report.json``, an exported model's metadata) is
read through :func:`read_json` (or :func:`parse_json` for text already in memory).  Whatever is
wrong with it (missing, unreadable, not UTF-8, larger than ``max_bytes``, not JSON, nested deeper
than ``max_depth``, ``NaN`` where JSON has none, not the top-level type the caller wants) is a
:class:`JsonError` (an :class:`~peg_core.errors.InputError`, so a ``ValueError``) whose ``what``
says why and whose ``where`` names the file, never a ``RecursionError`` or a ``KeyError`` later.

Standard library only, so any layer may use it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .errors import InputError

__all__ = ["MAX_DEPTH", "MAX_JSON_BYTES", "JsonError", "json_depth", "parse_json", "read_json"]

#: the deepest nesting accepted (COCO annotations need 4, Hugging Face configs about 5)
MAX_DEPTH = 64
#: the largest file read by default: COCO's train2017 instances file is about 450 MB
MAX_JSON_BYTES = 2 << 30


class JsonError(InputError):
    """A JSON file that cannot be used: ``what`` says why, ``where`` names the file."""


def json_depth(obj: Any, limit: int = MAX_DEPTH) -> int:
    """Nesting depth of a parsed JSON value (a scalar is 0, ``[1]`` is 1), counted without recursion.

    Stops counting past ``limit`` (returns ``limit + 1``), so a hostile value costs no more than that.
    """
    deepest, stack = 0, [(obj, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            depth += 1
            if depth > limit:
                return depth
            deepest = max(deepest, depth)
            stack.extend((child, depth) for child in (node.values() if isinstance(node, dict) else node))
    return deepest


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_json(
    text: str | bytes,
    where: Any,
    what: str = "JSON file",
    *,
    max_depth: int = MAX_DEPTH,
    kind: type | None = None,
) -> Any:
    """Parse ``text`` (the contents of ``where``) under the limits; see :func:`read_json`."""
    try:
        obj = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise JsonError(f"{what} is nested deeper than {max_depth} levels", where) from None
    except UnicodeDecodeError as e:
        raise JsonError(f"{what} is not UTF-8 text ({e.reason} at byte {e.start})", where) from None
    except ValueError as e:  # json.JSONDecodeError too: the position says where
        raise JsonError(f"{what} is not valid JSON ({e})", where) from None
    if json_depth(obj, max_depth) > max_depth:
        raise JsonError(f"{what} is nested deeper than {max_depth} levels", where)
    if kind is not None and not isinstance(obj, kind):
        expected = {dict: "an object", list: "an array"}.get(kind, kind.__name__)
        raise JsonError(f"{what} must hold {expected} at the top level, not {_json_type(obj)}", where)
    return obj


def read_json(
    path: str | os.PathLike,
    what: str = "JSON file",
    *,
    max_bytes: int = MAX_JSON_BYTES,
    max_depth: int = MAX_DEPTH,
    kind: type | None = None,
) -> Any:
    """The parsed contents of the JSON file ``path``; a :class:`JsonError` naming it when it cannot be used.

    Args:
        path: the file.
        what: how the error names the file (``"Hugging Face config"``, ``"annotation file"``).
        max_bytes: larger files are refused before they are read.
        max_depth: deeper nesting is refused (Python's parser would raise ``RecursionError``).
        kind: ``dict`` or ``list``: the top-level type the caller needs.
    """
    path = Path(path)
    if not path.exists():
        raise JsonError(f"{what} not found", path)
    if not path.is_file():
        raise JsonError(f"{what} is not a file", path)
    size = path.stat().st_size
    if size > max_bytes:
        raise JsonError(f"{what} is {size} bytes, more than the {max_bytes} accepted", path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise JsonError(f"{what} cannot be read ({e.strerror or e})", path) from None
    if not data.strip():
        raise JsonError(f"{what} is empty", path)
    return parse_json(data, path, what, max_depth=max_depth, kind=kind)


def _json_type(obj: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(obj), "a number")
