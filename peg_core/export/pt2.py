"""Check that a ``.pt2`` archive can be loaded without running anything it contains.

``torch.export.load`` is not a data reader.  On an archive that someone else wrote, torch 2.x
runs the file's code in several places (``torch/export/pt2_archive/_package.py``,
``torch/_export/serde/serialize.py``, ``torch/export/_unlift.py``, ``torch/fx/graph.py``):

* pickles: a weight or tensor constant marked ``"use_pickle": true`` is read with
  ``torch.load(weights_only=False)``; a constant named ``custom_obj_*`` / ``opaque_obj_*`` with
  ``torch._C._pickle_load_obj`` / ``pickle.loads``; ``data/sample_inputs/<model>.pt`` with
  ``weights_only=True`` that falls back to ``weights_only=False`` when that fails; legacy
  layouts (``data/weights/<model>.pt``, a top-level ``version``) the same way;
* native code: ``data/aotinductor/`` holds shared libraries that are loaded;
* Python source: ``guards_code`` strings of ``models/<model>.json`` are ``exec``-ed into the
  module's input check; every ``expr_str`` goes through ``sympy.sympify`` (an ``eval``);
  parameter names are pasted into the generated ``forward`` (``getattr(self, "<name>")``), and
  stack traces into its comments (a ``\\r`` ends a comment line); a node's ``target`` names any
  attribute under ``torch`` (``torch.os.system``), called when the model runs.

:func:`check_pt2_archive` reads the archive with :mod:`zipfile` and :mod:`json` only (and
``torch.load(weights_only=True)`` for the sample inputs) and accepts exactly what
``torch.export.save`` writes for a graph of tensor ops: the members listed in :data:`MEMBERS`,
unpickled tensor payloads, and, in the program, op targets of the ``aten`` /
``quantized_decomposed`` / ``prims`` namespaces, guards and symbolic expressions made of
sizes, integers and arithmetic, and plain names.  Anything else is refused with an
:class:`UnsafeArchiveError` naming the file and the member, before torch sees the file.
"""

from __future__ import annotations

import ast
import io
import os
import pickle
import re
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from ..interop.io import WeightsError
from ..jsonfile import JsonError, parse_json

__all__ = ["MEMBERS", "UnsafeArchiveError", "check_pt2_archive", "read_extra_file"]

#: the one program ``torch.export.save`` writes (``torch.export.load`` returns ``"model"``)
MODEL = "model"
WEIGHTS_CONFIG = f"data/weights/{MODEL}_weights_config.json"
CONSTANTS_CONFIG = f"data/constants/{MODEL}_constants_config.json"
SAMPLE_INPUTS = f"data/sample_inputs/{MODEL}.pt"
PROGRAM = f"models/{MODEL}.json"
#: every member an archive may hold (paths under its root folder); the first five are required
MEMBERS = {
    "archive_format": re.compile(r"archive_format"),
    "archive_version": re.compile(r"archive_version"),
    PROGRAM: re.compile(re.escape(PROGRAM)),
    WEIGHTS_CONFIG: re.compile(re.escape(WEIGHTS_CONFIG)),
    CONSTANTS_CONFIG: re.compile(re.escape(CONSTANTS_CONFIG)),
    SAMPLE_INPUTS: re.compile(re.escape(SAMPLE_INPUTS)),
    "weights": re.compile(r"data/weights/weight_\d+"),
    "constants": re.compile(r"data/constants/tensor_\d+"),
    "extra": re.compile(r"extra/[^/]+"),  # read as text only
    "zip bookkeeping": re.compile(r"byteorder|\.data/version|\.data/serialization_id"),
}
REQUIRED = ("archive_format", "archive_version", PROGRAM, WEIGHTS_CONFIG, CONSTANTS_CONFIG)

#: graph op targets that are plain tensor / integer operations
_TARGET = re.compile(
    r"torch\.ops\.(aten|prims|quantized_decomposed)\.\w+\.\w+"
    r"|_operator\.(getitem|add|sub|mul|floordiv|truediv|mod|neg|pow|eq|ne|lt|le|gt|ge|and_|or_|not_)"
    r"|torch\.sym_(max|min|float|int|not|ite|sqrt|sum)"
    r"|math\.(ceil|floor|trunc|sqrt)"
)
#: names of modules, parameters, buffers, nodes and arguments: pasted into generated code by torch
_NAME = re.compile(r"[A-Za-z0-9_.]*")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: control characters a string may hold (a ``\r`` would end a comment of the generated code)
_ALLOWED_CONTROL = {"\n", "\t"}
#: the pseudo key under which :func:`_items` yields the keys of an object
_KEY = "(a key)"
#: the sympy names torch's printer writes in an ``expr_str`` (``srepr`` form)
_SYMPY_WORDS = (
    "Symbol Integer Rational Float Mul Add Pow Min Max Mod Abs FloorDiv CeilDiv CleanDiv ModularIndexing "
    "Where PythonMod IntTrueDiv FloatTrueDiv TruncToInt RoundToInt RoundDecimal CeilToInt FloorToInt "
    "LShift RShift ToFloat Identity Eq Ne Lt Le Gt Ge StrictLessThan StrictGreaterThan LessThan "
    "GreaterThan Equality Unequality And Or Not Piecewise ExprCondPair True False true false oo zoo nan "
    "Infinity NegativeInfinity IntInfinity NegativeIntInfinity int_oo BooleanTrue BooleanFalse"
)
_SYMPY_NAMES = frozenset(_SYMPY_WORDS.split())
_EXPR_TOKEN = re.compile(
    r"\s+|(?P<num>\d+(\.\d*)?([eE][-+]?\d+)?)|(?P<str>'[^']*'|\"[^\"]*\")|(?P<name>[A-Za-z_]\w*)"
    r"|(?P<op>\*\*|//|==|!=|<=|>=|[-+*/%()<>,=&|~])"
)
_SYMBOL = re.compile(r"[a-z]+\d+|[-+0-9.eE]+")  # s0, u3 ... or a number, the strings of an srepr
#: ``guards_code``: the calls a guard may make, by (object name, attribute)
_GUARD_CALLS = {("torch", f"sym_{f}") for f in ("max", "min", "float", "int", "not", "ite", "sqrt")} | {
    ("math", f) for f in ("ceil", "floor", "trunc", "sqrt", "isnan")
}
_TENSOR_METHODS = {"size", "stride", "storage_offset", "dim"}
_GUARD_NODES = (
    ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.BinOp, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv,
    ast.Mod, ast.Pow, ast.UnaryOp, ast.USub, ast.UAdd, ast.Not, ast.Compare, ast.Eq, ast.NotEq, ast.Lt,
    ast.LtE, ast.Gt, ast.GtE, ast.Call, ast.Attribute, ast.Subscript, ast.Name, ast.Constant, ast.Load,
)  # fmt: skip


class UnsafeArchiveError(WeightsError):
    """A ``.pt2`` archive refused before loading: ``what`` names the member and why, ``where`` the file."""


class _Refused(Exception):
    """Internal: the reason a member is refused (turned into :class:`UnsafeArchiveError` with the file)."""

    def __init__(self, member: str, reason: str) -> None:
        super().__init__(member, reason)
        self.member, self.reason = member, reason


def check_pt2_archive(path: str | os.PathLike) -> None:
    """Refuse a ``.pt2`` file that ``torch.export.load`` could not read without running its contents.

    Reads the zip directory and the JSON members only; the sample inputs are tried with
    ``torch.load(weights_only=True)`` (so torch's fallback to full unpickling cannot happen).

    Raises:
        UnsafeArchiveError: not a zip, not the PT2 archive format, a member outside :data:`MEMBERS`
            (a legacy layout, AOTInductor libraries, ...), a pickled or non-tensor payload, sample
            inputs that need more than tensors, or a program with code or names that torch would
            run or paste into code; the message names the member (and the entry) and the file.
    """
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as zf:
            _check_archive(zf)
    except _Refused as e:
        raise UnsafeArchiveError(
            f"refused .pt2 member {e.member}: {e.reason} (nothing in the file was run)", path
        ) from None
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise UnsafeArchiveError(f"not a .pt2 archive (not a readable zip file: {e})", path) from None


def _check_archive(zf: zipfile.ZipFile) -> None:
    names = zf.namelist()
    roots = {n.split("/", 1)[0] for n in names}
    if len(roots) != 1 or any("/" not in n for n in names):
        raise _Refused(
            names[0] if names else "(none)", "not a PT2 archive (members must share one root folder)"
        )
    root = roots.pop()
    members = {n.split("/", 1)[1]: n for n in names}
    for rel in REQUIRED:
        if rel not in members:
            raise _Refused(f"{root}/{rel}", "missing: not a PT2 archive written by torch.export.save")

    def read(rel: str) -> bytes:
        return zf.read(members[rel])

    if read("archive_format").strip() != b"pt2":
        raise _Refused(members["archive_format"], "not the PT2 archive format (expected 'pt2')")
    # the configs first: they say why a payload member is there (a pickle, an opaque object)
    _check_payloads(members[WEIGHTS_CONFIG], read(WEIGHTS_CONFIG), "weight_", "data/weights/", members)
    _check_payloads(members[CONSTANTS_CONFIG], read(CONSTANTS_CONFIG), "tensor_", "data/constants/", members)
    for rel, full in members.items():
        if not any(p.fullmatch(rel) for p in MEMBERS.values()):
            raise _Refused(full, "not a member torch.export.save writes for one program of tensor ops")
    if SAMPLE_INPUTS in members:
        _check_sample_inputs(members[SAMPLE_INPUTS], read(SAMPLE_INPUTS))
    _check_program(members[PROGRAM], read(PROGRAM))


#: the deepest nesting of a JSON member (what torch.export.save writes is far shallower; a
#: hostile member is refused here, never a RecursionError)
_MAX_JSON_DEPTH = 128


def _json(member: str, data: bytes) -> Any:
    """A JSON member, parsed by :func:`peg_core.jsonfile.parse_json` (nesting limit, no NaN)."""
    try:
        return parse_json(data, member, "the member", max_depth=_MAX_JSON_DEPTH)
    except JsonError as e:
        raise _Refused(member, e.what.removeprefix("the member is ")) from None


def _check_payloads(member: str, data: bytes, prefix: str, folder: str, members: dict[str, str]) -> None:
    """A weights / constants config: every entry an unpickled tensor stored as ``<prefix><i>``."""
    config = _json(member, data)
    entries = config.get("config") if isinstance(config, dict) else None
    if not isinstance(entries, dict):
        raise _Refused(member, "not a payload config ({'config': {name: entry}})")
    for fqn, entry in entries.items():
        if not isinstance(entry, dict):
            raise _Refused(member, f"entry {fqn!r} is not an object")
        if not _NAME.fullmatch(fqn):
            raise _Refused(member, f"entry name {fqn!r} is not a plain dotted name")
        name = entry.get("path_name")
        if not isinstance(name, str) or not re.fullmatch(re.escape(prefix) + r"\d+", name):
            raise _Refused(member, f"entry {fqn!r} is stored as {name!r}, not a tensor payload {prefix}<i>")
        if entry.get("use_pickle") is not False:
            raise _Refused(
                member, f"entry {fqn!r} has use_pickle {entry.get('use_pickle')!r}: a pickle, never loaded"
            )
        if folder + name not in members:
            raise _Refused(member, f"entry {fqn!r} names {folder + name}, which is not in the archive")
        if not isinstance(entry.get("tensor_meta"), dict):
            raise _Refused(member, f"entry {fqn!r} has no tensor_meta")


def _check_sample_inputs(member: str, data: bytes) -> None:
    """The example inputs must load as tensors and containers alone (torch would retry with full pickle)."""
    if not data:
        return  # torch reads an empty member as no inputs
    try:
        obj = torch.load(io.BytesIO(data), weights_only=True)
    except pickle.UnpicklingError as e:
        reason = "pickled objects other than tensors" if "GLOBAL" in str(e) else "not a torch file"
        raise _Refused(member, f"{reason}; loaded with weights_only=True, nothing was run") from None
    except Exception as e:  # garbage bytes fail the unpickler in many ways; all mean the same
        raise _Refused(member, f"not a torch file of tensors ({type(e).__name__})") from None
    if not isinstance(obj, (tuple, dict)):
        raise _Refused(member, f"holds a {type(obj).__name__}, not a tuple of example inputs")


def _check_program(member: str, data: bytes) -> None:
    """The serialized program: only strings, names, ops, guards and expressions that stay data."""
    program = _json(member, data)
    if not isinstance(program, dict) or not isinstance(program.get("graph_module"), dict):
        raise _Refused(member, "not a serialized exported program")
    guards = program.get("guards_code", [])
    if not isinstance(guards, list):
        raise _Refused(member, "guards_code is not a list")
    for guard in guards:
        if not isinstance(guard, str) or not _is_safe_guard(guard):
            raise _Refused(
                member, f"guard {str(guard)[:80]!r} is not a size comparison (torch would exec it)"
            )
    graph = program["graph_module"].get("graph", {})
    for arg in graph.get("inputs", []) if isinstance(graph, dict) else []:
        if not (isinstance(arg, dict) and set(arg) <= {"as_tensor", "as_sym_int"}):
            raise _Refused(member, f"graph input {str(arg)[:80]} is not a tensor or size")
    for key, value in _items(program):
        why = _check_item(key, value)
        if why:
            raise _Refused(member, why)


def _items(obj: Any, key: str = "") -> Iterator[tuple[str, Any]]:
    """Every ``(key, value)`` of a JSON tree, depth first (list items carry their list's key)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield _KEY, k  # keys are strings too: checked for control characters only
            yield from _items(v, str(k))
    elif isinstance(obj, list):
        for v in obj:
            yield from _items(v, key)
    else:
        yield key, obj


def _check_item(key: str, value: Any) -> str | None:
    """Why a JSON leaf would let the file run code, or ``None``."""
    if not isinstance(value, str):
        return None
    if any(ord(c) < 32 and c not in _ALLOWED_CONTROL for c in value) or "\x7f" in value:
        return f"{key} {value[:60]!r} holds a control character"
    if key == _KEY:
        return None
    checks: dict[str, Callable[[str], bool]] = {
        "target": lambda v: bool(_TARGET.fullmatch(v)),
        "expr_str": _is_safe_sym_expr,
        "forward_arg_names": lambda v: bool(_IDENTIFIER.fullmatch(v)),
        "in_spec": _is_safe_treespec,
        "out_spec": _is_safe_treespec,
        "fqn": lambda v: bool(_NAME.fullmatch(v)),
    }
    check = checks.get(key) or (lambda v: bool(_NAME.fullmatch(v)) if key.endswith("name") else True)
    return (
        None
        if check(value)
        else f"{key} {value[:80]!r} is not allowed (torch would run or paste it into code)"
    )


def _is_safe_sym_expr(text: str) -> bool:
    """An ``expr_str`` of sizes: sympy's ``srepr`` of integers, size symbols and arithmetic (sympify evals it)."""
    pos, tokens = 0, []
    while pos < len(text):
        m = _EXPR_TOKEN.match(text, pos)
        if not m:
            return False
        tokens.append(m)
        pos = m.end()
    for i, m in enumerate(tokens):
        if m.group("str") is not None and not _SYMBOL.fullmatch(m.group("str")[1:-1]):
            return False
        name = m.group("name")
        if name is None or name in _SYMPY_NAMES or re.fullmatch(r"[a-z]+\d+", name):
            continue
        after = next((t.group(0) for t in tokens[i + 1 :] if t.group(0).strip()), "")
        if not (re.fullmatch(r"[a-z_]+", name) and after == "="):  # a keyword argument: positive=True
            return False
    return True


def _is_safe_treespec(text: str) -> bool:
    """A serialized input / output tree: builtin containers keyed by plain names."""
    try:
        spec = parse_json(text, "in_spec / out_spec", max_depth=_MAX_JSON_DEPTH)
    except JsonError:
        return False

    def ok(node: Any) -> bool:
        if isinstance(node, list):
            return all(ok(n) for n in node)
        if not isinstance(node, dict):
            return isinstance(node, (int, type(None)))
        if node.get("type") not in (None, "builtins.tuple", "builtins.list", "builtins.dict"):
            return False
        context = node.get("context")
        if context is not None:
            if not isinstance(context, str):
                return False
            try:
                keys = parse_json(context, "treespec context", max_depth=_MAX_JSON_DEPTH)
            except JsonError:
                return False
            if keys is not None and not (
                isinstance(keys, list) and all(isinstance(k, str) and _IDENTIFIER.fullmatch(k) for k in keys)
            ):
                return False
        return all(ok(c) for c in node.get("children_spec", []))

    return ok(spec)


def _is_safe_guard(code: str) -> bool:
    """A guard that only compares input sizes: ``L['x'].size()[2] >= 8``, ``torch.sym_max(...)``, arithmetic."""
    try:
        tree = ast.parse(code, mode="eval")
    except (SyntaxError, ValueError, RecursionError):
        return False
    for node in ast.walk(tree):
        if not isinstance(node, _GUARD_NODES):
            return False
        if isinstance(node, ast.Name) and node.id not in ("L", "torch", "math"):
            return False
        if isinstance(node, ast.Constant):
            if isinstance(node.value, str):  # only as the key of L['x']; checked with its Subscript
                continue
            if not isinstance(node.value, (int, float, bool)):
                return False
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            key = node.slice.value
            if isinstance(key, str) and not (_subscripts_l(node.value) and _IDENTIFIER.fullmatch(key)):
                return False
        if isinstance(node, ast.Attribute) and not _is_safe_attribute(node):
            return False
        if isinstance(node, ast.Call) and (node.keywords or not isinstance(node.func, ast.Attribute)):
            return False
    strings = [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    keys = [n.slice for n in ast.walk(tree) if isinstance(n, ast.Subscript)]
    return all(any(s is k for k in keys) for s in strings)


def _subscripts_l(node: ast.AST) -> bool:
    """``L`` or ``L['a']['b']``: the guard's name for the inputs."""
    while isinstance(node, ast.Subscript):
        node = node.value
    return isinstance(node, ast.Name) and node.id == "L"


def _is_safe_attribute(node: ast.Attribute) -> bool:
    if isinstance(node.value, ast.Name) and node.value.id in ("torch", "math"):
        return (node.value.id, node.attr) in _GUARD_CALLS or (node.value.id, node.attr) == ("math", "inf")
    return node.attr in _TENSOR_METHODS and _subscripts_l(node.value)


def read_extra_file(path: str | os.PathLike, name: str) -> str | None:
    """The text of the archive's ``extra/<name>`` member (what ``torch.export.save(extra_files=...)`` wrote), or ``None``."""
    try:
        with zipfile.ZipFile(path) as zf:
            member = next((n for n in zf.namelist() if n.split("/", 1)[-1] == f"extra/{name}"), None)
            return None if member is None else zf.read(member).decode("utf-8", errors="replace")
    except (zipfile.BadZipFile, OSError) as e:
        raise UnsafeArchiveError(f"not a .pt2 archive (not a readable zip file: {e})", path) from None
