"""CPVT: a DeiT-style vision transformer whose position encoding is a PEG (Chu et al., 2021).

Layout (timm/DeiT parameter names, so DeiT checkpoints map onto it)::

    image (B, 3, H, W) --pad to a multiple of the patch--> patch_embed.proj (conv p×p, stride p)
      -> tokens (B, h*w, C) [+ cls_token in front when the class token is used]
      -> [non-PEG encodings ("learned", "sincos", "sine"): added here, once]
      -> [pos_blocks.-1 (PEG2d) when peg_at holds -1: CPVT's "position -1" ablation]
      -> blocks.0 -> pos_blocks.0 (PEG2d) -> blocks.1 -> ... -> blocks.{depth-1}
      -> norm -> pool ("token": the class token; "avg": mean of the grid tokens) -> head

Any input size runs: the image is zero-padded at the bottom and right up to the
next multiple of ``patch_size`` (at most ``patch_size - 1`` pixels, after
normalisation, so padding is black-ish in pixel space) rather than refused.
A PEG needs no resizing; a learned table is resized to the new grid with
``pos_interpolation``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..encodings import build_position_encoding
from ..peg import PEG2d, resolve_peg_at
from .layers import Block, PatchEmbed, init_vit_weights

__all__ = ["CPVT", "cpvt_base", "cpvt_small", "cpvt_tiny"]

POS_ENCODINGS = ("peg", "learned", "sincos", "sine", "none")
GLOBAL_POOLS = ("token", "avg")


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
            entry), ``"sincos"``, ``"sine"`` (added to the tokens), or ``"none"``.
        peg_at: block indices after which a PEG runs (CPVT: ``(0,)``; ``(0, ..., 5)``
            for the "PEG at 0-5" variant); ``-1`` is right after the patch embedding,
            before block 0; ``"all"`` is after every block (:func:`peg_core.peg.resolve_peg_at`).
            Ignored unless ``pos_enc="peg"``.
        peg_kernel_size: PEG depthwise conv size (3 in CPVT).
        peg_separable: the light ``1×k`` then ``k×1`` PEG (:class:`PEG2d` ``separable``).
        peg_padding: the PEG conv's ``padding_mode``: ``"zeros"`` (CPVT) or ``"circular"``
            (no border, so no absolute position: the "without zero padding" ablation).
        peg_dynamic: per-image PEG kernels mixed from a bank of ``peg_num_kernels``
            (:class:`PEG2d` ``dynamic``); state-dict keys ``pos_blocks.<i>.{weight,bias,route.*}``.
        global_pool: ``"avg"`` (mean of the grid tokens, CPVT-GAP, the paper's best,
            the default) or ``"token"`` (class token, DeiT).
        class_token: prepend a class token; ``None`` means "only for
            ``global_pool='token'``" (CPVT-GAP has none).
        drop_path_rate: stochastic depth, linearly increasing over the blocks.
        pos_interpolation: mode used to resize a learned table for another grid.
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
        peg_kernel_size: int = 3,
        peg_separable: bool = False,
        peg_padding: str = "zeros",
        peg_dynamic: bool = False,
        peg_num_kernels: int = 4,
        global_pool: str = "avg",
        class_token: bool | None = None,
        drop_path_rate: float = 0.0,
        pos_interpolation: str = "bicubic",
    ) -> None:
        super().__init__()
        if pos_enc not in POS_ENCODINGS:
            raise ValueError(f"pos_enc must be one of {POS_ENCODINGS}; got {pos_enc!r}")
        if global_pool not in GLOBAL_POOLS:
            raise ValueError(f"global_pool must be one of {GLOBAL_POOLS}; got {global_pool!r}")
        if class_token is None:
            class_token = global_pool == "token"
        if global_pool == "token" and not class_token:
            raise ValueError("global_pool='token' needs class_token=True")
        # the suite's one meaning of peg_at (-1: before block 0, i: after block i, "all": every block)
        peg_at = resolve_peg_at(peg_at, depth) if pos_enc == "peg" else ()

        self.embed_dim = embed_dim
        self.num_classes = num_classes
        self.patch_size = patch_size
        self.img_size = _pair(img_size)
        self.grid_size = tuple(-(-s // patch_size) for s in self.img_size)  # ceil: images are padded
        self.global_pool = global_pool
        self.num_prefix_tokens = 1 if class_token else 0
        self.pos_enc_kind = pos_enc
        self.peg_at = peg_at
        self.peg_options = {
            "kernel_size": peg_kernel_size,
            "separable": peg_separable,
            "padding_mode": peg_padding,
            "dynamic": peg_dynamic,
            "num_kernels": peg_num_kernels,
        }

        self.patch_embed = PatchEmbed(patch_size, in_chans, embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if class_token else None
        p = self.num_prefix_tokens
        if pos_enc == "learned":
            self.pos_enc = build_position_encoding(
                "learned", embed_dim, grid_size=self.grid_size, num_prefix_tokens=p,
                interpolation=pos_interpolation,
            )  # fmt: skip
        elif pos_enc in ("sincos", "sine"):
            self.pos_enc = build_position_encoding(pos_enc, embed_dim, num_prefix_tokens=p, apply_to="tokens")
        else:
            self.pos_enc = None  # PEGs live in pos_blocks; "none" has nothing
        # ModuleDict keyed by block index: state-dict keys read pos_blocks.<i>.proj.weight
        # (pos_blocks.-1.* for the PEG before block 0).  PEG2d checks the options.
        self.pos_blocks = nn.ModuleDict(
            {str(i): PEG2d(embed_dim, num_prefix_tokens=p, **self.peg_options) for i in peg_at}
        )
        dpr = [drop_path_rate * i / max(1, depth - 1) for i in range(depth)]  # plain floats: meta-device safe
        self.blocks = nn.ModuleList(
            [Block(embed_dim, num_heads, mlp_ratio, drop_path=dpr[i]) for i in range(depth)]
        )
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()

        init_vit_weights(self)
        if self.cls_token is not None:
            nn.init.trunc_normal_(self.cls_token, std=0.02)

    @property
    def pos_interpolation(self) -> str | None:
        """Resize mode of the learned table (``None`` for other encodings)."""
        return getattr(self.pos_enc, "interpolation", None)

    @pos_interpolation.setter
    def pos_interpolation(self, mode: str) -> None:
        if hasattr(self.pos_enc, "interpolation"):
            self.pos_enc.interpolation = mode

    def no_weight_decay(self) -> set[str]:
        """Parameter names conventionally trained without weight decay."""
        return {"cls_token", "pos_enc.pos_embed"}

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
        if x.dim() != 4:
            raise ValueError(f"expected images (B, C, H, W); got shape {tuple(x.shape)}")
        x, size = self.patch_embed(self.pad_to_patch(x))
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        if self.pos_enc is not None:
            x = self.pos_enc(x, size)
        if "-1" in self.pos_blocks:
            x = self.pos_blocks["-1"](x, size)
        for i, blk in enumerate(self.blocks):
            x = blk(x)
            key = str(i)
            if key in self.pos_blocks:
                x = self.pos_blocks[key](x, size)
        return self.norm(x), size

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """Tokens ``(B, P + h*w, C)`` -> logits ``(B, num_classes)`` (or pooled ``(B, C)``)."""
        x = x[:, 0] if self.global_pool == "token" else x[:, self.num_prefix_tokens :].mean(1)
        return x if pre_logits else self.head(x)

    def forward(self, x: Tensor) -> Tensor:
        """Image ``(B, 3, H, W)``, any ``H, W`` -> logits ``(B, num_classes)``."""
        return self.forward_head(self.forward_features(x)[0])


def _cpvt(embed_dim: int, num_heads: int, **kwargs) -> CPVT:
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
