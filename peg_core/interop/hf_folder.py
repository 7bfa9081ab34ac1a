"""A local Hugging Face model folder (what ``save_pretrained`` or a hub snapshot holds), read safely.

``config.json`` is parsed as JSON (nothing runs); the weights are ``model.safetensors`` or
``pytorch_model.bin`` (read by :func:`~peg_core.interop.io.read_state_file`, torch files with
``weights_only=True``), or the shards a ``*.index.json`` lists.  The task packages
(``peg_detr.from_hf``: DETR, RT-DETR; ``peg_video.from_hf``: VideoMAE, TimeSformer, V-JEPA 2) map the
names; this module only reads.  Every problem is a :class:`~peg_core.interop.io.WeightsError` naming
the folder or file.

JSON files are read by :func:`peg_core.jsonfile.read_json` (size and nesting limits: a hostile file
is one line, never a ``RecursionError``).  :class:`ConfigFields` reads one field at a time with its
type and range (``fields.integer("hidden_size", 768)``), so a ``config.json`` or
``preprocessor_config.json`` field of the wrong type or range is one line naming the file and the
field (``config.json key 'hidden_size' must be a positive int; got 0: <folder>/config.json``);
:meth:`ConfigFields.against` compares a field with the tensor it sizes, before any model is built.
"""

from __future__ import annotations

import json
import math
import operator
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from torch import Tensor

from ..jsonfile import JsonError, read_json
from .io import WeightsError, new_file_mode, read_state_file, write_state_file

__all__ = [
    "HF_WEIGHT_FILES",
    "ConfigFields",
    "read_hf_config",
    "read_hf_weights",
    "read_json_object",
    "write_hf_folder",
]

#: the weights of a ``save_pretrained`` folder, in the order they are looked for (safetensors first:
#: reading it unpickles nothing)
HF_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


#: the largest config / preprocessor / shard-index file read (a real one is a few kB; an index of
#: thousands of tensors well under a MB)
MAX_CONFIG_BYTES = 16 << 20


def read_json_object(path: str | os.PathLike, what: str) -> dict[str, Any]:
    """The JSON object in ``path`` (:func:`~peg_core.jsonfile.read_json`'s limits).

    Unreadable, too large, too deeply nested or malformed JSON, or a non-object, is a
    :class:`WeightsError` naming ``path``.
    """
    try:
        obj = read_json(path, what, max_bytes=MAX_CONFIG_BYTES)
    except JsonError as e:
        raise WeightsError(e.what, e.where) from None
    if not isinstance(obj, dict):
        raise WeightsError(f"{what} is not a JSON object (got {type(obj).__name__})", path)
    return obj


def read_hf_config(folder: str | os.PathLike) -> dict[str, Any]:
    """``config.json`` of a model folder, after checking that ``folder`` is one."""
    folder = Path(folder)
    if not folder.exists():
        raise WeightsError("Hugging Face folder not found", folder)
    if not folder.is_dir():
        raise WeightsError("expected a Hugging Face model folder (config.json + weights), got a file", folder)
    if not (folder / "config.json").is_file():
        raise WeightsError("not a Hugging Face model folder (no config.json)", folder)
    return read_json_object(folder / "config.json", "config.json")


def write_hf_folder(
    out_dir: str | os.PathLike,
    config: Mapping[str, Any],
    state: Mapping[str, Tensor],
    files: Mapping[str, Mapping[str, Any]] | None = None,
) -> Path:
    """A ``save_pretrained``-style folder: ``config.json`` and ``model.safetensors`` (``{"format": "pt"}``).

    The one writer of every task's Hugging Face export.  The weights go first, then ``files`` (more
    JSON files by name: ``preprocessor_config.json``, what transformers' ``pipeline`` and
    ``AutoImageProcessor`` read), and the config last, each through a temporary file and a rename,
    so a folder with a ``config.json`` is complete.  ``state``: tensors under their Hugging Face
    names (copied to contiguous CPU tensors here).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous() for k, v in state.items()}
    write_state_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    for name, content in {**(files or {}), "config.json": config}.items():
        if Path(name).name != name or name.startswith("."):
            raise ValueError(f"not a file name inside the folder: {name!r}")
        tmp = out / f".{name}.tmp"
        tmp.write_text(json.dumps(dict(content), indent=2) + "\n")
        os.chmod(tmp, new_file_mode())
        os.replace(tmp, out / name)
    return out


def _tensors(obj: Any, path: Path) -> dict[str, Tensor]:
    if not isinstance(obj, dict) or not all(isinstance(v, Tensor) for v in obj.values()):
        raise WeightsError("Hugging Face weights file is not a state dict of tensors", path)
    return obj


def read_hf_weights(folder: str | os.PathLike) -> tuple[dict[str, Tensor], Path]:
    """``(state dict in the folder's key names, the file to name in messages)``.

    One weights file, or the shards of ``model.safetensors.index.json`` /
    ``pytorch_model.bin.index.json`` (its ``weight_map``), merged.
    """
    folder = Path(folder)
    for name in HF_WEIGHT_FILES:
        index = folder / f"{name}.index.json"
        if index.is_file():
            weight_map = read_json_object(index, index.name).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise WeightsError("the shard index has no weight_map", index)
            state: dict[str, Tensor] = {}
            for shard in sorted(set(map(str, weight_map.values()))):
                if Path(shard).name != shard:  # a shard lies beside its index, never elsewhere
                    raise WeightsError(f"the shard index names a file outside the folder ({shard!r})", index)
                state.update(
                    _tensors(read_state_file(folder / shard, what="Hugging Face weights"), folder / shard)
                )
            return state, index
        if (folder / name).is_file():
            return _tensors(
                read_state_file(folder / name, what="Hugging Face weights"), folder / name
            ), folder / name
    raise WeightsError(f"Hugging Face folder has neither {' nor '.join(HF_WEIGHT_FILES)}", folder)


# ------------------------------------------------------------------------------ typed config fields

#: a field read without a default must be in the file
REQUIRED: Any = object()
#: the largest value an integer field may hold by default: a width, depth or count beyond it
#: describes no model that fits in memory (a real config's largest is a few thousand)
MAX_CONFIG_INT = 1 << 20


def _shown(value: Any) -> str:
    """``value`` as the file spells it (JSON), cut to 60 characters."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _int_want(min: int, max: int) -> str:
    base = {0: "a non-negative int", 1: "a positive int"}.get(min, f"an int >= {min}")
    return base if max == MAX_CONFIG_INT else f"{base} up to {max}"


def _number_want(min: float | None, above: float | None, max: float | None, below: float | None) -> str:
    bounds = [f">= {min:g}" if min is not None else "", f"> {above:g}" if above is not None else "",
              f"<= {max:g}" if max is not None else "", f"< {below:g}" if below is not None else ""]  # fmt: skip
    return " and ".join(["a number", *filter(None, bounds)]).replace("number and", "number", 1)


class ConfigFields:
    """Typed reads of the fields of one JSON object of a Hugging Face folder (``config.json``,
    ``preprocessor_config.json``, a nested ``backbone_config``).

    Each read returns the field's value, or ``default`` when the field is absent or ``null``
    (transformers writes ``null`` for an unset option); a field without a default (``REQUIRED``)
    must be there.  Anything else is a :class:`WeightsError` whose ``what`` names the file and the
    field, ``"config.json key 'hidden_size' must be a positive int; got 0"``, and whose ``where`` is
    the file: one line on the command line, before a model is built from the value.

    Args:
        data: the JSON object (a dict).
        path: the file it comes from (messages name it).
        prefix: the dotted path of a nested object (``"backbone_config."``), put before its keys.
    """

    def __init__(self, data: Mapping[str, Any], path: str | os.PathLike, prefix: str = "") -> None:
        self.path = Path(path)
        self.prefix = prefix
        if not isinstance(data, Mapping):
            where = f"key {prefix.rstrip('.')!r}" if prefix else "the file"
            raise WeightsError(
                f"{self.path.name} {where} must be a JSON object; got {_shown(data)}", self.path
            )
        self.data = data

    def name(self, key: str) -> str:
        """The field's dotted name in messages (``backbone_config.out_indices``)."""
        return f"{self.prefix}{key}"

    def fail(self, key: str, want: str) -> NoReturn:
        """Raise the one-line error of a field that is not ``want``."""
        raise WeightsError(
            f"{self.path.name} key {self.name(key)!r} must be {want}; got {_shown(self.data.get(key))}",
            self.path,
        )

    def _value(self, key: str, default: Any, want: str) -> tuple[bool, Any]:
        """``(True, value)`` when the field is set, ``(False, default)`` when absent or null."""
        value = self.data.get(key)
        if value is not None:
            return True, value
        if default is REQUIRED:
            raise WeightsError(f"{self.path.name} has no key {self.name(key)!r} ({want})", self.path)
        return False, default

    def integer(self, key: str, default: Any = REQUIRED, *, min: int = 1, max: int = MAX_CONFIG_INT) -> int:
        """An int in ``min..max`` (a bool or a float such as ``300.0`` is not one)."""
        want = _int_want(min, max)
        found, value = self._value(key, default, want)
        if found and not (_is_int(value) and min <= value <= max):
            self.fail(key, want)
        return value

    def number(
        self,
        key: str,
        default: Any = REQUIRED,
        *,
        min: float | None = None,
        above: float | None = None,
        max: float | None = None,
        below: float | None = None,
    ) -> float:
        """A finite number (an int is one) within the bounds given: ``min`` / ``max`` inclusive,
        ``above`` / ``below`` exclusive."""
        want = _number_want(min, above, max, below)
        found, value = self._value(key, default, want)
        if not found:
            return value
        bounds = ((min, operator.ge), (above, operator.gt), (max, operator.le), (below, operator.lt))
        ok = _is_number(value) and all(bound is None or test(value, bound) for bound, test in bounds)
        if not ok:
            self.fail(key, want)
        return float(value)

    def flag(self, key: str, default: Any = REQUIRED) -> bool:
        """``true`` or ``false`` (not ``1``, not ``"yes"``)."""
        found, value = self._value(key, default, "true or false")
        if found and not isinstance(value, bool):
            self.fail(key, "true or false")
        return value

    def choice(self, key: str, default: Any, choices: Sequence[str]) -> str:
        """One of the strings ``choices``."""
        want = f"one of {', '.join(map(repr, choices))}"
        found, value = self._value(key, default, want)
        if found and not (isinstance(value, str) and value in choices):
            self.fail(key, want)
        return value

    def text(self, key: str, default: Any = REQUIRED) -> str:
        """A string."""
        found, value = self._value(key, default, "a string")
        if found and not isinstance(value, str):
            self.fail(key, "a string")
        return value

    def integers(
        self,
        key: str,
        default: Any = REQUIRED,
        *,
        length: int | None = None,
        min: int = 1,
        max: int = MAX_CONFIG_INT,
    ) -> list[int]:
        """A non-empty list of ints in ``min..max`` (of ``length`` items when given)."""
        items = f"a list of {length} ints" if length is not None else "a non-empty list of ints"
        want = f"{items} in {min}..{max}" if max != MAX_CONFIG_INT else f"{items} >= {min}"
        found, value = self._value(key, default, want)
        if not found:
            return None if value is None else list(value)
        ok = (
            isinstance(value, list)
            and (len(value) == length if length is not None else len(value) > 0)
            and all(_is_int(v) and min <= v <= max for v in value)
        )
        if not ok:
            self.fail(key, want)
        return list(value)

    def pair(self, key: str, default: Any = REQUIRED, *, max: int = MAX_CONFIG_INT) -> tuple[int, int]:
        """A side in pixels: a positive int ``s`` (``(s, s)``) or a list ``[h, w]`` of two."""
        want = "a positive int or a list [height, width] of two" + (
            f", each up to {max}" if max != MAX_CONFIG_INT else ""
        )
        found, value = self._value(key, default, want)
        if not found:
            return value if value is None or isinstance(value, tuple) else (int(value), int(value))
        if _is_int(value):
            value = [value, value]
        if not (
            isinstance(value, list) and len(value) == 2 and all(_is_int(v) and 1 <= v <= max for v in value)
        ):
            self.fail(key, want)
        return value[0], value[1]

    def per_channel(
        self, key: str, channels: int = 3, *, above: float | None = None
    ) -> tuple[float, ...] | None:
        """A normalisation (``image_mean`` / ``image_std``): a number for every channel, as transformers
        reads it, or a list of ``channels`` numbers; ``None`` when absent."""
        want = f"a number or a list of {channels} numbers" + (
            f", each > {above:g}" if above is not None else ""
        )
        found, value = self._value(key, None, want)
        if not found:
            return None
        values = [value] * channels if _is_number(value) else value
        ok = isinstance(values, list) and len(values) == channels and all(_is_number(v) for v in values)
        if not ok or (above is not None and not all(v > above for v in values)):
            self.fail(key, want)
        return tuple(float(v) for v in values)

    def section(self, key: str) -> ConfigFields:
        """The nested object ``key`` (``backbone_config``); empty when absent or null."""
        found, value = self._value(key, {}, "an object")
        if found and not isinstance(value, Mapping):
            self.fail(key, "an object")
        return ConfigFields(value, self.path, f"{self.prefix}{key}.")

    def id2label(self) -> list[str] | None:
        """``names[label]`` of ``id2label`` (keys ``"0"`` .. ``"n-1"``, string values); ``None`` without one."""
        want = 'a non-empty object {"0": name, ...} whose keys are the labels 0..n-1'
        found, value = self._value("id2label", None, want)
        if not found:
            return None
        if not isinstance(value, Mapping) or not value:
            self.fail("id2label", want)
        labels: dict[int, str] = {}
        for k, name in value.items():
            # JSON keys are strings; a transformers config's own dict (to_dict()) has ints
            if not ((isinstance(k, str) and re.fullmatch(r"0|[1-9][0-9]*", k)) or (_is_int(k) and k >= 0)):
                raise WeightsError(f"{self.path.name} key 'id2label' has the key {k!r}, not a label 0..{len(value) - 1}",
                                   self.path)  # fmt: skip
            if not isinstance(name, str):
                raise WeightsError(f"{self.path.name} key 'id2label' names label {k} {_shown(name)}, not a string",
                                   self.path)  # fmt: skip
            labels[int(k)] = name
        if sorted(labels) != list(range(len(labels))):
            missing = sorted(set(range(len(labels))) - set(labels))[:5]
            raise WeightsError(f"{self.path.name} key 'id2label' must number the labels 0..{len(labels) - 1}; "
                               f"it lacks {missing}", self.path)  # fmt: skip
        return [labels[i] for i in range(len(labels))]

    def against(self, key: str, value: int, state: Mapping[str, Tensor], tensor: str, axis: int = 0) -> None:
        """The field ``key`` (read as ``value``) must be the size of ``state[tensor]`` along ``axis``.

        Checked before a model is built from the value (a width the weights do not have would build a
        model of that width first); a tensor the weights lack is left to the load, which lists it.
        """
        t = state.get(tensor)
        if isinstance(t, Tensor) and t.dim() > axis and t.shape[axis] != value:
            raise WeightsError(
                f"{self.path.name} key {self.name(key)!r} is {value}, but the weights' {tensor} has shape "
                f"{tuple(t.shape)}",
                self.path,
            )

    def count_against(self, key: str, value: int, state: Mapping[str, Tensor], pattern: str) -> None:
        """The field ``key`` (a layer count, ``value``) must be the number of indices that ``pattern``'s
        group 1 takes in the weights' keys (``r"encoder\\.layer\\.(\\d+)\\."``); none found: left to the load."""
        matches = [m for k in state if (m := re.match(pattern, k))]
        found = sorted({int(m.group(1)) for m in matches})
        if found and len(found) != value:
            layers = f"{matches[0].string[: matches[0].start(1)]}{found[0]}..{found[-1]}"
            raise WeightsError(
                f"{self.path.name} key {self.name(key)!r} is {value}, but the weights have {len(found)} ({layers})",
                self.path,
            )
