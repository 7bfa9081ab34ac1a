"""The video model of ``python -m peg_video``: built from keywords, from ``train`` flags, from a checkpoint.

* :func:`build_model` builds from the keywords a checkpoint stores as ``model_config``
  (:func:`peg_video.build_video_model`'s);
* :func:`model_config_from_args` makes those keywords from parsed ``train`` flags;
* :func:`checkpoint_run` / :func:`load_model` read a video checkpoint back, older ones included
  (their ``peg_at: "all"`` and their argument names are mapped to today's meaning);
* :func:`init_weights` is ``train --init PATH``: a video checkpoint, or a 2-D image one to inflate
  (a :class:`~peg_core.interop.io.LoadReport`, :func:`init_line` its log line);
  :func:`model_from_hf_folder` is ``train --init FOLDER`` (a Hugging Face folder builds the model).

Checkpoint problems are :class:`~peg_core.engine.UserError` (one line naming the file); a
config the builder refuses is the builder's ``ValueError`` / ``TypeError``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torch import nn

from peg_core.engine import (
    LoadedModel,
    UserError,
    checkpoint_and_where,
    json_safe,
    load_model_state,
    peg_kwargs,
    read_state_file,
)
from peg_core.errors import InputError
from peg_core.interop.classes import ClassParam, carry_classes, match_classes, transfer_class_rows
from peg_core.interop.io import LoadReport

from .data.clip import ClipSpec
from .interop.hf import hf_build_config, load_hf_model, read_hf_video_config
from .interop.inflate import Init2dError, load_2d_checkpoint
from .models import VIT_CONFIGS, VideoTransformer, build_video_model

__all__ = [
    "OLD_ARG_NAMES",
    "build_model",
    "check_clip_fits",
    "checkpoint_run",
    "init_line",
    "init_weights",
    "load_model",
    "model_config_from_args",
    "model_from_hf_folder",
    "upgrade_model_config",
]

#: ``train`` argument names of checkpoints written before the shared vocabulary -> today's
OLD_ARG_NAMES = {
    "model": "arch",
    "train_scale": "scale_jitter",
    "init_2d": "init",
    "init_2d_source": "init_source",
}


def build_model(config: Mapping[str, Any]) -> nn.Module:
    """``build_video_model(**config)``: ``config`` is a checkpoint's ``model_config`` (``name``, ``pos_enc``, ...).

    Raises the builder's ``ValueError`` / ``TypeError`` for keywords that do not fit the model.
    """
    return build_video_model(**config)


def model_config_from_args(
    args: argparse.Namespace, num_classes: int, clip: ClipSpec | None = None
) -> dict[str, Any]:
    """JSON-safe :func:`build_model` keywords for parsed ``train`` flags (stored as ``model_config``).

    The clip length, crop and tubelet are the run's :class:`~peg_video.data.clip.ClipSpec`
    (``clip``; by default the one the arguments record).
    Only options that were set go in (``--num-heads``, the PEG group, ``--pos-interpolation``),
    so an unset one keeps the builder's default and old checkpoints' configs stay comparable.
    ``--peg-separable`` is not a keyword: the parser has turned it into ``pos_enc="peg3d-factorized"``.
    """
    clip = ClipSpec.of_run(args) if clip is None else clip
    config: dict[str, Any] = {
        "name": args.arch,
        "pos_enc": args.pos_enc,
        "num_classes": num_classes,
        "num_frames": clip.num_frames,
        "img_size": clip.crop,
        "tubelet": list(clip.tubelet),
        **args.model_opts,
    }
    if getattr(args, "num_heads", None) is not None:
        config["num_heads"] = args.num_heads
    config.update({k: v for k, v in peg_kwargs(args).items() if k != "peg_separable"})
    if getattr(args, "pos_interpolation", None) is not None:
        config["pos_interpolation"] = args.pos_interpolation
    return json_safe(config)


def upgrade_model_config(config: Mapping[str, Any], state: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with an old checkpoint's ``peg_at: "all"`` read with the meaning it had when written.

    Until the suite agreed on one meaning, the video ViT's ``"all"`` was ``-1 .. depth-2`` (a PEG at
    the input of every block); today it is ``0 .. depth-1``.  A state dict with a PEG before block 0
    (``pos_blocks.-1.*``) can only be the old meaning, so that config gets the explicit old list.
    """
    config = dict(config)
    if config.get("peg_at") == "all" and any(str(k).startswith("pos_blocks.-1.") for k in state):
        depth = config.get("depth") or VIT_CONFIGS.get(config.get("name", "vit_small"), (0, 12, 0))[1]
        config["peg_at"] = list(range(-1, int(depth) - 1))
    return config


def checkpoint_run(
    ckpt: Mapping[str, Any], path: str | os.PathLike | None
) -> tuple[dict[str, Any], list[str], dict[str, Any]]:
    """``(model_config, classes, training arguments)`` of a video checkpoint, in today's terms.

    The config is upgraded (:func:`upgrade_model_config`) and old argument names are renamed
    (:data:`OLD_ARG_NAMES`).  A missing entry is a :class:`UserError` naming ``path``.
    """
    for key in ("model_config", "meta", "args"):
        if not isinstance(ckpt.get(key), Mapping):
            raise UserError(f"checkpoint has no {key!r} entry", path)
    classes = ckpt["meta"].get("classes")
    if not isinstance(classes, list) or not classes:
        raise UserError("checkpoint has no class list in its 'meta' entry", path)
    state = ckpt.get("model") if isinstance(ckpt.get("model"), Mapping) else {}
    saved = dict(ckpt["args"])
    for old, new in OLD_ARG_NAMES.items():
        if old in saved and new not in saved:
            saved[new] = saved.pop(old)
    return upgrade_model_config(ckpt["model_config"], state), list(classes), saved


def load_model(
    checkpoint: str | os.PathLike | Mapping[str, Any], path: str | os.PathLike | None = None, **overrides: Any
) -> LoadedModel:
    """The trained model of a video checkpoint (a file, or a checkpoint dict read from ``path``).

    ``overrides`` replace ``model_config`` entries (``pos_interpolation="nearest"``).  The weights
    are loaded strictly; every problem is a one-line :class:`UserError` naming the file.  The model
    is on the CPU in training mode.
    """
    ckpt, where = checkpoint_and_where(checkpoint, path, "video")
    config, classes, saved = checkpoint_run(ckpt, where)
    config.update(overrides)
    try:
        model = build_model(config)
    except (ValueError, TypeError) as e:
        raise UserError(f"cannot build the checkpoint's model ({e})", where) from None
    load_model_state(model, ckpt["model"], where)
    meta = ckpt.get("meta") if isinstance(ckpt.get("meta"), dict) else {}
    return LoadedModel(model, config, classes, meta, saved)


def init_weights(
    model: nn.Module,
    path: str | os.PathLike,
    source: str | None = None,
    classes: Sequence[str] | None = None,
    class_map: Mapping[str, str] | None = None,
) -> LoadReport:
    """``train --init PATH``: start ``model`` from a file; returns what was loaded, key by key.

    The file decides the kind: a peg_video training checkpoint (the engine's format with
    ``task: "video"``) loads key for key (with ``classes``, the run's class names, the head keeps
    the rows of the checkpoint's classes of the same name and starts the others fresh:
    ``report.classes``; without them a head of another class count is dropped and stays at its
    initial values: ``skipped`` and ``missing``; ``args`` is the checkpoint's run); anything else is a 2-D image checkpoint (peg_core's CPVT checkpoint or state dict, a
    timm DeiT state dict with ``source="deit"``) inflated into the video transformer
    (:func:`peg_video.load_2d_checkpoint`).  The report's ``source`` is ``path``.
    """
    path = Path(path)
    if path.is_dir():
        raise UserError("a Hugging Face folder builds its own model (model_from_hf_folder), not weights "
                        "for this one", path)  # fmt: skip
    obj = read_state_file(path, what="--init checkpoint")
    if isinstance(obj, Mapping) and obj.get("task") == "video":
        if source is not None:
            raise UserError(
                "--init-source is the layout of a 2-D checkpoint; this is a video checkpoint", path
            )
        return _init_from_video(model, obj, path, classes, class_map)
    if not isinstance(model, VideoTransformer):
        raise UserError(f"a 2-D image checkpoint initialises a video transformer (vit_*), not a {type(model).__name__}",
                        path)  # fmt: skip
    try:
        report = load_2d_checkpoint(model, obj, source=source or "cpvt")
    except Init2dError as e:  # it was given the tensors, not the file: name the file
        raise Init2dError(e.what, path) from None
    report.source = str(path)
    return report


def init_line(report: LoadReport) -> str:
    """The log line of an ``--init`` load: ``--init PATH: 52 copied, 3 converted, ...`` and why keys were left out."""
    return f"--init {report.source}: {report.line()}"


def model_from_hf_folder(
    folder: str | os.PathLike,
    pos_enc: str,
    num_classes: int,
    options: Mapping[str, Any] | None = None,
    classes: Sequence[str] | None = None,
    class_map: Mapping[str, str] | None = None,
) -> tuple[VideoTransformer, dict[str, Any], LoadReport]:
    """``train --init FOLDER``: the model of a Hugging Face folder with its weights, for ``num_classes``.

    ``pos_enc``: ``"table"`` keeps the folder's own position encoding, any other value is
    :func:`peg_video.from_hf`'s (``"peg3d"``: the table replaced by a zero-initialised PEG3d).
    ``options``: further builder keywords (drop path, the PEG group).  Returns ``(model, config,
    report)``: ``config`` is the :func:`build_model` keywords the run's checkpoint stores, so
    ``eval`` / ``predict`` / ``export`` rebuild the model without the folder.  A folder or weights
    that do not fit are one-line errors naming the folder.

    ``classes`` (the run's class names, ``num_classes`` of them): a classifier folder's classes of
    the same name (its ``id2label``; ``class_map`` adds synonyms) keep their rows of the head, the
    others start fresh (:func:`peg_core.interop.carry_classes`; ``report.classes`` says which).  Without them, or
    for an encoder folder, a head of another size starts fresh.
    """
    folder, own = Path(folder), None if pos_enc == "table" else pos_enc
    try:
        info = read_hf_video_config(folder)  # config.json, read once for the config and the model
        named = classes is not None and info["classifier"] and info["num_classes"] > 0
        config = hf_build_config(info, own, num_classes=info["num_classes"] if named else num_classes,
                                 **dict(options or {}))  # fmt: skip
        model, report = load_hf_model(info, config)
        if named:
            start_names = [info["id2label"][i] for i in range(info["num_classes"])]
            config = {**config, "num_classes": num_classes}
            fresh, transfer = (
                build_video_model(**config),
                match_classes(list(classes), start_names, class_map),
            )
            carried = carry_classes(model, fresh, HEAD_PARAMS, transfer)
            model, report.classes = fresh, transfer
            report.converted = {**report.converted, **carried.converted}
    except InputError:  # WeightsError: already "what: where"
        raise
    except (ValueError, TypeError) as e:
        raise UserError(f"cannot build the folder's model ({e})", folder) from None
    return model, json_safe(config), report


#: the class-dependent tensors of a video transformer: its classifier
HEAD_PARAMS = (ClassParam("head.weight"), ClassParam("head.bias"))


def _init_from_video(
    model: nn.Module,
    ckpt: Mapping[str, Any],
    path: Path,
    classes: Sequence[str] | None = None,
    class_map: Mapping[str, str] | None = None,
) -> LoadReport:
    """Load a video checkpoint's weights into ``model``; with ``classes`` the head keeps shared names' rows.

    Without ``classes`` (or for a model without a ``head``: X3D) a head of another size keeps its init.
    """
    _, start_names, saved = checkpoint_run(ckpt, path)
    state = dict(ckpt["model"])
    mine = model.state_dict()
    if classes is not None and "head.weight" in mine and "head.weight" in state:
        transfer = match_classes(list(classes), start_names, class_map)
        heads = {p.key: state[p.key] for p in HEAD_PARAMS if p.key in state}
        carried, converted = transfer_class_rows(mine, heads, HEAD_PARAMS, transfer)
        state.update({k: carried[k] for k in converted})  # the rest loads strictly, key for key
        load_model_state(model, state, path)
        copied = [k for k in state if k not in converted]
        return LoadReport(str(path), copied, converted, args=saved, classes=transfer)
    dropped = [
        k
        for k in ("head.weight", "head.bias")
        if k in state and k in mine and state[k].shape != mine[k].shape
    ]
    state.update({k: mine[k] for k in dropped})  # same keys, so the strict load checks everything else
    load_model_state(model, state, path)
    why = f"the checkpoint's head ({len(start_names)} classes) does not fit: left at init"
    return LoadReport(
        source=str(path),
        copied=[k for k in state if k not in dropped],
        skipped=dict.fromkeys(dropped, why),
        missing=list(dropped),
        args=saved,
    )


def check_clip_fits(model: nn.Module, run: argparse.Namespace) -> None:
    """A transformer's clips must split into its tubelets; say so before decoding any video.

    The run's clip (:meth:`ClipSpec.of_run`) against the model's tubelet: a
    :class:`~peg_video.data.clip.ClipSpecError` naming the flag (an X3D has no tubelet).
    """
    tubelet = getattr(model, "tubelet", None)
    if tubelet is not None:
        ClipSpec.of_run(run, tubelet=tubelet).check()
