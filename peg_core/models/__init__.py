"""Reference classifiers: CPVT (a DeiT-layout ViT with PEG) in pure torch.

Example::

    >>> from peg_core.models import cpvt_tiny
    >>> model = cpvt_tiny(num_classes=1000)  # PEG after block 0, GAP head

Outside weights (timm / DeiT / torchvision checkpoints) are read by :mod:`peg_core.interop`
(:func:`peg_core.interop.load_timm_deit`); nothing here imports it.
"""

from .cpvt import CPVT, cpvt_base, cpvt_small, cpvt_tiny
from .layers import Attention, Block, DropPath, Mlp, PatchEmbed

__all__ = [
    "CPVT",
    "Attention",
    "Block",
    "DropPath",
    "Mlp",
    "PatchEmbed",
    "cpvt_base",
    "cpvt_small",
    "cpvt_tiny",
]
