"""Weights in and out of other code: the one file reader/writer, checkpoint surgery, live conversion.

Opt-in (``import peg_core`` does not load it); torch-only on import.  safetensors is
imported when a ``.safetensors`` file is used, timm by ``import peg_core.interop.timm``.

* :mod:`.io`: :func:`read_state_file` / :func:`write_state_file` (``.pth`` with
  ``weights_only=True``, ``.safetensors``), :func:`unwrap_state_dict`, :func:`strip_prefixes`,
  the one :class:`LoadReport` and :class:`WeightsError`;
* :mod:`.classes`: a start's classes carried over to another label set by name
  (:func:`match_classes`, :func:`transfer_class_rows`);
* :mod:`.surgery`: resize the position table of a ViT checkpoint, or turn it into a CPVT one;
* :mod:`.convert`: turn a live timm / torchvision ViT into a CPVT (PEGs instead of its table);
* :mod:`.deit`: :func:`load_timm_deit`, a timm DeiT / ViT (or torchvision ViT) state dict into a CPVT;
* :mod:`.from_timm`: today's timm backbones (DeiT / ViT, the rope ViTs, DINOv3) as a CPVT, same outputs;
* :mod:`.hf_folder`: a local Hugging Face folder's `config.json` and weights (one file or shards), read safely;
  :class:`ConfigFields` checks its fields one by one (type, range, against the weights);
* :mod:`.resolve`: :func:`resolve_weights`, where named weights lie on disk: a local path, a Hugging
  Face id ``org/name[@rev]``, ``timm:NAME`` or ``torchvision:model.ENUM`` (fetched once into their caches);
* :mod:`.timm` (needs timm): this project's CPVT in timm's model registry.

Errors: library functions here raise :class:`WeightsError` (a ``ValueError``) or
``TypeError`` with a message naming the file, key or shape; never the command line's
``UserError``.
"""

from .classes import (
    ClassParam,
    ClassTransfer,
    carry_classes,
    class_key,
    match_classes,
    read_class_map,
    transfer_class_rows,
)
from .convert import convert_to_cpvt
from .deit import load_timm_deit
from .from_timm import from_timm, from_timm_file
from .hf_folder import HF_WEIGHT_FILES, ConfigFields, read_hf_config, read_hf_weights, read_json_object
from .io import (
    LoadReport,
    WeightsError,
    atomic_save,
    load_state_strict,
    locate_state_dict,
    read_state_file,
    strip_prefixes,
    unwrap_state_dict,
    write_state_file,
)
from .resolve import ResolvedWeights, resolve_weights
from .surgery import (
    ConversionReport,
    TableChange,
    find_pos_embed_key,
    is_torchvision_vit,
    learned_to_cpvt,
    resize_checkpoint,
    torchvision_vit_to_deit,
)

__all__ = [
    "HF_WEIGHT_FILES",
    "ClassParam",
    "ClassTransfer",
    "ConfigFields",
    "ConversionReport",
    "LoadReport",
    "ResolvedWeights",
    "TableChange",
    "WeightsError",
    "atomic_save",
    "carry_classes",
    "class_key",
    "convert_to_cpvt",
    "find_pos_embed_key",
    "from_timm",
    "from_timm_file",
    "is_torchvision_vit",
    "learned_to_cpvt",
    "load_state_strict",
    "load_timm_deit",
    "locate_state_dict",
    "match_classes",
    "read_class_map",
    "read_hf_config",
    "read_hf_weights",
    "read_json_object",
    "read_state_file",
    "resize_checkpoint",
    "resolve_weights",
    "strip_prefixes",
    "torchvision_vit_to_deit",
    "transfer_class_rows",
    "unwrap_state_dict",
    "write_state_file",
]
