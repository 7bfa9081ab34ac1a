"""A local Hugging Face model folder (what ``save_pretrained`` or a hub snapshot holds), read safely.

``config.json`` is parsed as JSON (nothing runs); the weights are ``model.safetensors`` or
``pytorch_model.bin`` (read by :func:`~peg_core.interop.io.read_state_file`, torch files with
``weights_only=True``), or the shards a ``*.index.json`` lists.  The task packages
(``peg_detr.from_hf``: DETR, RT-DETR; ``peg_video.from_hf``: VideoMAE, TimeSformer, V-JEPA 2) map the
names; this module only reads.  Every problem is a :class:`~peg_core.interop.io.WeightsError` naming
the folder or file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from torch import Tensor

from .io import WeightsError, read_state_file

__all__ = ["HF_WEIGHT_FILES", "read_hf_config", "read_hf_weights", "read_json_object"]

#: the weights of a ``save_pretrained`` folder, in the order they are looked for (safetensors first:
#: reading it unpickles nothing)
HF_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def read_json_object(path: str | os.PathLike, what: str) -> dict[str, Any]:
    """The JSON object in ``path``; unreadable or malformed JSON, or a non-object, is a :class:`WeightsError`."""
    try:
        obj = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise WeightsError(f"{what} is not valid json ({type(e).__name__}: {e})", path) from None
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
