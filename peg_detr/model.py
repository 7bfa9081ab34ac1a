"""The detector from a json-safe config, and back from a training checkpoint (eval, predict, study).

A training checkpoint stores ``model_config`` (``arch`` and every keyword of
:func:`~peg_detr.build_detr` but the backbone weights file, as recorded by the
builder) and ``meta`` (``categories``, ``num_classes``, ``val_size``, ...), so
``eval`` and ``predict`` rebuild exactly the trained model without the run's flags; ``meta["labels"]``
records which category each label stands for (:class:`~peg_detr.data.LabelMap`).
Configs written before the shared vocabulary (``nheads``) are read with today's names.
``arch`` picks the builder (:data:`~peg_detr.archs.ARCHS`: ``detr``, ``rtdetr``, ...); a checkpoint trained with a weight
EMA (RT-DETR) holds the live weights under ``model.`` and the average under ``ema.module.``:
:func:`load_model` loads the average, the weights RT-DETR evaluates and ships.
"""

from __future__ import annotations

import argparse
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from peg_core.engine import LoadedModel, UserError, checkpoint_and_where, load_model_state, read_state_file
from peg_core.interop.classes import ClassTransfer, carry_classes, match_classes
from peg_core.interop.io import LoadReport, WeightsError
from peg_core.interop.resolve import resolve_weights

from .archs import ARCHS, Arch, arch_named, arch_of, arch_of_model
from .interop.hf import from_hf
from .interop.hf_detr import hf_label_names
from .interop.hf_processor import processor_side
from .interop.hf_rtdetr import config_for_classes
from .labels import LabelMap

__all__ = [
    "ARCHS",
    "build_model",
    "eval_state_dict",
    "load_hf_model",
    "load_model",
    "model_config_from_args",
    "only_named",
    "rebuild_classes",
    "relabel",
    "set_named",
    "upgrade_config",
]

#: state-dict prefix of the weight average in a checkpoint trained with an EMA (peg_detr.task.EmaModel)
EMA_PREFIX = "ema.module."
#: old model_config keys -> today's builder keywords
_RENAMED = {"nheads": "num_heads"}


def upgrade_config(config: dict[str, Any]) -> dict[str, Any]:
    """A copy of a stored ``model_config`` with old key names (``nheads``) renamed."""
    return {_RENAMED.get(k, k): v for k, v in config.items()}


def build_model(
    config: dict[str, Any], source: Any = "model options"
) -> tuple[nn.Module, nn.Module, nn.Module]:
    """``arch.build(arch.config.from_dict(config))`` -> ``(model, criterion, postprocessor)``; bad settings are a :class:`UserError`.

    ``config`` is a ``model_config``: ``arch`` and the family config's fields (a checkpoint's, written
    now or before the configs were typed: the names are the builders' keywords).  ``source`` names
    where it came from (the flags, or a checkpoint path) in the message.  ``model.build_config``
    records ``arch`` and the config's :meth:`~peg_detr.models.config.DetectorConfig.to_dict`.
    """
    kw = upgrade_config(config)
    try:
        arch = arch_named(kw.pop("arch", "detr"))
    except ValueError as e:
        raise UserError(str(e), source) from None
    hidden, heads = kw.get("hidden_dim", 256), kw.get("num_heads", 8)
    if hidden % heads:
        raise UserError(f"--hidden-dim {hidden} is not divisible by --num-heads {heads}", source)
    weights = kw.get("backbone_weights")
    # an arch whose backbone may come from a Hugging Face folder of its family (RT-DETR's ResNet-vd)
    # loads it here, after building, by the interop's key map (the library's builder reads plain files)
    folder_weights = kw.pop("backbone_weights", None) if arch.load_backbone is not None else None
    if weights is not None and not Path(weights).is_dir():  # missing / empty / not a torch file: one line
        read_state_file(weights, what="backbone weights")
    try:
        if "hf_config" in kw and arch.from_hf_config is not None:  # built by from_hf (--init FOLDER)
            model, criterion, postprocessor = _from_hf_config(arch, kw)
        else:
            if (
                folder_weights is not None and kw.get("backbone", arch.backbone) == "tiny"
            ):  # as the builders refuse it
                raise ValueError("the 'tiny' backbone has no pretrained weights; drop backbone_weights")
            model, criterion, postprocessor = arch.build(arch.config.from_dict(kw))
    except (ValueError, TypeError) as e:  # the config checks its values; TypeError: an unknown key
        raise UserError(f"invalid model settings ({' '.join(str(e).split())})", source) from None
    if folder_weights is not None:
        arch.load_backbone(model.backbone, folder_weights)
    model.build_config = {"arch": arch.name, **model.build_config}
    return model, criterion, postprocessor


def _from_hf_config(arch: Arch, kw: dict[str, Any]) -> tuple[nn.Module, nn.Module, nn.Module]:
    """A model whose ``model_config`` is ``{"hf_config": config.json, "pos_enc", **encoder options}``."""
    kw.pop("num_classes", None)  # recorded for eval / predict; the config's id2label sets it
    losses = {k: kw.pop(k) for k in arch.loss_options if k in kw}  # the criterion's, not the model's
    model = arch.from_hf_config(kw.pop("hf_config"), kw.pop("pos_enc", arch.pos_enc), **kw)
    model.build_config = {**model.build_config, **losses, "num_classes": model.num_classes}
    return model, *arch.training_parts(model, **losses)


def model_config_from_args(args: argparse.Namespace, num_classes: int) -> dict[str, Any]:
    """The ``model_config`` of parsed ``train`` flags (unset options: the builder's default)."""
    arch = arch_of(args)
    if arch.family != "detr":  # DETR-only flags are refused, not ignored
        for dest, flag in (("dilation", "--dilation"), ("decoder_key_pos", "--decoder-key-pos")):
            if getattr(args, dest, None):
                raise UserError("applies to --arch detr only", flag)
    size = getattr(args, "model_size", None)
    if size is not None and size not in arch.sizes:
        raise UserError(f"--arch {arch.name} has no size presets" if not arch.sizes else
                        f"--arch {arch.name} has the sizes {sorted(arch.sizes)}", f"--model-size {size}")  # fmt: skip
    preset = arch.sizes[size] if size is not None else {}
    # Precedence: flags of the command line > a --model-size preset named there > the recipe's values
    # > a preset the recipe names (a recipe is written around its own size) > the builder's defaults.
    explicit = set(getattr(args, "cli_flags", None) or ())
    over_recipe = "model_size" in explicit

    def wins(dest: str) -> bool:
        """Whether ``args.<dest>`` (not None) is used over the preset's value."""
        return not (over_recipe and dest in preset and dest not in explicit)

    given = {dest: getattr(args, dest, None) for dest in arch.options}  # the config's fields with a flag
    kw: dict[str, Any] = {"arch": arch.name, **preset}
    for dest, value in given.items():
        if value is not None and wins(dest):
            kw[dest] = str(value) if isinstance(value, Path) else value
    kw["num_classes"] = num_classes
    return kw


def relabel(
    model: nn.Module,
    names: list[str],
    start_names: list[str] | None,
    class_map: Mapping[str, str] | None = None,
    source: Any = "",
) -> tuple[nn.Module, nn.Module, nn.Module, LoadReport]:
    """The detector ``model`` rebuilt for the label set ``names``, keeping the classes it shares by name.

    Every class-dependent tensor (``model.class_parameters()``: DETR's ``class_embed``; the RT-DETR
    family's per-layer and encoder score heads and the denoising class embedding) is rebuilt for
    ``len(names)`` classes at the family's initialisation (the focal prior bias, ...); a class whose
    name (case- and whitespace-insensitive, or a ``class_map`` synonym) is one of ``start_names``
    keeps that start class's rows.  Every other tensor is the start's.  ``names[label]``: ``""``
    for a label no category uses; ``start_names`` ``None``: the start's names are unknown (nothing
    is kept).  ``model.build_config`` (with ``arch``) rebuilds the model: a Hugging Face folder's
    config gets the new ``id2label``.

    Returns ``(model, criterion, postprocessor, report)``; ``report.classes`` says what was kept.
    A ``class_map`` naming a class neither side has is a ``ValueError``.
    """
    return rebuild_classes(model, match_classes(names, start_names or [], class_map), source)


def rebuild_classes(
    model: nn.Module, transfer: ClassTransfer, source: Any = ""
) -> tuple[nn.Module, nn.Module, nn.Module, LoadReport]:
    """``model`` rebuilt for ``transfer.names``, each class row from ``transfer.source`` (:func:`relabel`'s core)."""
    names = list(transfer.names)
    config = {"arch": arch_of_model(model).name, **model.build_config, "num_classes": len(names)}
    if "hf_config" in config:  # the folder's config decides the class count: give it the new names
        config["hf_config"] = config_for_classes(config["hf_config"], names)
    with warnings.catch_warnings():  # "ResNet starts from random weights": the start's weights follow
        warnings.simplefilter("ignore", UserWarning)
        fresh, criterion, postprocessor = build_model(config, source or "the start model")
    report = carry_classes(model, fresh, fresh.class_parameters(), transfer, str(source))
    return fresh, criterion, postprocessor, report


def only_named(model: nn.Module, classes: list[str], named: Tensor) -> tuple[nn.Module, list[str]]:
    """``model`` with the class rows of the ``named`` labels alone, and their names (for ``export-hf``).

    Exact for the sigmoid families (RT-DETR, D-FINE, DEIMv2: classes are independent).  DETR's
    softmax is then over the kept classes: each score gains the probability the model gave the
    ids without a category (about zero once trained, as they are never a target), where ``eval``
    and ``predict`` keep the full softmax's.  A folder's labels then all name categories.
    """
    if bool(named.all()):
        return model, classes
    keep = [i for i in range(len(classes)) if bool(named[i])]
    transfer = ClassTransfer(tuple(classes[i] for i in keep), tuple(classes), tuple(keep))
    compact, _, _, _ = rebuild_classes(model, transfer)
    return compact.eval(), [classes[i] for i in keep]


def set_named(postprocessor: nn.Module, named: Tensor) -> None:
    """Mask the labels that name no category in ``postprocessor`` (``named`` ``(C,)`` bool; all True: none)."""
    postprocessor.named = None if bool(named.all()) else named


def eval_state_dict(state: Mapping[str, Any]) -> dict[str, Any]:
    """The weights to evaluate of a checkpoint's ``model`` state: the EMA average when it has one."""
    ema = {k[len(EMA_PREFIX) :]: v for k, v in state.items() if k.startswith(EMA_PREFIX)}
    return ema or dict(state)


def load_model(
    checkpoint: str | os.PathLike | Mapping[str, Any],
    where: str | os.PathLike | None = None,
    **overrides: Any,
) -> LoadedModel:
    """The detector of a ``peg_detr train`` checkpoint with its weights, and its box post-processing.

    Args:
        checkpoint: the checkpoint's path, or the checkpoint already read (``where`` names its file).
        overrides: stored config values that leave the weights' shapes alone, e.g.
            ``pos_interpolation="nearest"`` (``eval --pos-interpolation``); ``None`` values are ignored.

    Returns:
        A :class:`~peg_core.engine.LoadedModel` whose ``classes[i]`` is the category name of label
        ``i`` (the run's :class:`~peg_detr.data.LabelMap`, ``meta["labels"]``: with ``ids`` the name
        of category id ``i``, ``""`` for an id the data set does not use, COCO's ids being sparse;
        with ``contiguous`` the ``i``-th category's) and whose ``postprocess`` turns the model's
        outputs into boxes in pixels.
    """
    ckpt, where = checkpoint_and_where(checkpoint, where, "detect")
    config = ckpt.get("model_config")
    if not isinstance(config, dict) or "num_classes" not in config:
        raise UserError(
            "checkpoint has no detector model_config (not written by `python -m peg_detr train`?)", where
        )
    config = {**config, **{k: v for k, v in overrides.items() if v is not None}}
    with warnings.catch_warnings():  # "ResNet starts from random weights": the checkpoint's weights follow
        warnings.simplefilter("ignore", UserWarning)
        model, _, postprocessor = build_model(config, where)
    load_model_state(model, eval_state_dict(ckpt["model"]), where)
    meta = ckpt.get("meta") if isinstance(ckpt.get("meta"), dict) else {}
    try:
        label_map = LabelMap.from_meta(meta)
    except ValueError as e:  # a meta["labels"] that is not one
        raise UserError(f"checkpoint's label map is malformed ({e})", where) from None
    classes = label_map.names(int(config["num_classes"]))
    if label_map.categories:  # labels without a category (id gaps, past the categories) are never predicted
        set_named(postprocessor, label_map.named(int(config["num_classes"])))
    args = ckpt.get("args") if isinstance(ckpt.get("args"), dict) else {}
    return LoadedModel(model.eval(), config, classes, meta, dict(args), postprocessor)


def load_hf_model(folder: str | os.PathLike) -> LoadedModel:
    """The detector of a Hugging Face DETR / RT-DETR folder (:func:`~peg_detr.interop.from_hf`), for inference.

    ``folder``: a local ``save_pretrained`` folder, or a hub id (``"PekingU/rtdetr_r50vd"``) fetched
    once into the hub cache (:func:`peg_core.interop.resolve_weights`).  Label ``i`` is category id
    ``i`` named by the folder's ``id2label`` (its number without one); ``meta["val_size"]`` is the
    side of the folder's ``preprocessor_config.json`` (an ``export-hf`` folder's run size), else
    absent, so a predictor uses the architecture's evaluation size (DETR 800, RT-DETR 640).
    """
    path = resolve_weights(folder, kind="folder").path
    try:
        model, report = from_hf(path)
    except ValueError as e:  # another model_type, or settings peg_detr lacks: an InputError naming the folder
        raise e if isinstance(e, WeightsError) else WeightsError(" ".join(str(e).split()), path) from None
    arch = arch_of_model(model)
    postprocessor = arch.postprocess(model)
    config = {"arch": arch.name, **getattr(model, "build_config", {})}
    names = hf_label_names(report.args, path / "config.json") or []
    count = int(config.get("num_classes") or len(names))
    names = [*names, *map(str, range(len(names), count))][:count]
    labels = LabelMap.from_categories([{"id": i, "name": n} for i, n in enumerate(names)], "ids")
    meta: dict[str, Any] = {"labels": labels.to_json()}
    side = processor_side(path)  # an export-hf folder says the size its run evaluated at
    if side is not None:
        meta["val_size"] = side
    return LoadedModel(model.eval(), config, names, meta, {}, postprocessor)
