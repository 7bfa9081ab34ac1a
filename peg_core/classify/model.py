"""The classifier: a :class:`~peg_core.models.CPVT` built from a JSON-safe config, loaded from files.

``model_config`` (stored in every checkpoint) is ``{"arch": ..., **CPVT keywords}``;
:func:`build_model` rebuilds the same network from it, :func:`load_model` rebuilds it with its
weights (``eval``, ``predict``, ``quantize``), and :func:`load_init_weights` puts starting weights
(``train --init``) into a freshly built one.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .. import models
from ..engine import (
    LoadedModel,
    UserError,
    checkpoint_and_where,
    load_model_state,
    peg_kwargs,
    refuse_without_effect,
    unused_pos_flags,
)
from ..interop.classes import ClassParam, match_classes, transfer_class_rows
from ..interop.from_timm import from_timm_file
from ..interop.io import LoadReport, WeightsError, read_state_file, strip_prefixes, unwrap_state_dict
from ..interop.resolve import resolve_weights
from ..peg import fold_peg_keys
from ..resize import resize_pos_embed

__all__ = [
    "ARCHS",
    "DEMO_CONFIG",
    "OLD_ARG_NAMES",
    "SCALES",
    "InitFile",
    "apply_init_state",
    "build_checked",
    "build_model",
    "init_model_config",
    "load_init_weights",
    "load_model",
    "model_config_from_args",
    "read_init",
    "refuse_unused_pos_flags",
    "scaled_sizes",
    "stored_args",
]

ARCHS = ("demo", "cpvt_tiny", "cpvt_small", "cpvt_base", "cpvt")
#: small CPVT for the generated set (patch 8 on 48 px images: a 6x6 grid).  The class-token head
#: learns the shape-and-quadrant classes in a few epochs; average pooling stalls at the shape-only
#: plateau (top-1 ~1/4) for many more.  A PEG after every block (CPVT's "0-5" variant, here 0-3).
DEMO_CONFIG: dict[str, Any] = {
    "embed_dim": 64,
    "depth": 4,
    "num_heads": 4,
    "patch_size": 8,
    "mlp_ratio": 2.0,
    "global_pool": "token",
    "peg_at": (0, 1, 2, 3),
}
#: test sizes as multiples of the training size (eval's default)
SCALES = (0.75, 1.0, 1.5, 2.0)
#: argparse destinations (besides the PEG group) that override the arch's shape when given
SHAPE_OPTIONS = (
    "embed_dim",
    "depth",
    "num_heads",
    "patch_size",
    "mlp_ratio",
    "global_pool",
    "drop_path_rate",
)
#: argument names of checkpoints written before the shared vocabulary -> today's names
OLD_ARG_NAMES = {"data": "data_root", "n_train": "num_train", "n_val": "num_val"}
#: the learned position table's key (resized by ``--init`` when it was trained on another grid)
TABLE_KEY = "pos_enc.pos_embed"


def build_model(config: Mapping[str, Any]) -> models.CPVT:
    """A CPVT from ``{"arch": "demo" | "cpvt_tiny" | "cpvt_small" | "cpvt_base" | "cpvt", **CPVT keywords}``.

    ``arch="demo"`` starts from :data:`DEMO_CONFIG`; the keywords override the arch's defaults.
    ``arch="cpvt"`` is the :class:`~peg_core.models.CPVT` class itself with exactly the keywords (the
    config :func:`peg_core.from_timm` records for a converted timm ViT).
    Raises ``ValueError`` / ``TypeError`` for a config that builds no CPVT.
    """
    cfg = fold_peg_keys(config)  # configs store the PEG's options as loose peg_* keywords
    arch = cfg.pop("arch", "demo")
    if arch == "demo":
        return models.CPVT(**{**DEMO_CONFIG, **cfg})
    if arch == "cpvt":
        return models.CPVT(**cfg)
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {ARCHS}; got {arch!r}")
    return getattr(models, arch)(**cfg)


def model_config_from_args(args: argparse.Namespace, num_classes: int) -> dict[str, Any]:
    """The JSON-safe ``model_config`` of a ``train`` command (only the options the user set)."""
    cfg: dict[str, Any] = {
        "arch": args.arch,
        "pos_enc": args.pos_enc,
        "img_size": args.img_size,
        "num_classes": num_classes,
        "pos_interpolation": args.pos_interpolation,
    }
    chosen = {name: getattr(args, name, None) for name in SHAPE_OPTIONS} | peg_kwargs(args)
    for name, value in chosen.items():
        if value is not None:
            cfg[name] = list(value) if isinstance(value, tuple | list) else value
    return cfg


def refuse_unused_pos_flags(args: argparse.Namespace, config: Mapping[str, Any], source: str) -> None:
    """Position flags the model of ``config`` would ignore: a :class:`UserError` when the command line gives one.

    The PEG group without a PEG in ``pos_enc``, ``--peg-num-kernels`` without ``--peg-dynamic``
    and ``--pos-interpolation`` without a learned table.  ``source`` says where ``pos_enc`` came
    from (``--pos-enc sine``, or the ``--init`` file's model); the flags the command line gave are
    ``args.cli_flags`` (:func:`peg_core.classify.cli.parse_train_args`).
    """
    reasons = unused_pos_flags(str(config.get("pos_enc")), config.get("peg_dynamic"), source)
    refuse_without_effect(args, getattr(args, "cli_flags", ()), reasons)


def build_checked(config: Mapping[str, Any], where: str | os.PathLike) -> models.CPVT:
    """:func:`build_model` with a one-line :class:`UserError` naming ``where`` for a bad config."""
    try:
        return build_model(config)
    except (ValueError, TypeError) as e:
        raise UserError(f"cannot build the model ({' '.join(str(e).split())})", where) from None


def scaled_sizes(train_size: int, scales: Sequence[float] = SCALES) -> list[int]:
    """Test sizes ``round(train_size * s)`` (the model pads sizes that are not multiples of the patch)."""
    return [round(train_size * s) for s in scales]


# ---------------------------------------------------------------------------------- checkpoints


def stored_args(ckpt: Mapping[str, Any]) -> dict[str, Any]:
    """The training run's arguments stored in ``ckpt``, old names (``data``, ``n_val``) mapped to today's."""
    out: dict[str, Any] = {}
    for name, value in dict(ckpt.get("args") or {}).items():
        new = OLD_ARG_NAMES.get(name, name)
        if new not in out or name == new:  # today's name wins when a checkpoint holds both
            out[new] = value
    return out


def load_model(
    checkpoint: str | os.PathLike | Mapping[str, Any],
    where: str | os.PathLike | None = None,
    **overrides: Any,
) -> LoadedModel:
    """The CPVT of a ``peg_core train`` checkpoint with its weights, in eval mode on the CPU.

    Args:
        checkpoint: the checkpoint's path, or the checkpoint already read (``where`` names its file).
        overrides: ``model_config`` entries that leave the weights' shapes alone, e.g.
            ``pos_interpolation="nearest"`` (``eval --pos-interpolation``); ``None`` values are ignored.

    Raises :class:`UserError` (one line, naming the file) for an unreadable file, a checkpoint of
    another task, one without ``model_config`` / ``meta.classes``, or weights that do not fit.
    """
    ckpt, where = checkpoint_and_where(checkpoint, where, "classify")
    config = ckpt.get("model_config")
    meta = ckpt.get("meta") if isinstance(ckpt.get("meta"), dict) else {}
    classes = meta.get("classes")
    if not isinstance(config, dict) or not config or not isinstance(classes, list):
        raise UserError(
            "checkpoint has no model_config / meta.classes (not written by 'peg_core train')", where
        )
    config = {**config, **{k: v for k, v in overrides.items() if v is not None}}
    model = build_checked(config, where)
    if model.num_classes != len(classes):
        raise UserError(f"checkpoint lists {len(classes)} classes for a {model.num_classes}-way head", where)
    load_model_state(model, ckpt["model"], where)
    return LoadedModel(model.eval(), config, list(classes), meta, stored_args(ckpt))


# ------------------------------------------------------------------------------- starting weights


def _shape(t: Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def _fit_table(model: models.CPVT, table: Tensor, mine: Tensor) -> Tensor:
    """A learned table ``(1, P + h'*w', C)`` of another (square) grid resized to the model's ``(1, P + h*w, C)``."""
    if table.dim() != mine.dim() or table.shape[-1] != mine.shape[-1]:
        raise ValueError(f"{TABLE_KEY} is {_shape(table)} in the file, {_shape(mine)} in the model")
    try:
        return resize_pos_embed(
            table, model.grid_size, num_prefix_tokens=model.num_prefix_tokens, mode=model.pos_interpolation
        )
    except ValueError as e:
        raise ValueError(f"{TABLE_KEY} {_shape(table)} cannot be resized to {_shape(mine)} ({e})") from None


def apply_init_state(
    model: models.CPVT,
    state: Mapping[str, Any],
    zero_new_pegs: bool = False,
    classes: Sequence[str] | None = None,
    start_classes: Sequence[str] | None = None,
    class_map: Mapping[str, str] | None = None,
) -> LoadReport:
    """Copy the tensors of ``state`` whose keys the model has into ``model`` (not strict).

    A learned table of another grid is resized (:func:`peg_core.resize_pos_embed`, the model's
    ``pos_interpolation``); a head of another number of classes is left out (fine-tuning on
    another label set).  Raises ``ValueError`` naming the key and both shapes for any other
    shape mismatch, for a non-tensor value under one of the model's keys, and for tensors the
    model has no key for other than extra heads (they would be dropped silently: another
    architecture).  ``zero_new_pegs``: PEG weights (``pos_blocks.*``) the file lacks are set to
    zero instead of kept as initialised (``report.converted``).  ``classes`` (the run's) and
    ``start_classes`` (the file's) known: the head is rebuilt for ``classes``, a class named like one
    of the file's (``class_map``: synonyms) keeping that class's row, the others fresh
    (:func:`peg_core.interop.match_classes`; ``report.classes``).  Returns the :class:`LoadReport`.
    """
    mine = model.state_dict()
    unexpected = sorted(set(state) - set(mine))
    report = LoadReport(skipped=dict.fromkeys(unexpected, "the model has no such key (another head)"))
    # Weights the model has no place for mean another architecture (layer scale, registers, depth):
    # dropping them would train a different network without a word.  Extra heads (a distilled
    # DeiT's head_dist) are left out like a head of another class count.
    homeless = [k for k in unexpected if not k.startswith("head")]
    if homeless:
        names = ", ".join(homeless[:3]) + (", ..." if len(homeless) > 3 else "")
        raise ValueError(
            f"{len(homeless)} tensors of the file have no place in the model ({names}): "
            "build the model the weights came from (--arch, --depth, --pos-enc, ...)"
        )
    take: dict[str, Tensor] = {}
    heads = [k for k in mine if k.startswith("head.") and k in state]
    if classes is not None and start_classes and heads and all(isinstance(state[k], Tensor) for k in heads):
        # the head's rows by class name: shared classes keep theirs, the others keep the model's init
        transfer = match_classes(list(classes), list(start_classes), class_map)
        carried, converted = transfer_class_rows(
            {k: mine[k] for k in heads},
            {k: state[k] for k in heads},
            [ClassParam(k) for k in heads],
            transfer,
        )
        state = {**state, **carried}
        report.converted.update(converted)
        report.classes = transfer
    head_left_out = any(_shape(state[k]) != _shape(mine[k]) for k in heads if isinstance(state[k], Tensor))
    for key, ref in mine.items():
        value = state.get(key)
        if value is None and zero_new_pegs and key.startswith("pos_blocks."):
            value = torch.zeros_like(ref)  # an added PEG is the identity until it trains
            report.converted[key] = "zero-initialised (a PEG the file lacks)"
        if head_left_out and key in heads:
            report.skipped[key] = (
                f"shape {_shape(state[key])}, the model's is {_shape(ref)} (another number of classes)"
            )
        if value is None or (head_left_out and key in heads):
            report.missing.append(key)
            continue
        if not isinstance(value, Tensor):
            raise ValueError(f"{key} is a {type(value).__name__} in the file, not a tensor")
        if key == TABLE_KEY and _shape(value) != _shape(ref):
            report.converted[key] = f"resized {_shape(value)} -> {_shape(ref)}"
            value = _fit_table(model, value, ref)
        if _shape(value) != _shape(ref):
            raise ValueError(f"{key} is {_shape(value)} in the file, {_shape(ref)} in the model")
        take[key] = value
    model.load_state_dict(take, strict=False)
    report.copied = sorted(k for k in take if k not in report.converted)
    return report


@dataclass
class InitFile:
    """What ``train --init`` starts from: the weights and, when the file says, the model they belong to."""

    state: dict[str, Any]
    config: dict[str, Any] | None = None  # the file's model_config (a train checkpoint, a from-timm file)
    source: str = ""  # "timm <name>" for weights converted on reading
    classes: list[str] | None = None  # the checkpoint's class names (meta["classes"]), when it has them


def read_init(path: str | os.PathLike, timm_model: str | None = None) -> InitFile:
    """The starting weights in ``path``; one-line :class:`UserError` naming ``path``.

    ``path`` is a classify checkpoint, a bare ``.pth`` state dict or a ``.safetensors`` file with
    the CPVT's keys (torch files read with ``weights_only=True``; wrappers (``model``,
    ``state_dict``, ...) and a DDP ``module.`` prefix looked through).  With ``timm_model`` it holds
    the weights of that timm architecture in timm's layout, converted by
    :func:`peg_core.interop.from_timm_file`; the converted model's config comes with them.  A string
    ``path`` may also name remote weights (:func:`peg_core.interop.resolve_weights`): a hub id's
    ``model.safetensors``, or ``timm:NAME`` (timm's pretrained weights, converted as ``timm_model=NAME``).
    """
    try:
        if isinstance(path, str) and path.startswith("timm:") and timm_model is None:
            timm_model = path[len("timm:") :]  # timm's pretrained weights are in timm's layout
        path = resolve_weights(path, kind="file").path  # a hub id / timm:NAME: its cached file
        if timm_model is not None:
            model = from_timm_file(timm_model, path)
            return InitFile(dict(model.state_dict()), dict(model.build_config), f"timm {timm_model}")
        obj = read_state_file(path, what="--init weights")
        if isinstance(obj, Mapping) and obj.get("task", "classify") != "classify":
            raise UserError(f"--init needs classifier weights; this is a {obj['task']!r} checkpoint", path)
        config = obj.get("model_config") if isinstance(obj, Mapping) else None
        meta = obj.get("meta") if isinstance(obj, Mapping) else None
        names = meta.get("classes") if isinstance(meta, Mapping) else None
        names = [str(n) for n in names] if isinstance(names, list) else None
        state = strip_prefixes(unwrap_state_dict(obj, where=path))
        return InitFile(
            state, dict(config) if isinstance(config, Mapping) and config else None, classes=names
        )
    except WeightsError as e:
        raise UserError(e.what, e.where) from None
    except TypeError as e:  # a timm layout from_timm does not convert: the message names the part
        raise UserError(f"--init-timm {timm_model}: {e}", path) from None
    except ImportError as e:  # safetensors / timm not installed: the message names the package
        raise UserError(str(e)) from None


def init_model_config(
    flags: Mapping[str, Any], file_config: Mapping[str, Any], explicit: Collection[str]
) -> dict[str, Any]:
    """The model of a ``train --init`` run whose file names its own architecture.

    The file's ``model_config`` (a converted timm ViT: layer scale, registers, qkv bias, rotary
    temperature ... that no flag spells) is the base; a model flag given on the command line
    (``explicit``: argparse dests, e.g. ``pos_enc`` for ``--pos-enc peg+rope-mixed``) replaces its
    entry; the class count is the data's and ``img_size`` the run's (a learned table is resized).
    ``--arch`` on the command line means "build this arch": ``flags`` is returned unchanged.
    """
    if "arch" in explicit:
        return dict(flags)
    config = dict(file_config)
    for key, value in flags.items():
        if key in explicit:
            config[key] = value
    config["num_classes"] = flags["num_classes"]
    config["img_size"] = flags["img_size"]
    if not config.get("peg_at") and "peg_at" not in explicit:
        config.pop("peg_at", None)  # a PEG asked for by --pos-enc alone goes where CPVT puts it (block 0)
    return config


def load_init_weights(
    model: models.CPVT,
    path: str | os.PathLike,
    init: InitFile | None = None,
    classes: Sequence[str] | None = None,
    class_map: Mapping[str, str] | None = None,
) -> LoadReport:
    """``train --init PATH``: :func:`read_init` (unless ``init`` is given) then :func:`apply_init_state`.

    ``classes``: the run's class names; a classify checkpoint's head rows of the classes it shares with
    them by name are kept (``class_map`` adds synonyms), the others start fresh.

    When the file named the model (``init.config``), PEGs it has no weights for start at zero, so
    the run starts from the file's network exactly (as :func:`peg_core.from_timm` adds them).
    One-line :class:`UserError` naming ``path``.
    """
    init = read_init(path) if init is None else init
    try:
        return apply_init_state(
            model,
            init.state,
            init.config is not None,
            classes,
            init.classes if classes is not None else None,
            class_map,
        )
    except ValueError as e:
        raise UserError(f"--init does not fit the model ({e})", path) from None
