"""Which class label stands for which COCO category: ``--labels ids`` or ``--labels contiguous``.

* ``ids`` (DETR's convention, the default): the label *is* the category id, so the classifier has
  ``max(id) + 1`` outputs (91 for COCO, with unused ids in the gaps).
* ``contiguous`` (RT-DETR's ``remap_mscoco_category``, Hugging Face's 80-label RT-DETR folders):
  label ``k`` is the ``k``-th category of the annotation file sorted by id, so COCO's ids
  ``1, 2, ..., 90`` (80 of them) become labels ``0..79``.

A :class:`LabelMap` (re-exported by :mod:`peg_detr.data`; it needs torch only, so the model and
weights modules read it without the COCO tools) turns annotations into labels (the dataset) and
predicted labels back into category ids (COCO results, ``predict``); a training checkpoint records
it under ``meta["labels"]`` (:meth:`LabelMap.to_json`), so eval, predict and export need no
annotation file.
:func:`match_label_names` says which mode a Hugging Face folder's ``id2label`` was trained with.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

import torch
from torch import Tensor

__all__ = ["LABEL_MODES", "LabelMap", "LabelMode", "match_label_names"]

LabelMode = Literal["ids", "contiguous"]
#: ``--labels`` values; the first is the default of DETR runs
LABEL_MODES: tuple[str, ...] = ("ids", "contiguous")


@dataclass(frozen=True)
class LabelMap:
    """The label <-> category correspondence of one run.

    Attributes:
        mode: ``"ids"`` (label = category id) or ``"contiguous"`` (label k = k-th category by id).
        categories: ``(category id, name)`` of the data set's categories, sorted by id.
    """

    mode: LabelMode
    categories: tuple[tuple[int, str], ...]

    def __post_init__(self) -> None:
        if self.mode not in LABEL_MODES:
            raise ValueError(f"unknown label mode {self.mode!r} (expected one of {LABEL_MODES})")
        ids = [c for c, _ in self.categories]
        if ids != sorted(set(ids)):
            raise ValueError(f"category ids must be unique and sorted; got {ids[:10]}")

    @classmethod
    def from_categories(cls, categories: Sequence[Mapping[str, Any]], mode: str = "ids") -> LabelMap:
        """The map of a COCO ``categories`` list (``{"id", "name"}`` dicts, any order)."""
        pairs = sorted((int(c["id"]), str(c.get("name", c["id"]))) for c in categories)
        return cls(mode, tuple(pairs))  # type: ignore[arg-type]

    @property
    def num_labels(self) -> int:
        """The smallest classifier that holds every category: ``len`` (contiguous) or ``max id + 1`` (ids)."""
        if not self.categories:
            return 0
        return len(self.categories) if self.mode == "contiguous" else self.categories[-1][0] + 1

    def category_id(self, label: int) -> int | None:
        """The category id of ``label``; ``None`` for a contiguous label past the last category."""
        if self.mode == "ids":
            return int(label)
        return self.categories[label][0] if 0 <= label < len(self.categories) else None

    def name(self, label: int) -> str:
        """The category name of ``label`` (``""`` when no category has it: a gap of ``ids``)."""
        return self._names_by_label.get(int(label), "")

    @cached_property
    def _names_by_label(self) -> dict[int, str]:
        if self.mode == "ids":
            return dict(self.categories)
        return dict(enumerate(n for _, n in self.categories))

    def named(self, num_labels: int) -> Tensor:
        """``(num_labels,)`` bool: whether label ``i`` stands for a category (False: an id gap, a label past them).

        Post-processing masks the others before its top-k, so a detection always names a category.
        """
        named = torch.zeros(num_labels, dtype=torch.bool)
        if self.mode == "ids":
            ids = [c for c, _ in self.categories if c < num_labels]
            named[ids] = True
        else:
            named[: min(len(self.categories), num_labels)] = True
        return named

    def names(self, num_labels: int) -> list[str]:
        """``names[label]`` for every label of a ``num_labels``-way classifier (``""`` for no category)."""
        return [self.name(i) for i in range(num_labels)]

    def labels_of(self, category_ids: Tensor) -> Tensor:
        """Annotation category ids ``(n,)`` int64 -> labels ``(n,)``; ``contiguous``: a ``KeyError`` for an unlisted id."""
        if self.mode == "ids":
            return category_ids
        index = self._label_by_id
        unknown = [int(c) for c in category_ids.tolist() if int(c) not in index]
        if unknown:
            raise KeyError(f"category ids {unknown[:5]} are not among the mapped categories")
        return torch.tensor([index[int(c)] for c in category_ids.tolist()], dtype=torch.int64)

    @cached_property
    def _label_by_id(self) -> dict[int, int]:
        return {c: k for k, (c, _) in enumerate(self.categories)}

    def category_ids_of(self, labels: Tensor) -> Tensor:
        """Predicted labels ``(n,)`` -> category ids ``(n,)`` int64; ``-1`` where a label has no category."""
        if self.mode == "ids":
            return labels.to(torch.int64)
        table = torch.tensor([c for c, _ in self.categories], dtype=torch.int64)
        labels = labels.to(torch.int64).cpu()
        valid = (labels >= 0) & (labels < len(table))
        out = torch.full_like(labels, -1)
        out[valid] = table[labels[valid]]
        return out

    def check_fits(self, num_classes: int) -> list[int]:
        """The category ids whose label does not fit a ``num_classes``-way classifier (empty when all do)."""
        if self.mode == "ids":
            return [c for c, _ in self.categories if c >= num_classes]
        return [c for k, (c, _) in enumerate(self.categories) if k >= num_classes]

    def to_json(self) -> dict[str, Any]:
        """``{"mode", "labels": [{"label", "id", "name"}, ...]}``, as a checkpoint's ``meta["labels"]``."""
        if self.mode == "ids":
            rows = [{"label": c, "id": c, "name": n} for c, n in self.categories]
        else:
            rows = [{"label": k, "id": c, "name": n} for k, (c, n) in enumerate(self.categories)]
        return {"mode": self.mode, "labels": rows}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> LabelMap:
        """The inverse of :meth:`to_json`; a ``ValueError`` when ``doc`` is not one."""
        rows = doc.get("labels") if isinstance(doc, Mapping) else None
        if not isinstance(rows, list) or not all(isinstance(r, Mapping) and "id" in r for r in rows):
            raise ValueError(
                f"not a label map (want {{'mode', 'labels': [{{'label', 'id', 'name'}}]}}): {doc!r:.80}"
            )
        return cls.from_categories(rows, str(doc.get("mode", "ids")))

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any]) -> LabelMap:
        """A checkpoint's map: ``meta["labels"]``, else (checkpoints written before it) ``ids`` of ``meta["categories"]``."""
        if isinstance(meta.get("labels"), Mapping):
            return cls.from_json(meta["labels"])
        cats = [c for c in meta.get("categories") or [] if isinstance(c, Mapping) and "id" in c]
        return cls.from_categories(cats, "ids")


def match_label_names(names: Sequence[str], categories: Sequence[Mapping[str, Any]]) -> LabelMode | None:
    """The label mode under which ``names[label]`` (a Hugging Face ``id2label``) are the data's category names.

    ``"contiguous"`` when there is one name per category and the ``k``-th is the name of the
    ``k``-th category by id (80 for an RT-DETR COCO folder); ``"ids"`` when the name at every
    category id is that category's (DETR's 91 with ``N/A`` gaps); ``None`` when neither holds.
    Names are compared case-insensitively, without surrounding spaces.
    """
    folder = [str(n).strip().lower() for n in names]
    data = sorted((int(c["id"]), str(c.get("name", "")).strip().lower()) for c in categories)
    if not data:
        return None
    if folder == [n for _, n in data]:
        return "contiguous"
    if all(0 <= c < len(folder) and folder[c] == n for c, n in data):
        return "ids"
    return None
