"""A start model's classes carried over to another label set, by name: one matcher, one row copier.

Fine-tuning a detector or a classifier onto your own labels changes every class-dependent
parameter (a classifier's rows, a denoising embedding's rows).  What the start knows about a
class your data shares with it (same name, or a synonym you map) is worth keeping; the rest
starts fresh.  Two pure steps do it for every family:

* :func:`match_classes` pairs each new label with the start label of the same name
  (case- and whitespace-insensitive; ``class_map`` maps synonyms) -> a :class:`ClassTransfer`;
* :func:`transfer_class_rows` builds the new state dict (:func:`carry_classes` loads it into the
  rebuilt model): every tensor from the start, except the
  class-dependent ones (:class:`ClassParam`, declared by each model family), which take the
  fresh model's tensor (its family's initialisation: the focal prior bias, ...) with the kept
  classes' rows copied from the start.

Torch only; errors are ``ValueError`` (:class:`~peg_core.interop.io.WeightsError` where a file
is named), never the command line's ``UserError``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from .io import LoadReport

__all__ = [
    "ClassParam",
    "ClassTransfer",
    "carry_classes",
    "class_key",
    "match_classes",
    "read_class_map",
    "transfer_class_rows",
]


def class_key(name: Any) -> str:
    """The form names are compared in: case-folded, ``_`` read as a space, whitespace runs one space.

    ``"Traffic  Light"``, ``"traffic_light"`` and ``" traffic light "`` are one class (Kinetics' CSVs
    say ``air drumming`` where peg_video's class lists and some label files say ``air_drumming``).
    """
    return " ".join(str(name).replace("_", " ").split()).casefold()


@dataclass(frozen=True)
class ClassParam:
    """One class-dependent tensor of a model: ``key`` has one row per class along ``dim``.

    ``extra``: rows after the classes that stand for no class (DETR's "no object" logit, the
    denoising embedding's padding row): copied from the start's last ``extra`` rows as they are.
    """

    key: str
    dim: int = 0
    extra: int = 0


@dataclass(frozen=True)
class ClassTransfer:
    """Which start class each new label takes its rows from.

    Attributes:
        names: ``names[label]`` of the new label set (``""``: a label no category uses).
        start_names: ``start_names[label]`` of the start's classes (``""`` / unknown: never matched).
        source: ``source[label]``: the start label whose rows the new label keeps, or ``None`` (fresh).
        mapped: ``{new name: start name}`` pairs that came from a class map (synonyms), not equal names.
    """

    names: tuple[str, ...]
    start_names: tuple[str, ...]
    source: tuple[int | None, ...]
    mapped: Mapping[str, str] = field(default_factory=dict)

    @property
    def kept(self) -> list[tuple[int, int]]:
        """``(new label, start label)`` of the classes carried over, by new label."""
        return [(i, s) for i, s in enumerate(self.source) if s is not None]

    @property
    def fresh(self) -> list[int]:
        """The new labels that start fresh (those with a name: a label no category uses is neither)."""
        return [i for i, s in enumerate(self.source) if s is None and self.names[i]]

    @property
    def identity(self) -> bool:
        """Whether nothing changes: same class count and every label keeps its own start row."""
        return len(self.names) == len(self.start_names) and all(
            s == i for i, s in enumerate(self.source) if self.names[i]
        )

    def line(self, limit: int = 8) -> str:
        """``kept 2 of 3 classes by name (apple, pear <- Pear); 1 starts fresh (cherry)``."""

        def listed(items: list[str]) -> str:
            more = f", ... {len(items) - limit} more" if len(items) > limit else ""
            return ", ".join(items[:limit]) + more

        kept = []
        for i, s in self.kept:
            new, old = self.names[i], self.start_names[s]
            kept.append(new if class_key(new) == class_key(old) else f"{new} <- {old}")
        total = len(self.kept) + len(self.fresh)
        text = f"kept {len(self.kept)} of {total} classes by name"
        text += f" ({listed(kept)})" if kept else ""
        fresh = [self.names[i] for i in self.fresh]
        text += f"; {len(fresh)} start fresh" + (f" ({listed(fresh)})" if fresh else "")
        return text

    def to_json(self) -> dict[str, Any]:
        """What a run records: ``{"kept": [{"label", "name", "start_label", "start_name"}], "fresh": [...]}``."""
        return {
            "kept": [
                {"label": i, "name": self.names[i], "start_label": s, "start_name": self.start_names[s]}
                for i, s in self.kept
            ],
            "fresh": [{"label": i, "name": self.names[i]} for i in self.fresh],
            "class_map": dict(self.mapped),
        }


def match_classes(
    names: Sequence[str], start_names: Sequence[str], class_map: Mapping[str, str] | None = None
) -> ClassTransfer:
    """Pair each of ``names`` (new labels) with the start label of the same name.

    Names are compared by :func:`class_key` (case, spacing and underscores aside).  ``class_map`` (``{new name: start name}``) sends a
    new name to another start name (a synonym: ``motorbike -> motorcycle``); it wins over an
    equal name.  An empty name is never matched; when the start names a class twice the first
    label wins.  A ``class_map`` entry whose new name is not among ``names`` or whose start name
    is not among ``start_names`` is a ``ValueError`` naming it (a typo would silently start fresh).
    """
    by_name: dict[str, int] = {}
    for label, name in enumerate(start_names):
        if class_key(name):
            by_name.setdefault(class_key(name), label)
    wanted = {class_key(k): class_key(v) for k, v in (class_map or {}).items()}
    new_keys = {class_key(n) for n in names if class_key(n)}
    for new, old in wanted.items():
        if new not in new_keys:
            raise ValueError(f"class map entry {new!r}: no category of the data has this name")
        if old not in by_name:
            raise ValueError(f"class map entry {new!r} -> {old!r}: the start has no class of this name")
    source: list[int | None] = []
    mapped: dict[str, str] = {}
    for name in names:
        key = class_key(name)
        target = wanted.get(key, key)
        source.append(by_name.get(target) if key else None)
        if key in wanted and source[-1] is not None:
            mapped[str(name)] = str(start_names[source[-1]])
    return ClassTransfer(tuple(map(str, names)), tuple(map(str, start_names)), tuple(source), mapped)


def read_class_map(doc: Any, where: Any = "class map") -> dict[str, str]:
    """A ``--class-map`` json's object ``{"data name": "start name"}`` checked; ``ValueError`` naming ``where``."""
    if not isinstance(doc, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in doc.items()
    ):
        raise ValueError(f'{where}: a class map is a JSON object of names, {{"data name": "start name"}}')
    seen: dict[str, str] = {}
    for k in doc:
        if class_key(k) in seen:
            raise ValueError(f"{where}: {k!r} and {seen[class_key(k)]!r} are the same name")
        seen[class_key(k)] = k
    return dict(doc)


def transfer_class_rows(
    fresh: Mapping[str, Tensor],
    start: Mapping[str, Tensor],
    params: Sequence[ClassParam],
    transfer: ClassTransfer,
) -> tuple[dict[str, Tensor], dict[str, str]]:
    """The new model's state dict: ``start``'s tensors, the class-dependent ones rebuilt for ``transfer``.

    Args:
        fresh: the new model's state dict (built for ``len(transfer.names)`` classes): its
            class-dependent tensors give the fresh rows their family's initialisation.
        start: the start model's state dict (``len(transfer.start_names)`` classes).
        params: the class-dependent tensors (keys present in both).
        transfer: which start row each new class row takes (:func:`match_classes`).

    Returns ``(state, converted)``: every key of ``fresh``; ``converted[key]`` says what a
    class-dependent tensor kept (nothing when ``transfer`` is the identity: they are copied).  A key missing from ``start`` keeps ``fresh``'s tensor; a tensor
    whose shape beyond the class axis differs is a ``ValueError`` naming the key and both shapes.
    """
    n_new, n_old = len(transfer.names), len(transfer.start_names)
    if transfer.identity:  # the same classes in the same rows: every tensor is the start's as it is
        return {k: start.get(k, v) for k, v in fresh.items()}, {}
    by_key = {p.key: p for p in params}
    state = {k: start.get(k, v) for k, v in fresh.items()}
    converted: dict[str, str] = {}
    for key, p in by_key.items():
        if key not in fresh or key not in start:
            continue
        new, old = fresh[key], start[key]
        rows_new, rows_old = n_new + p.extra, n_old + p.extra
        if new.shape[p.dim] != rows_new or old.shape[p.dim] != rows_old:
            raise ValueError(
                f"{key}: {new.shape[p.dim]} / {old.shape[p.dim]} rows along dim {p.dim}, expected "
                f"{rows_new} (new) / {rows_old} (start) for {n_new} / {n_old} classes + {p.extra}"
            )
        if new.shape[: p.dim] + new.shape[p.dim + 1 :] != old.shape[: p.dim] + old.shape[p.dim + 1 :]:
            raise ValueError(f"{key}: shape {tuple(old.shape)} of the start does not fit {tuple(new.shape)}")
        out = new.detach().clone()
        with torch.no_grad():
            for i, s in transfer.kept:
                out.select(p.dim, i).copy_(old.select(p.dim, s))
            for r in range(1, p.extra + 1):
                out.select(p.dim, rows_new - r).copy_(old.select(p.dim, rows_old - r))
        state[key] = out
        converted[key] = f"{len(transfer.kept)} of {n_new} class rows from the start" + (
            f" (+{p.extra} non-class)" if p.extra else ""
        )
    return state, converted


def carry_classes(
    start: nn.Module,
    fresh: nn.Module,
    params: Sequence[ClassParam],
    transfer: ClassTransfer,
    source: str = "",
) -> LoadReport:
    """Fill ``fresh`` (built for ``transfer.names``) with ``start``'s weights, class rows per ``transfer``.

    :func:`transfer_class_rows` of the two models' state dicts, loaded into ``fresh`` (which takes
    ``start``'s train / eval mode).  Returns the :class:`LoadReport`: ``converted`` names the
    class-dependent tensors, ``classes`` is ``transfer``.
    """
    state, converted = transfer_class_rows(fresh.state_dict(), start.state_dict(), params, transfer)
    fresh.load_state_dict(state)
    fresh.train(start.training)
    copied = [k for k in state if k not in converted]
    return LoadReport(source, copied, converted, classes=transfer)
