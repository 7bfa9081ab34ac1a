"""Attentive pooling: learned query tokens read the clip's tokens by cross-attention (V-JEPA 2's classifier head).

``tokens (B, N, C) -> blocks.0 .. blocks.{L-1} (self-attention over the tokens)
-> cross (the query attends over the tokens) -> (B, C)``.

The self-attention layers are plain pre-norm transformer blocks
(:class:`peg_core.models.layers.Block`, no position information: the tokens already carry it).
The cross-attention layer normalises the tokens only: the query enters the attention as it is
and is also the residual, and the attention has no output projection (V-JEPA 2's layout, which
its published classifiers were trained with).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from peg_core.models.layers import Block, Mlp

__all__ = ["AttentivePool", "CrossAttentionBlock"]


class CrossAttentionBlock(nn.Module):
    """Queries ``(B, Q, C)`` attend over tokens ``(B, N, C)``; then a pre-norm MLP.  ``-> (B, Q, C)``.

    ``q = q_proj(query)``, ``(k, v) = kv(norm1(tokens))``; ``x = query + attention(q, k, v)``
    (heads of ``C / num_heads`` channels, no output projection); ``x + mlp(norm2(x))``.
    Keys: ``norm1``, ``q``, ``kv`` (the key and value projections fused, key rows first),
    ``norm2``, ``mlp.fc1``, ``mlp.fc2``.
    """

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0, norm_eps: float = 1e-6) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"embed_dim={dim} must be divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def _heads(self, x: Tensor) -> Tensor:
        """``(B, L, C) -> (B, heads, L, C / heads)``."""
        b, n, c = x.shape
        return x.reshape(b, n, self.num_heads, c // self.num_heads).transpose(1, 2)

    def forward(self, query: Tensor, tokens: Tensor) -> Tensor:
        b, q_len, c = query.shape
        k, v = self.kv(self.norm1(tokens)).chunk(2, dim=-1)
        out = F.scaled_dot_product_attention(self._heads(self.q(query)), self._heads(k), self._heads(v))
        x = query + out.transpose(1, 2).reshape(b, q_len, c)
        return x + self.mlp(self.norm2(x))


class AttentivePool(nn.Module):
    """``depth`` self-attention blocks over the tokens, then one learned query reads them: ``(B, N, C) -> (B, C)``.

    Keys: ``query`` ``(1, 1, C)``, ``blocks.{i}.*`` (:class:`~peg_core.models.layers.Block`),
    ``cross.*`` (:class:`CrossAttentionBlock`).  Any number of tokens runs (nothing is sized by
    the clip), so the pool follows the encoder to any clip length and crop.
    """

    def __init__(
        self, dim: int, num_heads: int, depth: int = 1, mlp_ratio: float = 4.0, norm_eps: float = 1e-6
    ) -> None:
        super().__init__()
        if depth < 0:
            raise ValueError(f"the attentive pool's depth must be >= 0; got {depth}")
        self.query = nn.Parameter(torch.zeros(1, 1, dim))  # trunc-normal by the model's init
        self.blocks = nn.ModuleList(Block(dim, num_heads, mlp_ratio, norm_eps=norm_eps) for _ in range(depth))
        self.cross = CrossAttentionBlock(dim, num_heads, mlp_ratio, norm_eps)

    def forward(self, tokens: Tensor) -> Tensor:
        for blk in self.blocks:
            tokens = blk(tokens)
        return self.cross(self.query.expand(tokens.shape[0], -1, -1), tokens).squeeze(1)
