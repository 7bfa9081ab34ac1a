"""A ViT for video clips whose position information comes from a space-time PEG (or a named alternative).

Layout (DeiT/timm parameter names, as :class:`peg_core.models.CPVT`, so 2D
checkpoints map onto it key for key)::

    clip (B, 3, T, H, W) -> patch_embed.proj (Conv3d, tubelet t×p×p, stride = tubelet)
      -> tokens (B, T'*H'*W', C), frame-major [+ cls_token in front for global_pool="token"]
      -> [pos_enc ("learned", "sincos"): added once here]
      -> [rope ("rope-3d"): one (sin, cos) table per forward, q and k rotated in every attention]
      -> [pos_blocks.-1] -> blocks.0 -> [pos_blocks.0 (PEG3d)] -> blocks.1 -> ... -> blocks.{depth-1}
      -> [pos_blocks.{depth-1}] -> norm -> pool ("avg": mean of the grid tokens; "token": the class token) -> head

Tokens stay ``(B, N, C)`` from end to end; a PEG3d views them as a
channels-last-3d grid without copying.

``rope-3d`` (V-JEPA 2's 3-D RoPE, :func:`peg_core.rope.build_rope`): the head's rotary pairs
are split into three sections rotated by the tubelet's integer ``t``, ``h`` and ``w`` indices
(base 10000; pairs left over are not rotated); the class token is not rotated.  The table is
built from the input's grid on every forward, so any clip length and crop runs.  In divided
attention the temporal attention rotates by ``t`` (its table is the grid ``(T, 1, 1)``: the
``h`` / ``w`` sections are the identity) and the spatial attention by ``(h, w)`` (grid
``(1, H, W)``), which are exactly the offsets each attention sees.  ``peg3d+rope-3d`` adds the
PEG3d of ``peg3d`` as well.  No state-dict key is added (the frequencies are not persistent).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from peg_core import check_tokens
from peg_core.encodings import LearnedPositionEncoding3d, SinCosPositionEncoding3d
from peg_core.models.layers import Attention, Block, init_vit_weights
from peg_core.peg import resolve_peg_at
from peg_core.rope import build_rope

from ..peg3d import PEG3d

__all__ = ["ATTENTIONS", "POS_ENCODINGS", "DividedBlock", "TubeletEmbed", "VideoTransformer"]

POS_ENCODINGS = ("peg3d", "peg3d-factorized", "learned", "sincos", "none", "rope-3d", "peg3d+rope-3d")
ATTENTIONS = ("joint", "divided")
GLOBAL_POOLS = ("avg", "token")


def _triple(x: int | Sequence[int]) -> tuple[int, int, int]:
    return (int(x),) * 3 if isinstance(x, int) else tuple(int(s) for s in x)


class TubeletEmbed(nn.Module):
    """Non-overlapping ``t×p×p`` Conv3d: clip ``(B, 3, T, H, W)`` -> tokens ``(B, T/t * H/p * W/p, C)``."""

    def __init__(self, tubelet: Sequence[int] = (2, 16, 16), in_chans: int = 3, embed_dim: int = 768) -> None:
        super().__init__()
        self.tubelet = _triple(tubelet)
        self.in_chans = in_chans
        self.proj = nn.Conv3d(in_chans, embed_dim, self.tubelet, stride=self.tubelet)

    def forward(self, x: Tensor) -> tuple[Tensor, tuple[int, int, int]]:
        if x.dim() != 5 or x.shape[1] != self.in_chans:
            raise ValueError(f"expected clips (B, {self.in_chans}, T, H, W); got shape {tuple(x.shape)}")
        bad = [(n, s, k) for n, s, k in zip("THW", x.shape[2:], self.tubelet) if s % k]
        if bad:
            raise ValueError(
                f"clip of shape {tuple(x.shape)} does not split into tubelets {self.tubelet}: "
                + ", ".join(f"{n}={s} is not a multiple of {k}" for n, s, k in bad)
            )
        x = self.proj(x)  # (B, C, T', H', W')
        size = (x.shape[2], x.shape[3], x.shape[4])
        return x.flatten(2).transpose(1, 2), size


class DividedBlock(Block):
    """TimeSformer's divided space-time block: temporal attention, then spatial attention, then the MLP.

    ``norm1``/``attn`` (the spatial attention), ``norm2``/``mlp`` keep the
    DeiT names; the temporal branch adds ``norm_t``/``attn_t``.  Its output
    projection ``attn_t.proj`` starts at zero (:meth:`reset_temporal`), so a
    fresh or 2D-initialised block acts on each frame as the image block does.

    The class token takes no part in temporal attention; in spatial attention
    every frame sees its own copy and the copies' outputs are averaged.
    """

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0, **kwargs) -> None:
        super().__init__(dim, num_heads, mlp_ratio, **kwargs)
        self.norm_t = nn.LayerNorm(dim, eps=self.norm1.eps)
        self.attn_t = Attention(dim, num_heads, qkv_bias=self.attn.qkv.bias is not None)

    @torch.no_grad()
    def reset_temporal(self) -> None:
        """Zero the temporal branch's output projection."""
        nn.init.zeros_(self.attn_t.proj.weight)
        nn.init.zeros_(self.attn_t.proj.bias)

    def forward(
        self,
        x: Tensor,
        size: tuple[int, int, int],
        num_prefix_tokens: int = 0,
        rope: tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]] | None = None,
    ) -> Tensor:
        """``x`` ``(B, P + T*H*W, C)`` frame-major, ``size=(T, H, W)`` -> same shape.

        ``rope``: ``(temporal, spatial)`` apply-form tables, ``(T, D)`` for the temporal attention
        and ``(P + H*W, D)`` for the spatial one (prefix rows: identity), or None.
        """
        rope_t, rope_s = (None, None) if rope is None else rope
        b, _, c = x.shape
        t, hw, p = size[0], size[1] * size[2], num_prefix_tokens
        check_tokens(x, size, p)

        # Temporal: each spatial location attends over its T tubelets, (B*HW, T, C).
        xt = x[:, p:].reshape(b, t, hw, c).transpose(1, 2).reshape(b * hw, t, c)
        xt = self.attn_t(self.norm_t(xt), rope_t).reshape(b, hw, t, c).transpose(1, 2).reshape(b, t * hw, c)
        if p:
            xt = torch.cat([xt.new_zeros(b, p, c), xt], dim=1)
        x = x + self.drop_path(xt)

        # Spatial: each frame attends over its HW tubelets plus a copy of the prefix, (B*T, P + HW, C).
        prefix, tokens = x[:, :p], x[:, p:]
        xs = tokens.reshape(b * t, hw, c)
        if p:
            xs = torch.cat([prefix.unsqueeze(1).expand(b, t, p, c).reshape(b * t, p, c), xs], dim=1)
        xs = self.attn(self.norm1(xs), rope_s)
        delta = xs[:, p:].reshape(b, t * hw, c)
        if p:
            delta = torch.cat([xs[:, :p].reshape(b, t, p, c).mean(1), delta], dim=1)
        x = x + self.drop_path(delta)
        return x + self.drop_path(self.mlp(self.norm2(x)))


class VideoTransformer(nn.Module):
    """Video ViT with a conditional (PEG3d) or other space-time position encoding.

    Args:
        embed_dim, depth, num_heads, mlp_ratio, qkv_bias: transformer size.
        num_classes: classifier outputs (0: no head, :meth:`forward` returns pooled features).
        num_frames, img_size: training clip length and crop; they only size the
            learned tables (any multiple of the tubelet runs).
        tubelet: ``(t, p, p)`` of the Conv3d tubelet embedding.
        pos_enc: ``"peg3d"`` (default), ``"peg3d-factorized"``, ``"learned"``
            (spatial + temporal tables), ``"sincos"`` (fixed), ``"none"``, ``"rope-3d"``
            (3-D rotary q/k, module docstring) or ``"peg3d+rope-3d"`` (both).
        peg_at: block indices after which a PEG3d runs; ``-1`` means before
            block 0 (:func:`peg_core.peg.resolve_peg_at`, the meaning of every
            model of the suite).  Default ``(0,)`` as CPVT; ``"all"`` is
            ``(0, ..., depth-1)``, after every block.  A PEG at the input of
            every block (UniFormer's dynamic position embedding) is
            ``(-1, 0, ..., depth-2)``; checkpoints written when ``"all"`` meant
            that are read as such (:func:`peg_video.model.checkpoint_run`).
        peg_kernel_size: PEG3d kernel, odd int or ``(kT, kH, kW)``.
        peg_padding: PEG3d border, ``"zeros"`` (absolute position from the
            border), ``"circular"`` or ``"replicate"``.
        peg_dynamic: per-clip PEG3d kernels mixed from a bank of
            ``peg_num_kernels`` (default 4); not with ``"peg3d-factorized"``.
        attention: ``"joint"`` space-time attention over all tokens (default) or
            ``"divided"`` (temporal then spatial attention per block, TimeSformer).
        global_pool: ``"avg"`` (mean of the grid tokens; default: the CPVT-GAP
            choice, no class token, works best with PEG) or ``"token"`` (class token).
        drop_path_rate: stochastic depth, increasing linearly over the blocks.
        drop_rate: dropout before the head.
        pos_interpolation: spatial resize mode of the learned table
            (its temporal table is resized linearly).

    Shapes: ``forward`` takes clips ``(B, C, T, H, W)`` with ``T, H, W``
    multiples of the tubelet and returns logits ``(B, num_classes)``.
    """

    def __init__(
        self,
        embed_dim: int = 384,
        depth: int = 12,
        num_heads: int = 6,
        *,
        num_classes: int = 400,
        num_frames: int = 16,
        img_size: int | Sequence[int] = 224,
        tubelet: int | Sequence[int] = (2, 16, 16),
        in_chans: int = 3,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        pos_enc: str = "peg3d",
        peg_at: Sequence[int] | str = (0,),
        peg_kernel_size: int | Sequence[int] = 3,
        peg_padding: str = "zeros",
        peg_dynamic: bool = False,
        peg_num_kernels: int | None = None,
        attention: str = "joint",
        global_pool: str = "avg",
        drop_path_rate: float = 0.0,
        drop_rate: float = 0.0,
        pos_interpolation: str = "bicubic",
    ) -> None:
        super().__init__()
        for name, value, allowed in (
            ("pos_enc", pos_enc, POS_ENCODINGS),
            ("attention", attention, ATTENTIONS),
            ("global_pool", global_pool, GLOBAL_POOLS),
        ):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}; got {value!r}")
        tub = _triple(tubelet)
        hw = (img_size, img_size) if isinstance(img_size, int) else tuple(int(s) for s in img_size)
        sizes = (num_frames, *hw)
        if any(s % k for s, k in zip(sizes, tub)):
            raise ValueError(f"num_frames={num_frames}, img_size={hw} must be multiples of the tubelet {tub}")
        self.embed_dim = embed_dim
        self.num_classes = num_classes
        self.num_frames = num_frames
        self.img_size = hw
        self.tubelet = tub
        self.grid_size = tuple(s // k for s, k in zip(sizes, tub))
        self.pos_enc_kind = pos_enc
        self.attention = attention
        self.global_pool = global_pool
        self.num_prefix_tokens = p = 1 if global_pool == "token" else 0
        if peg_num_kernels is not None and not peg_dynamic:
            raise ValueError(
                "peg_num_kernels sizes the kernel bank of peg_dynamic=True; got peg_dynamic=False"
            )
        self.peg_at = resolve_peg_at(peg_at, depth) if pos_enc.startswith("peg3d") else ()
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim={embed_dim} must be divisible by num_heads={num_heads}")
        self.rope = build_rope("rope-3d", embed_dim // num_heads) if pos_enc.endswith("rope-3d") else None

        self.patch_embed = TubeletEmbed(tub, in_chans, embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if p else None
        self.pos_enc: nn.Module | None = None
        if pos_enc == "learned":
            self.pos_enc = LearnedPositionEncoding3d(
                embed_dim, self.grid_size, num_prefix_tokens=p, interpolation=pos_interpolation
            )
        elif pos_enc == "sincos":
            self.pos_enc = SinCosPositionEncoding3d(embed_dim, num_prefix_tokens=p)
        peg_options = {
            "num_prefix_tokens": p,
            "factorized": pos_enc == "peg3d-factorized",
            "padding_mode": peg_padding,
            "dynamic": peg_dynamic,
            "num_kernels": 4 if peg_num_kernels is None else peg_num_kernels,
        }
        # Keyed by block index as CPVT's pos_blocks, so "pos_blocks.0" inflates from the 2D "pos_blocks.0".
        self.pos_blocks = nn.ModuleDict(
            {str(i): PEG3d(embed_dim, peg_kernel_size, **peg_options) for i in self.peg_at}
        )
        block = DividedBlock if attention == "divided" else Block
        dpr = torch.linspace(0, drop_path_rate, depth).tolist()
        self.blocks = nn.ModuleList(
            [
                block(embed_dim, num_heads, mlp_ratio, qkv_bias=qkv_bias, drop_path=dpr[i])
                for i in range(depth)
            ]
        )
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()

        init_vit_weights(self)
        if self.cls_token is not None:
            nn.init.trunc_normal_(self.cls_token, std=0.02)
        for blk in self.blocks:
            if isinstance(blk, DividedBlock):
                blk.reset_temporal()

    def no_weight_decay(self) -> set[str]:
        """Parameter names conventionally trained without weight decay."""
        return {"cls_token", "pos_enc.spatial", "pos_enc.temporal"}

    def _peg(self, x: Tensor, index: int, size: tuple[int, int, int]) -> Tensor:
        key = str(index)
        return self.pos_blocks[key](x, size) if key in self.pos_blocks else x

    def _rope_tables(self, size: tuple[int, int, int]):
        """The rotary tables of a grid: ``(P + N, D)`` (joint), ``((T, D), (P + H*W, D))`` (divided), or None."""
        if self.rope is None:
            return None
        p = self.num_prefix_tokens
        if self.attention == "divided":
            return self.rope((size[0], 1, 1)), self.rope((1, size[1], size[2]), num_prefix_tokens=p)
        return self.rope(size, num_prefix_tokens=p)

    def forward_features(self, x: Tensor) -> tuple[Tensor, tuple[int, int, int]]:
        """Clip ``(B, C, T, H, W)`` -> (normed tokens ``(B, P + T'*H'*W', C)``, grid ``(T', H', W')``)."""
        x, size = self.patch_embed(x)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        if self.pos_enc is not None:
            x = self.pos_enc(x, size)
        x = self._peg(x, -1, size)
        p = self.num_prefix_tokens
        rope = self._rope_tables(size)
        for i, blk in enumerate(self.blocks):
            x = blk(x, size, p, rope) if isinstance(blk, DividedBlock) else blk(x, rope)
            x = self._peg(x, i, size)
        return self.norm(x), size

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """Tokens ``(B, P + N, C)`` -> logits ``(B, num_classes)`` (or pooled features ``(B, C)``)."""
        x = x[:, 0] if self.global_pool == "token" else x[:, self.num_prefix_tokens :].mean(1)
        return x if pre_logits else self.head(self.head_drop(x))

    def forward(self, x: Tensor) -> Tensor:
        """Clips ``(B, C, T, H, W)`` -> logits ``(B, num_classes)``."""
        return self.forward_head(self.forward_features(x)[0])
