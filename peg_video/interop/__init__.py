"""Every outside format peg_video reads or writes, one module each.

* :mod:`.hf`: Hugging Face VideoMAE, TimeSformer and V-JEPA 2 folders: :func:`from_hf` (a folder ->
  ``(model, LoadReport)``), :func:`hf_model_config`, :func:`read_hf_video_config`, and
  :func:`export_hf` (a model -> a VideoMAE-layout folder);
* :mod:`.inflate`: 2-D -> 3-D inflation: :func:`load_2d_checkpoint` (peg_core's CPVT or a timm
  DeiT checkpoint into a video transformer, a :class:`LoadReport`), :func:`inflate_peg2d`,
  :func:`inflate_patch_embed`.

Library below the application: these modules import :mod:`peg_video.models` and :mod:`peg_core`,
never ``peg_video.model`` / ``task`` / ``cli``; export functions take a model (the command line
loads the checkpoint).  Loaders return ``(model, LoadReport)``, or a :class:`LoadReport` when they
fill a given model.  Errors are :class:`~peg_core.interop.WeightsError` (a file that does not fit,
named; :class:`Init2dError` for a 2-D checkpoint) and ``ValueError`` / ``TypeError`` (a model a
format cannot hold).
"""

from peg_core.interop.io import LoadReport

from .hf import HF_MODEL_TYPES, export_hf, from_hf, hf_model_config, read_hf_video_config
from .inflate import Init2dError, inflate_patch_embed, inflate_peg2d, load_2d_checkpoint

__all__ = [
    "HF_MODEL_TYPES",
    "Init2dError",
    "LoadReport",
    "export_hf",
    "from_hf",
    "hf_model_config",
    "inflate_patch_embed",
    "inflate_peg2d",
    "load_2d_checkpoint",
    "read_hf_video_config",
]
