"""Transformer building blocks in the DeiT/timm parameter layout (pure torch).

Parameter names follow timm's ``VisionTransformer`` (``norm1``, ``attn.qkv``,
``attn.proj``, ``norm2``, ``mlp.fc1``, ``mlp.fc2``) so DeiT state dicts map
onto them one to one.  Tokens stay ``(B, N, C)`` throughout.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..rope import apply_rope

__all__ = [
    "Attention",
    "Block",
    "DropPath",
    "LayerScale",
    "Mlp",
    "PatchEmbed",
    "drop_path",
    "init_vit_weights",
    "vit_lr_layer_id",
]

#: first name components of the parameters before block 0 (layer 0 of layer-wise lr decay)
EMBEDDING_ROOTS = ("patch_embed", "cls_token", "reg_token", "pos_enc", "rope", "attn_bias")
#: first name components of the parameters after the last block (layer ``depth + 1``)
HEAD_ROOTS = ("norm", "fc_norm", "pool", "head")


def drop_path(x: Tensor, p: float, training: bool) -> Tensor:
    """Stochastic depth: zero whole samples of a residual branch with probability ``p``, rescale the rest."""
    if p == 0.0 or not training:
        return x
    keep = 1.0 - p
    mask = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(keep)
    return x * mask / keep


class DropPath(nn.Module):
    """Module form of :func:`drop_path`."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return drop_path(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class PatchEmbed(nn.Module):
    """Non-overlapping ``patch×patch`` conv: image ``(B, 3, H, W)`` -> tokens ``(B, H/p * W/p, C)``.

    ``H`` and ``W`` must be multiples of ``patch_size``; the model pads before
    calling this (see :class:`peg_core.models.CPVT`).
    """

    def __init__(self, patch_size: int = 16, in_chans: int = 3, embed_dim: int = 768) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv2d(in_chans, embed_dim, patch_size, stride=patch_size)

    def forward(self, x: Tensor) -> tuple[Tensor, tuple[int, int]]:
        x = self.proj(x)  # (B, C, H/p, W/p)
        size = (x.shape[-2], x.shape[-1])
        return x.flatten(2).transpose(1, 2), size


class Attention(nn.Module):
    """Multi-head self-attention with a fused ``qkv`` projection and ``F.scaled_dot_product_attention``.

    ``forward(x, rope=None, attn_mask=None)``: tokens ``(B, N, C)`` -> ``(B, N, C)``.  ``rope`` is an
    apply-form ``(sin, cos)`` table from :class:`peg_core.rope.RotaryEmbedding` (``(N, D)``,
    ``(B, 1, N, D)`` or ``(heads, N, D)``, ``D = C / heads``, prefix rows included): queries and
    keys are rotated, values are not.  ``rope_half`` is the table's pair layout (DINOv3: True).
    ``attn_mask`` goes to SDPA (bool: True = attend; float: added to the logits, e.g. an attention bias
    ``(1|B, heads, N, N)`` from :class:`peg_core.bias.AttentionBias`, cast to the queries' dtype
    as SDPA requires, e.g. under autocast).  No parameters are added: the state-dict
    keys stay ``qkv.{weight,bias}``, ``proj.{weight,bias}``.

    ``probe`` (class attribute, normally None): a callable ``(module, q, k, attn_mask)`` that sees
    every attention's rotated queries and keys, set by :func:`peg_core.models.probe.attention_probe`.
    """

    probe: ClassVar[Callable[..., None] | None] = None

    def __init__(
        self,
        dim: int,
        num_heads: int,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        *,
        rope_half: bool = False,
    ) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"embed_dim={dim} must be divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.attn_drop = attn_drop
        self.rope_half = rope_half
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(
        self, x: Tensor, rope: tuple[Tensor, Tensor] | None = None, attn_mask: Tensor | None = None
    ) -> Tensor:
        b, n, c = x.shape
        # (B, N, 3C) -> (3, B, heads, N, C/heads)
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, c // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        if rope is not None:
            sin, cos = rope
            q = apply_rope(q, sin, cos, half=self.rope_half)
            k = apply_rope(k, sin, cos, half=self.rope_half)
        if attn_mask is not None and attn_mask.is_floating_point() and attn_mask.dtype != q.dtype:
            attn_mask = attn_mask.to(q.dtype)
        probe = type(self).probe  # diagnostics only (peg_core.models.probe): None in training and export
        if probe is not None:
            probe(self, q, k, attn_mask)
        p = self.attn_drop if self.training else 0.0
        x = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p)
        return self.proj(x.transpose(1, 2).reshape(b, n, c))


class Mlp(nn.Module):
    """``fc1 -> GELU -> fc2``."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(x)))


class LayerScale(nn.Module):
    """Per-channel scale of a residual branch (CaiT / timm ``ls1``, ``ls2``): ``x * gamma``; key ``gamma``."""

    def __init__(self, dim: int, init_values: float = 1e-5) -> None:
        super().__init__()
        self.init_values = init_values
        self.gamma = nn.Parameter(torch.full((dim,), float(init_values)))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gamma


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(norm1(x))`` then ``x + mlp(norm2(x))``; ``(B, N, C)`` in and out.

    ``init_values`` adds layer scale (``ls1.gamma``, ``ls2.gamma`` as in timm; none by default, so
    the keys of a plain block are unchanged).  ``forward(x, rope=None, attn_mask=None)`` passes the
    rotary table and mask to :class:`Attention`.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        drop_path: float = 0.0,
        norm_eps: float = 1e-6,
        *,
        init_values: float | None = None,
        rope_half: bool = False,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = Attention(dim, num_heads, qkv_bias=qkv_bias, rope_half=rope_half)
        self.ls1 = LayerScale(dim, init_values) if init_values is not None else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.ls2 = LayerScale(dim, init_values) if init_values is not None else nn.Identity()
        self.drop_path = DropPath(drop_path)

    def forward(
        self, x: Tensor, rope: tuple[Tensor, Tensor] | None = None, attn_mask: Tensor | None = None
    ) -> Tensor:
        x = x + self.drop_path(self.ls1(self.attn(self.norm1(x), rope, attn_mask)))
        return x + self.drop_path(self.ls2(self.mlp(self.norm2(x))))


def _init_weights(m: nn.Module) -> None:
    """timm's ViT init: trunc-normal(0.02) linears with zero bias, unit LayerNorms."""
    if isinstance(m, nn.Linear):
        nn.init.trunc_normal_(m.weight, std=0.02)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, nn.LayerNorm):
        nn.init.ones_(m.weight)
        nn.init.zeros_(m.bias)


@torch.no_grad()
def init_vit_weights(model: nn.Module) -> None:
    """Apply :func:`_init_weights` to every submodule of ``model``."""
    model.apply(_init_weights)


def vit_lr_layer_id(name: str, depth: int) -> int:
    """The layer of a parameter of a ViT in this layout, as layer-wise lr decay counts them.

    ``0``: the embeddings (:data:`EMBEDDING_ROOTS`, a PEG before block 0, ``pos_blocks.-1``);
    ``i + 1``: ``blocks.<i>`` and the PEG after it (``pos_blocks.<i>``); ``depth + 1``: the final
    norm, the pooling and the head (:data:`HEAD_ROOTS`).  Any other name is a ``ValueError``: a
    new parameter must be placed on purpose, not fall into some layer by accident.
    """
    root, _, rest = name.partition(".")
    if root in ("blocks", "pos_blocks"):
        index = int(rest.partition(".")[0])
        return index + 1  # pos_blocks.-1 (before block 0) -> 0
    if root in EMBEDDING_ROOTS:
        return 0
    if root in HEAD_ROOTS:
        return depth + 1
    raise ValueError(f"no layer-wise lr decay layer for parameter {name!r} (depth {depth})")
