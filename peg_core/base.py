"""The interface every position encoding in the suite implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from torch import Tensor, nn

__all__ = ["APPLY_TO", "PositionEncoding"]

APPLY_TO = ("tokens", "qk", "none")


class PositionEncoding(nn.Module, ABC):
    """Base class: position codes for a token grid, and where they go.

    Every encoding answers two calls with the same arguments:

    * ``position(x, size, mask)`` -> the codes, a tensor broadcastable to ``x``
      (``(B, N, C)`` or ``(1, N, C)``, zeros at prefix tokens), or ``None``
      when the encoding has none;
    * ``forward(x, size, mask)`` -> ``x`` with the codes added (what a model
      does when :attr:`apply_to` is ``"tokens"``).

    :attr:`apply_to` states how a model should use the encoding:

    * ``"tokens"``: add to the token stream once (ViT style; PEG always);
    * ``"qk"``: add only to attention queries and keys at every layer
      (DETR style), the values and the residual stream stay position-free;
    * ``"none"``: no position information at all.

    ``x`` is ``(B, P + H*W, C)`` with ``P = num_prefix_tokens`` and ``size``
    the grid ``(H, W)``; ``mask`` is ``(B, H, W)`` bool, True at padding.
    """

    apply_to: str = "tokens"
    #: whether the codes depend on the token values (PEG) or only on the grid
    conditional: ClassVar[bool] = False
    num_prefix_tokens: int = 0

    def _set_apply_to(self, apply_to: str) -> None:
        if apply_to not in APPLY_TO:
            raise ValueError(f"apply_to must be one of {APPLY_TO}; got {apply_to!r}")
        self.apply_to = apply_to

    @abstractmethod
    def position(self, x: Tensor, size: tuple[int, ...], mask: Tensor | None = None) -> Tensor | None:
        """Codes for tokens ``x`` ``(B, P + H*W, C)`` on grid ``size``; ``None`` when there are none."""

    def forward(self, x: Tensor, size: tuple[int, ...], mask: Tensor | None = None) -> Tensor:
        """``x`` with the codes added (same shape as ``x``)."""
        pos = self.position(x, size, mask)
        return x if pos is None else x + pos
