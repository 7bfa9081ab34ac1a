"""Reference classifiers: CPVT (a DeiT-layout ViT with PEG) in pure torch.

Example::

    >>> from peg_core.models import cpvt_tiny
    >>> model = cpvt_tiny(num_classes=1000)  # PEG after block 0, GAP head
"""

from .cpvt import CPVT, cpvt_base, cpvt_small, cpvt_tiny
from .layers import Attention, Block, DropPath, Mlp, PatchEmbed
from .load import load_timm_deit

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
    "load_timm_deit",
]
