"""The RT-DETR family's one Hugging Face exporter: the shared steps, parametrised by what differs.

An export of RT-DETR, D-FINE, DEIMv2 or RF-DETR does the same steps: unwrap a
``DistributedDataParallel`` / EMA ``module``, refuse a model of another class, refuse what the
format cannot hold *before anything is written*, build ``config.json`` (a folder's own config for
a model read from one, its class names updated; else described from the modules), rename the
state dict through the format's :class:`~peg_core.interop.keymap.KeyMap` (a key without a name is
an error: the folder would miss a weight), add the tensors transformers has and we do not, and
write the folder with its ``preprocessor_config.json``.  :class:`HFExport` holds what differs per
format; each format module's ``export_hf_*`` is one of them (called as
``export_hf_*(model, out_dir, id2label=None, *, size=None) -> Path``), and
:meth:`HFExport.for_classes` is the same export given the run's class list (``export-hf``'s).

:func:`label_fields` / :func:`with_label_names` write ``config.json``'s class names for every
format of the family.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from peg_core.interop.hf_folder import write_hf_folder
from peg_core.interop.keymap import KeyMap

from .hf_processor import PREPROCESSOR_CONFIG

__all__ = ["HFExport", "hf_state_dict", "label_fields", "with_label_names"]

#: ``config.json`` fields an export leaves unset: anchors and AIFI's table follow each input, as here
UNSET_SIZES = ("anchor_image_size", "eval_size")


def label_fields(names: Mapping[int, str] | None, num_classes: int) -> dict[str, dict]:
    """``id2label`` / ``label2id`` of ``num_classes`` labels: ``names[i]``, else ``LABEL_i``."""
    names = names or {}
    id2label = {str(i): names.get(i) or f"LABEL_{i}" for i in range(num_classes)}
    return {"id2label": id2label, "label2id": {name: int(i) for i, name in id2label.items()}}


def with_label_names(config: dict[str, Any], names: Mapping[int, str], num_classes: int) -> dict[str, Any]:
    """``config`` with ``id2label`` / ``label2id`` naming label ``i`` ``names[i]`` (else the config's own name)."""
    if not names:
        return config
    own = config.get("id2label") or {}
    merged = {i: names.get(i) or own.get(str(i)) for i in range(num_classes)}
    return {**config, **label_fields(merged, num_classes)}


def hf_state_dict(model: nn.Module, keys: KeyMap) -> dict[str, Tensor]:
    """``model``'s state dict in the names ``keys`` writes (stacked tensors split).

    A key the map has no name for is a ``ValueError``: the folder would miss a weight.
    """
    state, _, skipped = keys.convert(model.state_dict(), to_hf=True)
    if skipped:
        raise ValueError(f"keys without a Hugging Face name: {sorted(skipped)}")
    return state


@dataclass(frozen=True)
class HFExport:
    """One format's Hugging Face export (module docstring): ``self(model, out_dir, id2label=None, *, size=None)``.

    ``name`` / ``takes``: the export's name and the model it takes, for the ``TypeError``
    (``"export_hf_rtdetr takes an RT-DETR, not a DFINE"``).  ``model_cls``: that model's class
    (``exact``: not its subclasses, which have exports of their own).  ``architecture``:
    ``config.json``'s ``architectures``.  ``describe(model, names)``: the config of a model not read
    from a folder (``names``: label -> class name).  ``keys``: the key map, or ``model -> key map``.
    ``processor(model, size)``: ``preprocessor_config.json`` at ``size`` (the run's ``--val-size``).
    ``refuse(model)``: a ``ValueError`` for what the format cannot hold, before anything is written.
    ``extra(model, config, state)``: the state with the tensors the key map has no source for.
    ``own_config``: whether a model read from a folder goes back with that folder's config.
    ``unset``: config fields written ``None``.
    """

    name: str
    takes: str
    model_cls: type[nn.Module]
    architecture: str
    describe: Callable[[Any, dict[int, str]], dict[str, Any]]
    keys: KeyMap | Callable[[Any], KeyMap]
    processor: Callable[[Any, int | None], dict[str, Any]]
    refuse: Callable[[Any], None] | None = None
    extra: Callable[[Any, dict[str, Any], dict[str, Tensor]], dict[str, Tensor]] | None = None
    exact: bool = False
    own_config: bool = True
    unset: tuple[str, ...] = UNSET_SIZES

    def __call__(
        self,
        model: nn.Module,
        out_dir: str | os.PathLike,
        id2label: Mapping[int, str] | None = None,
        *,
        size: int | None = None,
    ) -> Path:
        """Write ``model`` (class names ``id2label``: label -> name) as a Hugging Face folder; returns ``out_dir``."""
        model = getattr(model, "module", model)
        fits = type(model) is self.model_cls if self.exact else isinstance(model, self.model_cls)
        if not fits:
            raise TypeError(f"{self.name} takes {self.takes}, not a {type(model).__name__}")
        if self.refuse is not None:
            self.refuse(model)  # before anything is written
        config = self.config(model, dict(id2label or {}))
        state = hf_state_dict(model, self.keys if isinstance(self.keys, KeyMap) else self.keys(model))
        if self.extra is not None:
            state = self.extra(model, config, state)
        return write_hf_folder(out_dir, config, state, {PREPROCESSOR_CONFIG: self.processor(model, size)})

    def config(self, model: nn.Module, names: dict[int, str]) -> dict[str, Any]:
        """The ``config.json`` written for ``model``: its folder's own (names updated) or described."""
        cfg = getattr(model, "build_config", None) or {}
        if self.own_config and isinstance(cfg.get("hf_config"), dict):
            config = with_label_names(cfg["hf_config"], names, model.num_classes)
        else:
            config = self.describe(model, names)
        return {**config, **dict.fromkeys(self.unset), "architectures": [self.architecture]}

    def for_classes(
        self, model: nn.Module, out_dir: str | os.PathLike, classes: Sequence[str], *, size: int | None = None
    ) -> Path:
        """The export given the run's class list (``classes[i]``: label ``i``'s name; ``""``: an unused id)."""
        return self(model, out_dir, {i: name for i, name in enumerate(classes) if name}, size=size)
