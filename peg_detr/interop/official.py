"""Loading official DETR checkpoints (``detr-r50-e632da11.pth`` style) into a ``peg_detr`` model.

The official files are ``{"model": state_dict, "args": argparse.Namespace, ...}``.
They are read with ``torch.load(weights_only=True)`` and an allow-list that
admits ``argparse.Namespace`` and nothing else; a file that pickles anything else is
refused, never unpickled (no file runs code: there is no ``weights_only=False`` path).

Key rules: a ``module.`` prefix (DataParallel) is stripped; PEG weights the
file lacks are reported and set to zero, so a ``peg`` model loaded from a
``sine``/``none`` checkpoint starts out computing exactly what the ``none``
encoder computes; ``class_embed.*`` is dropped with a message when the class
count differs (fine-tuning on another data set); any other missing or
unexpected key, or any shape mismatch, is an error that lists the keys.

Hugging Face DETR weights (a ``save_pretrained`` folder or its weights file)
are read too: their keys are renamed to the official ones by :mod:`peg_detr.interop.hf_detr`.

The file is read by :func:`peg_core.interop.read_state_file` and the state dict found by
:func:`peg_core.interop.unwrap_state_dict` / :func:`~peg_core.interop.strip_prefixes`.
Every problem with the file (missing, empty, truncated, not a torch file, refused pickle,
keys that do not fit) is a :class:`~peg_core.interop.WeightsError` (a ``ValueError``)
naming it; the command line prints it as one ``error:`` line.
"""

from __future__ import annotations

import argparse
import os
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from peg_core import PEG2d
from peg_core.dist import is_main_process
from peg_core.interop.io import LoadReport, WeightsError, read_state_file, strip_prefixes, unwrap_state_dict

from .hf_detr import hf_to_official, is_hf_source, looks_like_hf, read_hf_state

__all__ = ["SAFE_GLOBALS", "load_official_checkpoint", "read_official_checkpoint"]

#: Classes an official checkpoint may pickle besides tensors and containers.
SAFE_GLOBALS = [argparse.Namespace]


def read_official_checkpoint(path: str | os.PathLike) -> tuple[dict[str, Tensor], dict[str, Any] | None]:
    """Read ``path`` -> ``(state_dict with "module." stripped, args as a dict or None)``."""
    path = Path(path)
    what = "pretrained checkpoint"
    try:
        with torch.serialization.safe_globals(SAFE_GLOBALS):
            obj = read_state_file(path, what=what)
    except WeightsError as e:
        if "refused" not in e.what:
            raise
        raise WeightsError(
            f"{e.what}; only argparse.Namespace is allowed besides tensors: re-save the file's tensors "
            "(torch.save(ckpt['model'], PATH)) where you trust it",
            path,
        ) from None
    if not isinstance(obj, dict):
        raise WeightsError(
            f"{what} is not a dict (a state dict or {{'model': state_dict}}; got {type(obj).__name__})", path
        )
    state = strip_prefixes(unwrap_state_dict(obj, where=path))
    if not all(isinstance(v, Tensor) for v in state.values()):
        raise WeightsError(f"{what}'s 'model' is not a state dict of tensors", path)
    wrapped = not any(isinstance(v, Tensor) for v in obj.values())  # {"model": ..., "args": ...}
    args = obj.get("args") if wrapped else None
    if isinstance(args, argparse.Namespace):
        args = vars(args)
    return state, args if isinstance(args, dict) else None


def _note(line: str) -> None:
    """A fact about the load the caller should see (also in the returned report): a warning, not a print.

    Library code writes nothing to stdout; Python shows each warning once per place, on stderr.
    """
    warnings.warn(line, UserWarning, stacklevel=3)


def _keys(keys: list[str]) -> str:
    return f"{keys[:5]}{f' and {len(keys) - 5} more' if len(keys) > 5 else ''}"


def _peg_keys(model: nn.Module) -> set[str]:
    return {
        f"{name}.{k}" for name, m in model.named_modules() if isinstance(m, PEG2d) for k in m.state_dict()
    }


def load_official_checkpoint(
    model: nn.Module, path: str | os.PathLike, num_classes: int | None = None
) -> LoadReport:
    """Load an official-format DETR checkpoint into ``model`` (a :class:`~peg_detr.models.DETR`).

    Args:
        model: the model (a DDP wrapper is unwrapped).
        path: ``.pth`` file, ``{"model": state_dict, "args": Namespace}`` or a bare state dict; or a
            Hugging Face DETR folder (``config.json`` + ``model.safetensors`` / ``pytorch_model.bin``)
            or either weights file, whose keys are mapped by :func:`~peg_detr.interop.hf_detr.hf_to_official`
            (``LoadReport.args`` is then the folder's ``config.json``).
        num_classes: the class count wanted; default the model's.  When the
            file's differs, ``class_embed.*`` is dropped and keeps its fresh init.

    Returns a :class:`~peg_core.interop.LoadReport`: ``copied`` (loaded keys), ``converted`` (PEG
    weights the file lacks, set to zero), ``skipped`` (``class_embed.*`` of another class count),
    ``args``.  Raises :class:`~peg_core.interop.WeightsError` listing keys on any other mismatch
    (nothing is loaded then).
    """
    model = getattr(model, "module", model)
    if is_hf_source(path):  # a Hugging Face folder / .safetensors / pytorch_model.bin
        state, args = read_hf_state(path)
        state = hf_to_official(state)
        if args and args.get("auxiliary_loss") and is_main_process():
            _note(f"{path}: config.json has auxiliary_loss=true; transformers then layer-norms the decoder input "
                  "between layers and DETR (peg_detr) does not, so outputs differ from that configuration's")  # fmt: skip
    else:
        state, args = read_official_checkpoint(path)
        if looks_like_hf(state):  # a Hugging Face state dict saved under another file name
            state = hf_to_official(state)
    own = model.state_dict()
    model_classes = own["class_embed.weight"].shape[0] - 1
    if num_classes is not None and num_classes != model_classes:
        raise WeightsError(
            f"num_classes={num_classes} but the model was built with {model_classes} classes", path
        )
    report = LoadReport(source=str(path), args=args)

    head = state.get("class_embed.weight")
    if head is not None and head.dim() != 2:  # its rows give the class count
        raise WeightsError(
            f"key class_embed.weight has shape {tuple(head.shape)}: expected (num_classes + 1, hidden_dim)",
            path,
        )
    file_classes = head.shape[0] - 1 if head is not None else None
    dropped: list[str] = []
    if file_classes is not None and file_classes != model_classes:
        dropped = sorted(k for k in state if k.startswith("class_embed."))
        why = f"the file has {file_classes} classes, the model {model_classes} (fresh initialisation)"
        report.skipped.update(dict.fromkeys(dropped, why))
        state = {k: v for k, v in state.items() if not k.startswith("class_embed.")}
        if is_main_process():
            _note(f"{path}: checkpoint has {file_classes} classes, the model {model_classes}: "
                  f"dropping {dropped} (fresh initialisation)")  # fmt: skip
    # BatchNorm bookkeeping has no meaning for frozen/eval BN and is absent from FrozenBatchNorm2d.
    state = {k: v for k, v in state.items() if k in own or not k.endswith("num_batches_tracked")}

    peg = _peg_keys(model)
    missing = sorted(own.keys() - state.keys())
    unexpected = sorted(state.keys() - own.keys())
    missing_other = [k for k in missing if k not in peg and k not in dropped]
    wrong_shape = [
        f"{k}: file {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
        for k in sorted(state.keys() & own.keys())
        if state[k].shape != own[k].shape
    ]
    if missing_other or unexpected or wrong_shape:
        raise WeightsError(
            f"pretrained checkpoint does not fit the model (missing keys: {_keys(missing_other)}; unexpected keys: "
            f"{_keys(unexpected)}; shape mismatches: {_keys(wrong_shape)})",
            path,
        )
    model.load_state_dict(state, strict=False)
    report.copied = sorted(state)
    report.missing = dropped  # class_embed.* keep their fresh initialisation
    peg_zero_init = [k for k in missing if k in peg]
    if peg_zero_init:
        params = dict(model.named_parameters())
        with torch.no_grad():
            for k in peg_zero_init:
                params[k].zero_()
        report.converted.update(dict.fromkeys(peg_zero_init, "zeros: no PEG weights in the file"))
        if is_main_process():
            _note(f"{path}: no PEG weights in the file; {peg_zero_init} start at zero")
    return report
