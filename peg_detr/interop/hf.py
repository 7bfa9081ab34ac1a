"""A local Hugging Face detector folder -> the peg_detr model it describes: one :func:`from_hf` for both.

``config.json``'s ``model_type`` picks the reader: ``detr`` (``DetrForObjectDetection``,
:mod:`.hf_detr`: built by :func:`~peg_detr.models.build_detr`, loaded by
:func:`~peg_detr.interop.official.load_official_checkpoint`) or ``rt_detr``
(``RTDetrForObjectDetection``, :func:`.hf_rtdetr.rtdetr_from_hf`) or ``d_fine``
(``DFineForObjectDetection``, :func:`.hf_dfine.dfine_from_hf`) or ``deimv2`` or ``rf_detr``
(``RfDetrForObjectDetection``, :func:`.hf_rfdetr.rfdetr_from_hf`).  A new detector format adds
its module here and one entry to :data:`FROM_HF` (which also tells :mod:`peg_detr.archs` which
``--arch`` each ``model_type`` starts).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from peg_core.interop.classes import carry_classes, match_classes
from peg_core.interop.hf_folder import read_hf_config
from peg_core.interop.io import LoadReport
from peg_core.interop.resolve import resolve_weights

from ..models import build_detr
from .hf_deimv2 import deimv2_from_hf, deimv2_from_hf_config
from .hf_detr import detr_build_options, hf_label_names, read_hf_state
from .hf_dfine import dfine_from_hf, dfine_from_hf_config
from .hf_rfdetr import rfdetr_from_hf, rfdetr_from_hf_config
from .hf_rtdetr import config_for_classes, rtdetr_from_hf, rtdetr_from_hf_config
from .official import load_official_checkpoint

__all__ = ["FROM_HF", "SUPPORTED_MODEL_TYPES", "HFFormat", "detr_from_hf", "from_hf"]


def detr_from_hf(folder: str | os.PathLike, pos_enc: str = "sine") -> tuple[nn.Module, LoadReport]:
    """The DETR a Hugging Face ``detr`` folder describes, with its weights: ``(model in eval mode, report)``.

    ``pos_enc``: the encoder's encoding (``sine`` is transformers'); any other DETR encoding
    starts from the same weights (a PEG at zero, listed under ``report.converted``).
    """
    path = Path(folder)
    read_hf_state(path)  # every field, and the sizes against the weights, before the model is built
    options = detr_build_options(read_hf_config(path), path / "config.json")
    model, _, _ = build_detr(pos_enc=pos_enc, **options)
    report = load_official_checkpoint(model, path)
    return model.eval(), report


@dataclass(frozen=True)
class HFFormat:
    """What peg_detr makes of a Hugging Face folder of one ``config.json`` ``model_type``.

    Attributes:
        arch: the ``--arch`` whose model the folder becomes (:data:`peg_detr.archs.ARCHS` reads its
            formats from here: ``Arch.hf_model_types``, ``Arch.from_hf_config``).
        read: ``(folder, pos_enc) -> (model, report)``; its ``pos_enc`` default is the folder's own
            encoding (DETR ``sine``, the RT-DETR family ``sincos``, RF-DETR ``learned``).
        from_config: ``(config.json dict, pos_enc, **encoder options) -> model`` with random weights,
            for a folder's model rebuilt from its config (another label set, a resumed ``--init
            FOLDER`` run); None: the arch's builder rebuilds it from the model's ``build_config`` (DETR).
    """

    arch: str
    read: Callable[..., tuple[nn.Module, LoadReport]]
    from_config: Callable[..., nn.Module] | None = None


#: ``config.json`` ``model_type`` -> its :class:`HFFormat`: the one list of the folders peg_detr reads
FROM_HF: dict[str, HFFormat] = {
    "detr": HFFormat("detr", detr_from_hf),
    "rt_detr": HFFormat("rtdetr", rtdetr_from_hf, rtdetr_from_hf_config),
    "d_fine": HFFormat("dfine", dfine_from_hf, dfine_from_hf_config),
    "deimv2": HFFormat("deimv2", deimv2_from_hf, deimv2_from_hf_config),
    "rf_detr": HFFormat("rfdetr", rfdetr_from_hf, rfdetr_from_hf_config),
}
SUPPORTED_MODEL_TYPES = tuple(FROM_HF)


def from_hf(
    folder: str | os.PathLike,
    pos_enc: str | None = None,
    classes: Sequence[str] | None = None,
    class_map: Mapping[str, str] | None = None,
) -> tuple[nn.Module, LoadReport]:
    """Build the detector a Hugging Face folder describes and load its weights: ``(model, report)``.

    Args:
        folder: a ``save_pretrained`` folder: ``config.json`` + ``model.safetensors`` or
            ``pytorch_model.bin`` (read with ``weights_only=True``), or a Hugging Face hub id
            (``"PekingU/rtdetr_r50vd"``, ``"facebook/detr-resnet-50@main"``) fetched once into the hub
            cache (:func:`peg_core.interop.resolve_weights`; ``HF_HUB_OFFLINE=1``: the cache only).
        pos_enc: the encoder's position encoding; default the folder's (RT-DETR ``sincos``, DETR
            ``sine``, D-FINE ``sincos``, RF-DETR its ViT's table ``learned``; ``peg`` replaces the
            table with a zero PEG after block 0, which computes what ``none`` computes).  For RT-DETR and D-FINE any AIFI encoding (``peg``:
            zero-initialised, listed under ``report.converted``); for DETR any of :data:`peg_detr.models.DETR_ENCODINGS`.
        classes: your label set, ``classes[label]`` (``""``: a label no category uses): the model is
            rebuilt for it, each class whose name is one of the folder's ``id2label`` (any case,
            spacing or ``_``; ``class_map`` ``{"your name": "folder's name"}`` adds synonyms)
            keeping that class's rows of every class-dependent tensor, the others starting fresh
            (the family's initialisation); ``report.classes`` says which.  None: the folder's classes.

    Returns the model in eval mode and a :class:`~peg_core.interop.LoadReport`: ``copied`` (our keys
    loaded), ``converted`` (our keys added at their initialisation), ``skipped`` (file keys left
    out), ``args`` (config.json).

    Raises:
        WeightsError: no folder, no config.json or weights, unreadable files, tensors that do not
            fit the config (key and shapes named).
        ValueError: a ``model_type`` not in :data:`FROM_HF`, or settings peg_detr lacks.
    """
    path = resolve_weights(folder, kind="folder").path  # a hub id: its snapshot (a Path stays a path)
    kind = read_hf_config(path).get("model_type")
    if kind not in FROM_HF:
        raise ValueError(
            f"{path / 'config.json'}: model_type {kind!r} is not supported (expected one of {', '.join(map(repr, SUPPORTED_MODEL_TYPES))})"
        )
    fmt = FROM_HF[kind]
    model, report = fmt.read(path) if pos_enc is None else fmt.read(path, pos_enc)
    if classes is None:
        return model, report
    config = read_hf_config(path)
    transfer = match_classes(list(classes), hf_label_names(config, path / "config.json") or [], class_map)
    if fmt.from_config is not None:  # the folder's config for the new label set, the read model's options
        options = {k: v for k, v in model.build_config.items() if k not in ("hf_config", "pos_enc")}
        fresh = fmt.from_config(
            config_for_classes(config, list(classes)), model.build_config["pos_enc"], **options
        )
    else:  # DETR: built by build_detr from the folder's options
        fresh, _, _ = build_detr(**{**model.build_config, "num_classes": len(classes)})
    carried = carry_classes(model, fresh, fresh.class_parameters(), transfer, str(path))
    report.classes, report.converted = transfer, {**report.converted, **carried.converted}
    return fresh.eval(), report
