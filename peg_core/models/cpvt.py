"""CPVT: a DeiT-style vision transformer whose position encoding is a PEG (Chu et al., 2021).

Layout (timm/DeiT parameter names, so DeiT checkpoints map onto it)::

    image (B, 3, H, W) --pad to a multiple of the patch--> patch_embed.proj (conv p×p, stride p)
      -> tokens (B, h*w, C) [+ cls_token, reg_token (registers) in front]
      -> [non-PEG encodings ("learned", "sincos", "sine"): added here, once]
      -> [rotary encodings ("rope-*"): one (sin, cos) table per forward, applied to q and k in every block]
      -> [attention biases ("alibi-2d", "fire", "lookhere"): one (1, heads, N, N) bias per forward, added to every
         block's attention logits; prefix rows / columns zero]
      -> [pos_blocks.-1 (PEG2d) when peg_at holds -1: CPVT's "position -1" ablation]
      -> blocks.0 -> pos_blocks.0 (PEG2d) -> blocks.1 -> ... -> blocks.{depth-1}
      -> norm -> pool ("token": the class token; "avg": mean of the grid tokens) -> head

Any input size runs: the image is zero-padded at the bottom and right up to the
next multiple of ``patch_size`` (at most ``patch_size - 1`` pixels, after
normalisation, so padding is black-ish in pixel space) rather than refused.
A PEG needs no resizing; a learned table is resized to the new grid with
``pos_interpolation``; a rotary table is rebuilt for the new grid (integer patch
indices for axial / mixed, coordinates normalised to [-1, 1] for DINOv3).

``pos_enc`` combines parts with ``+``: at most one additive table (``learned``,
``sincos``, ``sine``), ``peg`` (PEGs after the blocks in ``peg_at``) and at most one
rotary encoding (``rope-axial``, ``rope-mixed``, ``rope-dinov3``) and at most one attention bias
(``alibi-2d``, ``fire``, ``lookhere``: :mod:`peg_core.bias`, key ``attn_bias.*`` for FIRE's MLP), e.g.
``peg+rope-mixed``, ``peg+alibi-2d``;
:data:`CPVT_ENCODINGS` states the rule against the registry (:mod:`peg_core.registry`), so an
encoding registered there (built-in or a plugin's) runs in CPVT by name.

As a backbone (timm's contract, without importing timm): ``feature_info`` (one entry per block:
``module``, ``num_chs``, ``reduction``), :meth:`CPVT.forward_intermediates` (the blocks' token maps,
``NCHW`` or ``NLC``, at any input size: ``ceil(H / patch) x ceil(W / patch)``) and
:meth:`CPVT.prune_intermediate_layers`; ``timm.create_model("cpvt_tiny", features_only=True)``
wraps them (:mod:`peg_core.interop.timm`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..peg import PegOptions, fold_peg_keys
from ..registry import EncodingContext, EncodingSupport, build_encoding_parts, parse_pos_enc
from .layers import Block, PatchEmbed, init_vit_weights, vit_lr_layer_id

__all__ = ["CPVT", "CPVT_ENCODINGS", "cpvt_base", "cpvt_small", "cpvt_tiny"]

#: What CPVT builds from a ``pos_enc`` (:mod:`peg_core.registry`): a table added once at the input,
#: PEGs (or another conditional encoding) after the blocks of ``peg_at``, a rotary encoding of
#: every block's queries and keys and an attention bias of every block's logits, at most one of each
#: and in any combination.
CPVT_ENCODINGS = EncodingSupport(
    "CPVT", 2, slots=("table", "conditional", "rotary", "bias"),
    examples=("peg+rope-mixed", "learned+rope-axial", "peg+alibi-2d"),
)  # fmt: skip

GLOBAL_POOLS = ("token", "avg")


def take_indices(depth: int, indices: int | Sequence[int] | None) -> tuple[list[int], int]:
    """``(block indices, the largest)`` that ``indices`` names, as timm's ``feature_take_indices``:
    ``None`` every block, an int ``n`` the last ``n``, a sequence those (negative from the end)."""
    if indices is None:
        indices = depth
    if isinstance(indices, int):
        if not 0 < indices <= depth:
            raise ValueError(f"last-n indices must be 1..{depth}; got {indices}")
        taken = list(range(depth - indices, depth))
    else:
        taken = [depth + int(i) if int(i) < 0 else int(i) for i in indices]
        bad = [i for i in taken if not 0 <= i < depth]
        if bad or not taken:
            raise ValueError(f"block indices must be in {-depth}..{depth - 1}; got {list(indices)}")
    return taken, max(taken)


def _pair(x: int | Sequence[int]) -> tuple[int, int]:
    return (int(x), int(x)) if isinstance(x, int) else (int(x[0]), int(x[1]))


class CPVT(nn.Module):
    """Vision transformer with a conditional (PEG) or any other 2D position encoding.

    Args:
        embed_dim, depth, num_heads, mlp_ratio: transformer size.
        num_classes: classifier outputs (0: no head, :meth:`forward` returns pooled features).
        img_size: training image size ``int`` or ``(H, W)``; only sizes the learned table.
        patch_size: side of the square patches.
        pos_enc: ``"peg"`` (CPVT), ``"learned"`` (DeiT table incl. the class-token
            entry), ``"sincos"``, ``"sine"`` (added to the tokens), an attention bias ``"alibi-2d"`` /
            ``"fire"`` / ``"lookhere"`` (:mod:`peg_core.bias`, one bias for every block), ``"none"``,
            or a ``+`` combination (module docstring).
        peg_at: block indices after which a PEG runs (CPVT: ``(0,)``; ``(0, ..., 5)``
            for the "PEG at 0-5" variant); ``-1`` is right after the patch embedding,
            before block 0; ``"all"`` is after every block (:func:`peg_core.peg.resolve_peg_at`).
            Ignored unless ``pos_enc="peg"``.
        peg: the PEG's options as one value (:class:`peg_core.peg.PegOptions`, or a mapping of its
            fields): ``kernel_size`` (3 in CPVT), ``separable`` (the light ``1×k`` then ``k×1``
            PEG), ``padding_mode`` (``"zeros"``, CPVT; ``"circular"``: no border, so no absolute
            position, the "without zero padding" ablation), ``dynamic`` (per-image kernels mixed
            from a bank of ``num_kernels``; state-dict keys ``pos_blocks.<i>.{weight,bias,route.*}``).
            A config that stores the loose ``peg_kernel_size``... keywords builds through
            :func:`peg_core.peg.fold_peg_keys`.
        global_pool: ``"avg"`` (mean of the grid tokens, CPVT-GAP, the paper's best,
            the default) or ``"token"`` (class token, DeiT).
        class_token: prepend a class token; ``None`` means "only for
            ``global_pool='token'``" (CPVT-GAP has none).
        drop_path_rate: stochastic depth, linearly increasing over the blocks.
        pos_interpolation: mode used to resize a learned table for another grid.
        pos_antialias: anti-aliased down-sizing of that table (timm's ``resample_abs_pos_embed``).
        rope_temperature: rotary base (``None``: 100 axial, 10 mixed, 100 DINOv3, as naver / DINOv3).
        rope_indexing: rotary coordinate order, ``"xy"`` (naver / timm rope ViTs) or ``"ij"``
            (``None``: ``"xy"`` for axial / mixed, ``"ij"`` for DINOv3).
        rope_options: further keywords of the rotary class (e.g. DINOv3's ``shift_coords``,
            ``jitter_coords``, ``rescale_coords``, ``min_period``, ``max_period``).
        num_reg_tokens: register tokens after the class token (DINOv3: 4); key ``reg_token``.
        init_values: layer scale of every block (``blocks.<i>.ls1.gamma``, ``ls2.gamma``); ``None``: none.
        qkv_bias: bias of the ``qkv`` projections (DINOv3: False).
        norm_eps: LayerNorm epsilon (DINOv3: 1e-5).
        fc_norm: normalise after pooling (``fc_norm``) instead of before (``norm``), as timm's ViTs with
            average pooling do.
        no_embed_class: the learned table has no prefix entries and is added before the class /
            register tokens are prepended (timm's ``no_embed_class``; the rope ``_ape`` ViTs).
    """

    def __init__(
        self,
        embed_dim: int = 192,
        depth: int = 12,
        num_heads: int = 3,
        *,
        num_classes: int = 1000,
        img_size: int | Sequence[int] = 224,
        patch_size: int = 16,
        in_chans: int = 3,
        mlp_ratio: float = 4.0,
        pos_enc: str = "peg",
        peg_at: Sequence[int] = (0,),
        peg: PegOptions | Mapping[str, Any] | None = None,
        global_pool: str = "avg",
        class_token: bool | None = None,
        drop_path_rate: float = 0.0,
        pos_interpolation: str = "bicubic",
        pos_antialias: bool = False,
        rope_temperature: float | None = None,
        rope_indexing: str | None = None,
        rope_options: dict | None = None,
        num_reg_tokens: int = 0,
        init_values: float | None = None,
        qkv_bias: bool = True,
        norm_eps: float = 1e-6,
        fc_norm: bool = False,
        no_embed_class: bool = False,
    ) -> None:
        super().__init__()
        spec = parse_pos_enc(pos_enc, CPVT_ENCODINGS)
        if global_pool not in GLOBAL_POOLS:
            raise ValueError(f"global_pool must be one of {GLOBAL_POOLS}; got {global_pool!r}")
        if class_token is None:
            class_token = global_pool == "token"
        if global_pool == "token" and not class_token:
            raise ValueError("global_pool='token' needs class_token=True")
        if num_reg_tokens < 0:
            raise ValueError(f"num_reg_tokens must be >= 0; got {num_reg_tokens}")

        self.embed_dim = embed_dim
        self.num_classes = num_classes
        self.patch_size = patch_size
        self.img_size = _pair(img_size)
        self.grid_size = tuple(-(-s // patch_size) for s in self.img_size)  # ceil: images are padded
        self.global_pool = global_pool
        self.num_prefix_tokens = (1 if class_token else 0) + num_reg_tokens
        self.no_embed_class = no_embed_class
        self.pos_enc_kind = pos_enc
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim={embed_dim} must be divisible by num_heads={num_heads}")
        peg = PegOptions.of(peg)
        self.peg_options = peg.class_options(2)

        self.patch_embed = PatchEmbed(patch_size, in_chans, embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if class_token else None
        self.reg_token = nn.Parameter(torch.zeros(1, num_reg_tokens, embed_dim)) if num_reg_tokens else None
        rope_kw = dict(rope_options or {})
        if rope_indexing is not None:
            rope_kw["indexing"] = rope_indexing
        rope_kw["temperature"] = rope_temperature
        ctx = EncodingContext(embed_dim, self.grid_size, num_prefix_tokens=self.num_prefix_tokens,
                              interpolation=pos_interpolation, antialias=pos_antialias, num_heads=num_heads,
                              depth=depth, peg=peg)  # fmt: skip
        # the table has no prefix entries with no_embed_class; PEGs (pos_blocks.<i>, pos_blocks.-1 before
        # block 0) and the rotary table skip the prefix tokens; one attention bias serves every block
        parts = build_encoding_parts(spec, ctx, peg_at=peg_at, rotary_options=rope_kw,
                                     table_prefix_tokens=0 if no_embed_class else None)  # fmt: skip
        self.peg_at = parts.peg_at
        self.pos_enc = parts.table
        self.pos_blocks = parts.peg_modules()
        self.rope = parts.rotary
        self.attn_bias = parts.bias
        half = self.rope is not None and self.rope.half
        dpr = [drop_path_rate * i / max(1, depth - 1) for i in range(depth)]  # plain floats: meta-device safe
        block = {"qkv_bias": qkv_bias, "norm_eps": norm_eps, "init_values": init_values, "rope_half": half}
        self.blocks = nn.ModuleList(
            [Block(embed_dim, num_heads, mlp_ratio, drop_path=dpr[i], **block) for i in range(depth)]
        )
        self.norm = nn.Identity() if fc_norm else nn.LayerNorm(embed_dim, eps=norm_eps)
        self.fc_norm = nn.LayerNorm(embed_dim, eps=norm_eps) if fc_norm else nn.Identity()
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        #: timm's backbone metadata: the token map after each block (its width, its stride in pixels)
        self.feature_info = [
            {"module": f"blocks.{i}", "num_chs": embed_dim, "reduction": patch_size} for i in range(depth)
        ]

        init_vit_weights(self)
        for token in (self.cls_token, self.reg_token):
            if token is not None:
                nn.init.trunc_normal_(token, std=0.02)

    @property
    def pos_interpolation(self) -> str | None:
        """Resize mode of the learned table (``None`` for other encodings)."""
        return getattr(self.pos_enc, "interpolation", None)

    @pos_interpolation.setter
    def pos_interpolation(self, mode: str) -> None:
        if hasattr(self.pos_enc, "interpolation"):
            self.pos_enc.interpolation = mode

    def no_weight_decay(self) -> set[str]:
        """Parameter names conventionally trained without weight decay (incl. learned rotary frequencies)."""
        names = {"cls_token", "reg_token", "pos_enc.pos_embed"}
        if self.rope is not None and hasattr(self.rope, "no_weight_decay"):
            names |= {f"rope.{n}" for n in self.rope.no_weight_decay()}
        if self.attn_bias is not None and hasattr(self.attn_bias, "no_weight_decay"):
            names |= {f"attn_bias.{n}" for n in self.attn_bias.no_weight_decay()}
        return names

    def num_lr_layers(self) -> int:
        """Blocks counted by layer-wise lr decay (:class:`peg_core.engine.LayerDecayModel`)."""
        return len(self.blocks)

    def lr_layer_id(self, name: str) -> int:
        """0: embeddings, ``i + 1``: block ``i`` and its PEG, ``depth + 1``: final norm and head."""
        return vit_lr_layer_id(name, len(self.blocks))

    @property
    def num_features(self) -> int:
        """Width of the pooled features fed to the head (timm's name for it)."""
        return self.embed_dim

    def get_classifier(self) -> nn.Module:
        """The classifier head (``nn.Identity`` when ``num_classes == 0``)."""
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """New randomly initialised head for ``num_classes`` outputs (0: none), optionally a new pooling.

        ``global_pool="token"`` needs the class token this model was built with.
        """
        if global_pool is not None:
            if global_pool not in GLOBAL_POOLS:
                raise ValueError(f"global_pool must be one of {GLOBAL_POOLS}; got {global_pool!r}")
            if global_pool == "token" and self.cls_token is None:
                raise ValueError("global_pool='token' needs a class token; this model has none")
            self.global_pool = global_pool
        self.num_classes = int(num_classes)
        ref = self.patch_embed.proj.weight  # same device and dtype as the rest of the model
        if num_classes > 0:
            self.head = nn.Linear(self.embed_dim, num_classes, device=ref.device, dtype=ref.dtype)
            nn.init.trunc_normal_(self.head.weight, std=0.02)  # as init_vit_weights does for Linear
            nn.init.zeros_(self.head.bias)
        else:
            self.head = nn.Identity()

    def pad_to_patch(self, x: Tensor) -> Tensor:
        """Zero-pad ``(B, C, H, W)`` at the bottom/right to multiples of ``patch_size``."""
        h, w = x.shape[-2:]
        ph, pw = (-h) % self.patch_size, (-w) % self.patch_size
        return F.pad(x, (0, pw, 0, ph)) if ph or pw else x

    def forward_features(self, x: Tensor) -> tuple[Tensor, tuple[int, int]]:
        """Image ``(B, 3, H, W)`` -> (normed tokens ``(B, P + h*w, C)``, grid ``(h, w)``), ``h = ceil(H/patch)``."""
        x, size, _ = self._forward_blocks(x)
        return self.norm(x), size

    def _forward_blocks(
        self, x: Tensor, take: Sequence[int] = (), stop: int | None = None
    ) -> tuple[Tensor, tuple[int, int], list[Tensor]]:
        """``(tokens after block stop (default: the last), grid (h, w), [tokens after each block in take])``.

        A block's tokens are taken after its PEG (``pos_blocks.i``), where the next block reads them.
        """
        if x.dim() != 4:
            raise ValueError(f"expected images (B, C, H, W); got shape {tuple(x.shape)}")
        x, size = self.patch_embed(self.pad_to_patch(x))
        if self.pos_enc is not None and self.no_embed_class:
            x = self.pos_enc(x, size)
        prefix = [t.expand(x.shape[0], -1, -1) for t in (self.cls_token, self.reg_token) if t is not None]
        if prefix:
            x = torch.cat([*prefix, x], dim=1)
        if self.pos_enc is not None and not self.no_embed_class:
            x = self.pos_enc(x, size)
        if "-1" in self.pos_blocks:
            x = self.pos_blocks["-1"](x, size)
        rope = None if self.rope is None else self.rope(size, num_prefix_tokens=self.num_prefix_tokens)
        # (1, heads, P + N, P + N), computed once; each block takes its layer_bias (the same tensor
        # unless the bias has a per-layer schedule)
        bias = None
        if self.attn_bias is not None:
            bias = self.attn_bias(
                size, num_prefix_tokens=self.num_prefix_tokens, dtype=x.dtype, device=x.device
            )
        taken = []
        blocks = self.blocks if stop is None else self.blocks[: stop + 1]
        for i, blk in enumerate(blocks):
            if bias is not None:
                table = None if rope is None else (rope[0][i], rope[1][i]) if self.rope.learned else rope
                x = blk(x, table, self.attn_bias.layer_bias(bias, i))
            elif rope is None:
                x = blk(x)
            else:  # mixed: one table per block (depth, heads, N, D); the others share one (N, D)
                x = blk(x, (rope[0][i], rope[1][i]) if self.rope.learned else rope)
            key = str(i)
            if key in self.pos_blocks:
                x = self.pos_blocks[key](x, size)
            if i in take:
                taken.append(x)
        return x, size, taken

    def forward_intermediates(
        self,
        x: Tensor,
        indices: int | Sequence[int] | None = None,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ) -> list[Any] | tuple[Tensor, list[Any]]:
        """The token maps after the blocks ``indices`` names, as timm's ViTs return them.

        Args:
            x: images ``(B, 3, H, W)``, any ``H``, ``W`` (padded to the patch: maps are
                ``ceil(H / patch) x ceil(W / patch)``).
            indices: ``None`` every block, an int ``n`` the last ``n``, a list those (negative from the end).
            return_prefix_tokens: each intermediate is ``(map, prefix tokens (B, P, C))``.
            norm: apply the final ``norm`` to each intermediate.
            stop_early: run no block past the last one taken (the final output is then its tokens).
            output_fmt: ``"NCHW"`` (``(B, C, h, w)``) or ``"NLC"`` (``(B, h*w, C)``), prefix tokens left out.
            intermediates_only: return the list alone.

        Returns:
            the list, or ``(final normed tokens (B, P + h*w, C), the list)``; the final tokens are
            :meth:`forward_features`' (its first element; :class:`~peg_core.interop.timm.TimmCPVT`'s whole result).
        """
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC'; got {output_fmt!r}")
        taken, last = take_indices(len(self.blocks), indices)
        stop = last if stop_early or intermediates_only else None
        x, (h, w), maps = self._forward_blocks(x, taken, stop)
        p = self.num_prefix_tokens
        out: list[Any] = []
        for y in maps:
            y = self.norm(y) if norm else y
            grid = y[:, p:]
            if output_fmt == "NCHW":
                grid = grid.reshape(grid.shape[0], h, w, -1).permute(0, 3, 1, 2).contiguous()
            out.append((grid, y[:, :p]) if return_prefix_tokens and p else grid)
        if intermediates_only:
            return out
        return self.norm(x), out

    def prune_intermediate_layers(
        self, indices: int | Sequence[int] = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        """Drop the blocks (and their PEGs) past the last one ``indices`` names; returns the indices kept.

        ``prune_norm``: the final norm becomes an identity; ``prune_head``: so do ``fc_norm`` and
        the head (``num_classes`` 0).  What timm's feature wrapper calls before taking features.
        """
        taken, last = take_indices(len(self.blocks), indices)
        self.blocks = self.blocks[: last + 1]
        for key in [k for k in self.pos_blocks if int(k) > last]:
            del self.pos_blocks[key]
        self.feature_info = self.feature_info[: last + 1]
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.fc_norm = nn.Identity()
            self.reset_classifier(0)
        return taken

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """Tokens ``(B, P + h*w, C)`` -> logits ``(B, num_classes)`` (or pooled ``(B, C)``)."""
        x = x[:, 0] if self.global_pool == "token" else x[:, self.num_prefix_tokens :].mean(1)
        x = self.fc_norm(x)
        return x if pre_logits else self.head(x)

    def forward(self, x: Tensor) -> Tensor:
        """Image ``(B, 3, H, W)``, any ``H, W`` -> logits ``(B, num_classes)``."""
        return self.forward_head(self.forward_features(x)[0])


def _cpvt(embed_dim: int, num_heads: int, **kwargs) -> CPVT:
    kwargs = fold_peg_keys(kwargs)  # a stored config's loose peg_* keywords
    kwargs.setdefault("depth", 12)
    kwargs.setdefault("patch_size", 16)
    return CPVT(embed_dim=embed_dim, num_heads=num_heads, **kwargs)


def cpvt_tiny(**kwargs) -> CPVT:
    """CPVT-Ti: 192 wide, 12 blocks, 3 heads, patch 16 (DeiT-tiny shape); keywords as :class:`CPVT`."""
    return _cpvt(192, 3, **kwargs)


def cpvt_small(**kwargs) -> CPVT:
    """CPVT-S: 384 wide, 12 blocks, 6 heads, patch 16 (DeiT-small shape)."""
    return _cpvt(384, 6, **kwargs)


def cpvt_base(**kwargs) -> CPVT:
    """CPVT-B: 768 wide, 12 blocks, 12 heads, patch 16 (DeiT-base shape)."""
    return _cpvt(768, 12, **kwargs)
