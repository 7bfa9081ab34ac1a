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
* :mod:`.hf_export`: the RT-DETR family's one Hugging Face exporter (:class:`HFExport`: each
  ``export_hf_*`` above is one, parametrised by its config, key map and processor);
* :mod:`.hf_processor`: the ``preprocessor_config.json`` each export writes (transformers' pipeline);
* :mod:`.hf`: :func:`from_hf`, a folder of any of these kinds by its ``model_type``.

Key maps are rows of :mod:`peg_core.interop.keymap` (one mechanism, read both ways): each format
module holds its table (:data:`~.hf_detr.DETR_KEYS`, :data:`~.hf_hgnetv2.HGNETV2_KEYS`,
:data:`~.hf_rtdetr.RTDETR_KEYS`, :data:`~.hf_dfine.DFINE_KEYS`,
:data:`~.hf_deimv2.DEIMV2_KEYS`, :data:`~.hf_rfdetr.RFDETR_FILE_KEYS` / ``RFDETR_MODULE_KEYS``).
The package exports every name of its modules' ``__all__``.

Library below the application: these modules import :mod:`peg_detr.models` and :mod:`peg_core`,
never ``peg_detr.model`` / ``task`` / ``cli``; export functions take a model (the command line
loads the checkpoint).  Loaders return ``(model, LoadReport)``, or a :class:`LoadReport` when they
fill a given model.  Errors are :class:`~peg_core.interop.WeightsError` (a file that does not fit,
named) and ``ValueError`` / ``TypeError`` (a model a format cannot hold).
"""

from peg_core.interop.io import LoadReport as LoadReport  # re-exported

from . import hf, hf_deimv2, hf_detr, hf_dfine, hf_export, hf_rfdetr, hf_rtdetr, official
from .hf import *  # noqa: F403
from .hf_deimv2 import *  # noqa: F403
from .hf_detr import *  # noqa: F403
from .hf_dfine import *  # noqa: F403
from .hf_export import *  # noqa: F403
from .hf_rfdetr import *  # noqa: F403
from .hf_rtdetr import *  # noqa: F403
from .official import *  # noqa: F403

# every public name of the format modules, each declared once in its own module's ``__all__``
__all__ = sorted(
    {"LoadReport"}.union(
        *(m.__all__ for m in (hf, hf_deimv2, hf_detr, hf_dfine, hf_export, hf_rfdetr, hf_rtdetr, official))
    )
)
