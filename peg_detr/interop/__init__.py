"""Every outside weights format peg_detr reads or writes, one module each.

* :mod:`.official`: official DETR checkpoints (``detr-r50-e632da11.pth``): :func:`load_official_checkpoint`
  (also a Hugging Face DETR folder or weights file), :func:`read_official_checkpoint`;
* :mod:`.hf_detr`: Hugging Face ``DetrForObjectDetection``: the key map (:func:`hf_to_official` /
  :func:`official_to_hf`), ``config.json`` <-> :func:`~peg_detr.models.build_detr` keywords, and
  :func:`export_hf_detr` (a model -> a folder);
* :mod:`.hf_rtdetr`: Hugging Face ``RTDetrForObjectDetection``: the one config <-> keyword mapping
  (:func:`rtdetr_build_options` / :func:`rtdetr_hf_config`), the key map, :func:`rtdetr_from_hf`,
  :func:`export_hf_rtdetr`, :func:`load_rtdetr_backbone` (a folder's ResNet-vd alone);
* :mod:`.hf_dfine`: Hugging Face ``DFineForObjectDetection``: :func:`dfine_from_hf`,
  :func:`export_hf_dfine`, the config reader and key map (shared with its successors);
* :mod:`.hf_rfdetr`: Hugging Face ``RfDetrForObjectDetection``: the declarative key map, the config
  read from :class:`~peg_detr.models.rfdetr.RFDETRConfig`'s declarations, :func:`rfdetr_from_hf`,
  :func:`export_hf_rfdetr`;
* :mod:`.hf_processor`: the ``preprocessor_config.json`` each export writes (transformers' pipeline);
* :mod:`.hf`: :func:`from_hf`, a folder of any of these kinds by its ``model_type``.

Library below the application: these modules import :mod:`peg_detr.models` and :mod:`peg_core`,
never ``peg_detr.model`` / ``task`` / ``cli``; export functions take a model (the command line
loads the checkpoint).  Loaders return ``(model, LoadReport)``, or a :class:`LoadReport` when they
fill a given model.  Errors are :class:`~peg_core.interop.WeightsError` (a file that does not fit,
named) and ``ValueError`` / ``TypeError`` (a model a format cannot hold).
"""

from peg_core.interop.io import LoadReport

from .hf import FROM_HF, SUPPORTED_MODEL_TYPES, detr_from_hf, from_hf
from .hf_deimv2 import deimv2_from_hf, deimv2_from_hf_config, deimv2_hf_config, export_hf_deimv2
from .hf_detr import (
    HF_DETR_BACKBONES,
    HF_RESNETS,
    check_detr_config,
    detr_build_options,
    detr_hf_config,
    export_hf_detr,
    hf_label_names,
    hf_num_labels,
    hf_resnet_to_official,
    hf_to_official,
    is_hf_source,
    looks_like_hf,
    official_to_hf,
    read_hf_state,
)
from .hf_dfine import dfine_from_hf, dfine_from_hf_config, dfine_hf_config, export_hf_dfine
from .hf_rfdetr import export_hf_rfdetr, rfdetr_from_hf, rfdetr_from_hf_config, rfdetr_hf_config
from .hf_rtdetr import (
    DECODER_PREFIXES,
    ENCODER_HF_PREFIXES,
    decoder_key_from_hf,
    decoder_key_to_hf,
    encoder_hf_config,
    encoder_hf_keys,
    encoder_hf_to_ours,
    encoder_ours_to_hf,
    export_hf_rtdetr,
    load_rtdetr_backbone,
    rtdetr_build_options,
    rtdetr_from_hf,
    rtdetr_from_hf_config,
    rtdetr_hf_config,
    rtdetr_hf_to_ours,
    rtdetr_ours_to_hf,
)
from .official import load_official_checkpoint, read_official_checkpoint

__all__ = [
    "DECODER_PREFIXES",
    "ENCODER_HF_PREFIXES",
    "FROM_HF",
    "HF_DETR_BACKBONES",
    "HF_RESNETS",
    "SUPPORTED_MODEL_TYPES",
    "LoadReport",
    "check_detr_config",
    "decoder_key_from_hf",
    "decoder_key_to_hf",
    "deimv2_from_hf",
    "deimv2_from_hf_config",
    "deimv2_hf_config",
    "detr_build_options",
    "detr_from_hf",
    "detr_hf_config",
    "dfine_from_hf",
    "dfine_from_hf_config",
    "dfine_hf_config",
    "encoder_hf_config",
    "encoder_hf_keys",
    "encoder_hf_to_ours",
    "encoder_ours_to_hf",
    "export_hf_deimv2",
    "export_hf_detr",
    "export_hf_dfine",
    "export_hf_rfdetr",
    "export_hf_rtdetr",
    "from_hf",
    "hf_label_names",
    "hf_num_labels",
    "hf_resnet_to_official",
    "hf_to_official",
    "is_hf_source",
    "load_official_checkpoint",
    "load_rtdetr_backbone",
    "looks_like_hf",
    "official_to_hf",
    "read_hf_state",
    "read_official_checkpoint",
    "rfdetr_from_hf",
    "rfdetr_from_hf_config",
    "rfdetr_hf_config",
    "rtdetr_build_options",
    "rtdetr_from_hf",
    "rtdetr_from_hf_config",
    "rtdetr_hf_config",
    "rtdetr_hf_to_ours",
    "rtdetr_ours_to_hf",
]
