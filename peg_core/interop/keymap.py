"""Declarative two-way key maps: our state-dict keys <-> another format's, from one table of rows.

A format's reader and writer describe its keys once, as rows, and a :class:`KeyMap` reads the
rows both ways (in the spirit of transformers' ``WeightRenaming``).  The "format" side is called
``hf`` (every user so far maps to Hugging Face / transformers names); nothing here knows a model.

Rows:

* :class:`Rename` ``(hf, ours)``: one key, or every key under a prefix.  ``hf`` may be several
  names of one tensor (transformers' file and in-memory names, a tied copy of a head): any of
  them is read, the first is written.
* :class:`Stack` ``(hf, ours)``: several tensors of one side are one tensor of the other,
  concatenated on dim 0 (a fused ``qkv`` <-> separate ``q`` / ``k`` / ``v``); ``optional`` parts
  may be absent when reading (zeros of a present part's shape: a key bias a model does not have).
* :class:`Skip` ``(hf, why)``: a key of the format that has no counterpart here.
* :class:`OursOnly` ``(ours, why)``: a key of ours that has no counterpart in the format (a PEG):
  a loader adds it at its initialisation instead of calling it missing.
* :class:`Nest` ``(hf, ours, inner)``: the keys under a prefix are mapped by another map
  (a :class:`KeyMap` or :class:`KeyFunctions`), for a part with a map of its own (a backbone).

:func:`block_rows` writes the :class:`Rename` rows of a block the format names several ways
(transformers' ``save_pretrained`` files and its modules) from its prefixes and a list of names.

Patterns: a pattern ending in ``.`` or ``_`` is a prefix (the rest of the key is kept); any
other pattern is one whole key.  ``{i}``-style fields match a number and carry it across (every
name of a row has the same fields).  The first row that matches a key wins, in each direction,
so a specific row goes before the prefix row that would also match.

:meth:`KeyMap.to_ours` / :meth:`KeyMap.to_hf` map one key (``None``: skipped, ours only, part
of a stacked tensor, or no row); :meth:`KeyMap.convert` maps a whole state dict, stacking and
splitting, and says what it made and what it left out (:class:`Converted`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch
from torch import Tensor

__all__ = [
    "NO_ROW",
    "Converted",
    "Functions",
    "KeyFunctions",
    "KeyMap",
    "Nest",
    "OursOnly",
    "Rename",
    "Rule",
    "Skip",
    "Stack",
    "block_rows",
]

#: :meth:`KeyMap.convert`'s reason for a key no row matches (a caller may pass its own)
NO_ROW = "no key of the other side (not in the key map)"


@dataclass(frozen=True)
class Rename:
    """The format's key (or prefix) ``hf`` is our ``ours``; several ``hf`` names: any is read, the first written."""

    hf: str | tuple[str, ...]
    ours: str

    @property
    def names(self) -> tuple[str, ...]:
        """The format's names, the one written first."""
        return (self.hf,) if isinstance(self.hf, str) else self.hf


@dataclass(frozen=True)
class Stack:
    """Tensors of one side concatenated on dim 0 are one tensor of the other (one side has one pattern).

    ``optional``: the indices of parts that may be absent when reading; they are zeros shaped like a
    present part (equal chunks).
    """

    hf: tuple[str, ...]
    ours: tuple[str, ...]
    optional: tuple[int, ...] = ()


@dataclass(frozen=True)
class Skip:
    """A key (or prefix) of the format that has no counterpart here, with the reason."""

    hf: str
    why: str


@dataclass(frozen=True)
class OursOnly:
    """A key (or prefix) of ours that has no counterpart in the format, with the reason."""

    ours: str
    why: str


class KeyFunctions(Protocol):
    """What :class:`Nest` needs of an inner map: one key each way (``None``: no counterpart)."""

    def to_ours(self, key: str) -> str | None: ...

    def to_hf(self, key: str) -> str | None: ...


@dataclass(frozen=True)
class Functions:
    """Two functions as a :class:`KeyFunctions` (a part whose map is code, not rows)."""

    to_ours: Callable[[str], str | None]
    to_hf: Callable[[str], str | None]


@dataclass(frozen=True)
class Nest:
    """The keys under the prefix ``hf`` are ours under ``ours``, their rest mapped by ``inner``."""

    hf: str
    ours: str
    inner: KeyFunctions


Rule = Rename | Stack | Skip | OursOnly | Nest


def block_rows(
    hf: tuple[str, ...], ours: str, names: Iterable[tuple[str, ...]], *, write: int = 0
) -> tuple[Rename, ...]:
    """:class:`Rename` rows of one block the format names ``len(hf)`` ways.

    ``hf``: the block's prefixes in each naming (``{i}`` fields allowed), ``ours``: ours; each row
    of ``names`` is ``(*its name below each of hf, ours below ours)`` (``""``: every other key of the
    block, kept as it is: put it last).  Every naming is read; the one at index ``write`` is written.
    """
    order = [write, *(k for k in range(len(hf)) if k != write)]
    return tuple(Rename(tuple(dict.fromkeys(hf[k] + row[k] for k in order)), ours + row[-1]) for row in names)


class Converted(NamedTuple):
    """A state dict mapped by :meth:`KeyMap.convert`."""

    state: dict[str, Tensor]
    #: each new key -> what it was made of: its source key, or how it was stacked / split
    made: dict[str, str]
    #: each source key left out -> why
    skipped: dict[str, str]


def _compile(pattern: str) -> re.Pattern[str]:
    """``"a.{i}.b."`` -> ``^a\\.(?P<i>\\d+)\\.b\\.(?P<_rest>.+)$`` (a prefix) or ``...$`` (a whole key)."""
    parts = re.split(r"\{(\w+)\}", pattern)
    text = "".join(re.escape(p) if k % 2 == 0 else f"(?P<{p}>\\d+)" for k, p in enumerate(parts))
    return re.compile(f"^{text}(?P<_rest>.+)$" if pattern.endswith((".", "_")) else f"^{text}$")


def _fill(pattern: str, fields: Mapping[str, str]) -> str:
    return pattern.format(**{k: v for k, v in fields.items() if k != "_rest"}) + fields.get("_rest", "")


@dataclass(frozen=True)
class _Side:
    """One row seen from one direction: the patterns it reads and the names it writes."""

    rule: Rule
    names: tuple[str, ...]
    sources: tuple[re.Pattern[str], ...]
    targets: tuple[str, ...]


def _sides(rule: Rule, to_hf: bool) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(source patterns, target patterns)`` of ``rule`` in one direction."""
    if isinstance(rule, Rename):
        return ((rule.ours,), rule.names[:1]) if to_hf else (rule.names, (rule.ours,))
    if isinstance(rule, Stack):
        return (rule.ours, rule.hf) if to_hf else (rule.hf, rule.ours)
    if isinstance(rule, Nest):
        return ((rule.ours,), (rule.hf,)) if to_hf else ((rule.hf,), (rule.ours,))
    if isinstance(rule, Skip):
        return ((), ()) if to_hf else ((rule.hf,), ())
    return ((rule.ours,), ()) if to_hf else ((), ())  # OursOnly


class KeyMap:
    """A table of rows (module docstring), compiled once, read either way."""

    def __init__(self, rows: Iterable[Rule]) -> None:
        self.rows: tuple[Rule, ...] = tuple(rows)
        for rule in self.rows:
            fields = [set(re.findall(r"\{(\w+)\}", p)) for p in sum(_sides(rule, False), ())]
            if any(f != fields[0] for f in fields):
                raise ValueError(f"the names of a row must have the same {{fields}}: {rule}")
        self._sides = {
            to_hf: tuple(
                _Side(rule, src, tuple(_compile(p) for p in src), dst)
                for rule in self.rows
                for src, dst in (_sides(rule, to_hf),)
                if src
            )
            for to_hf in (False, True)
        }

    def __add__(self, other: KeyMap) -> KeyMap:
        """This map's rows, then ``other``'s (which match only keys this map's rows leave)."""
        return KeyMap(self.rows + other.rows)

    def _match(self, key: str, to_hf: bool) -> tuple[_Side, int, dict[str, str]] | None:
        """The first row matching ``key``: ``(row, which of its source patterns, fields)``."""
        for side in self._sides[to_hf]:
            for part, pattern in enumerate(side.sources):
                m = pattern.match(key)
                if m:
                    return side, part, m.groupdict()
        return None

    def _one(self, key: str, to_hf: bool) -> str | None:
        hit = self._match(key, to_hf)
        return None if hit is None else self._target(hit[0], hit[2], to_hf)

    @staticmethod
    def _target(side: _Side, fields: dict[str, str], to_hf: bool) -> str | None:
        """The one key a matched :class:`Rename` / :class:`Nest` row gives; None for the other rows."""
        rule = side.rule
        if isinstance(rule, Nest):
            inner = rule.inner.to_hf if to_hf else rule.inner.to_ours
            rest = inner(fields["_rest"])
            return None if rest is None else side.targets[0] + rest
        if isinstance(rule, Rename):
            return _fill(side.targets[0], fields)
        return None  # Skip, OursOnly, or one part of a stacked tensor

    def to_ours(self, key: str) -> str | None:
        """Our key of the format's ``key``; None when it is skipped, stacked, or has no row."""
        return self._one(key, to_hf=False)

    def to_hf(self, key: str) -> str | None:
        """The format's key of our ``key`` (the first name of a row); None when it has none."""
        return self._one(key, to_hf=True)

    def ours_only(self, key: str) -> str | None:
        """Why our ``key`` has no counterpart in the format (its :class:`OursOnly` row); None otherwise."""
        hit = self._match(key, to_hf=True)
        return hit[0].rule.why if hit is not None and isinstance(hit[0].rule, OursOnly) else None

    def convert(self, state: Mapping[str, Tensor], *, to_hf: bool, unmapped: str = NO_ROW) -> Converted:
        """Map a whole state dict one way: renames, stacks (concatenated) and splits (equal chunks).

        A source key that gives a key already made (a second name of one tensor: transformers'
        tied heads) is left out as a copy.  ``unmapped`` is the reason given for keys no row matches.
        """
        out: dict[str, Tensor] = {}
        made: dict[str, str] = {}
        skipped: dict[str, str] = {}
        rank: dict[str, int] = {}  # the alias a new key was read from: the first name of a row wins
        pending: dict[tuple[int, tuple[tuple[str, str], ...]], dict[int, Tensor]] = {}
        sides = self._sides[to_hf]
        for key, value in state.items():
            hit = self._match(key, to_hf)
            if hit is None:
                skipped[key] = unmapped
                continue
            side, part, fields = hit
            rule = side.rule
            if isinstance(rule, (Skip, OursOnly)):
                skipped[key] = rule.why
            elif isinstance(rule, Stack) and len(side.sources) > 1:  # one of several parts
                pending.setdefault((sides.index(side), tuple(sorted(fields.items()))), {})[part] = value
            elif isinstance(rule, Stack):  # one tensor -> equal chunks
                for name, chunk in zip(side.targets, value.chunk(len(side.targets), dim=0)):
                    new = _fill(name, fields)
                    out[new], made[new] = chunk.clone(), f"chunk of {key}"
            else:
                new = self._target(side, fields, to_hf)
                if new is None:
                    skipped[key] = unmapped
                elif new in out and rank[new] <= part:
                    skipped[key] = f"another name of {made[new]} (one tensor; read once)"
                else:
                    if new in out:
                        skipped[made[new]] = f"another name of {key} (one tensor; read once)"
                    out[new], made[new], rank[new] = value, key, part
        for (index, items), parts in pending.items():
            self._stack(sides[index], dict(items), parts, out, made, skipped)
        return Converted(out, made, skipped)

    @staticmethod
    def _stack(
        side: _Side,
        fields: dict[str, str],
        parts: dict[int, Tensor],
        out: dict[str, Tensor],
        made: dict[str, str],
        skipped: dict[str, str],
    ) -> None:
        """Concatenate the parts of one stacked tensor (zeros for absent optional parts) into ``out``."""
        rule = side.rule
        assert isinstance(rule, Stack)
        count = len(side.sources)
        absent = [p for p in range(count) if p not in parts]
        if any(p not in rule.optional for p in absent):
            for p in parts:
                skipped[_fill(side.names[p], fields)] = "its other stacked parts are missing"
            return
        like = next(iter(parts.values()))
        tensors = [parts[p] if p in parts else torch.zeros_like(like) for p in range(count)]
        new = _fill(side.targets[0], fields)
        out[new] = torch.cat(tensors, dim=0)
        made[new] = f"{count} tensors stacked on dim 0" + (
            f" ({len(absent)} absent: zeros)" if absent else ""
        )
