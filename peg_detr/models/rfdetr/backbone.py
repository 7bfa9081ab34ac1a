"""RF-DETR's backbone: a DINOv2 ViT with windowed attention, and LW-DETR's scale projector.

The ViT is the suite's :class:`peg_core.models.cpvt.CPVT` (patch embedding, class token, the
position encoding built from the registry, pre-norm blocks with layer scale, final norm); this
module only runs its blocks the way transformers' ``RfDetrDinov2Backbone`` does::

    image (B, 3, H, W), H and W multiples of patch * num_windows
      patch_embed -> (B, h*w, C) + class token -> + table (pos_enc "table"/"learned") -> (B, 1 + h*w, C)
      to windows: (B * nw^2, 1 + h*w / nw^2, C), the class token copied into every window
      blocks 0..: a *windowed* block attends inside each window; a *global* block attends over
        every token of the image (all windows and their class-token copies together)
        [a PEG after block i (pos_enc "peg") runs on the whole (h, w) grid, then back to windows]
      the outputs of the blocks in out_blocks -> final norm -> (B, C, h, w) each
    LW-DETR projector: concat (B, n*C, h, w) -> C2f (1x1 conv + LN, bottlenecks of two 3x3 conv + LN,
      1x1 conv + LN, each with an activation) -> LayerNorm -> (B, d_model, h, w)    (stride = patch)

Windows, as transformers computes them: the row-major ``h x w`` patch grid is viewed as
``(nw, w / nw, nw, h / nw)``, the two middle axes swapped, and the maps are read back from the
windows as ``(nw, nw, h / nw, w / nw)``.  On a square grid that is the usual tiling into
``nw x nw`` rectangles and its inverse.  On a non-square grid (``h != w``) a "window" is not a
rectangle and the returned maps are a fixed permutation of the grid: transformers' (and the
original rf-detr's) behaviour, kept here so that the weights mean the same thing; a square input
is what every published size runs at.

The size rule: ``H`` and ``W`` must be multiples of ``patch_size * num_windows`` (the windows must
tile the patch grid); anything else is an :class:`~peg_core.errors.InputError` naming the size,
the rule and the nearest sizes that follow it (RF-DETR's own "resolution divisible by 56" for
patch 14 and 4 windows, 32 for patch 16 and 2 windows).

Which blocks do what, from transformers' config: ``out_indices`` name *stages* (stage ``k`` is the
output of block ``k - 1``, stage 0 the embeddings), so the maps are taken after blocks
``k - 1``; the blocks numbered ``k`` (0-based, i.e. the block after each taken one) and every block
past the last out index attend globally, the others (``window_block_indexes``) in windows.  That
off-by-one is transformers' and rf-detr's own; :func:`peg_detr.interop.hf_rfdetr.rfdetr_from_hf_config`
translates it into the explicit ``out_blocks`` / ``global_blocks`` used here.  Blocks after the last
taken one never run (no feature reads them; transformers runs them for nothing): the base size's
block 11 gets no gradient, so DDP needs ``find_unused_parameters`` for it (N / S / M / L read the
last block).

Position encodings (``pos_enc``, from :mod:`peg_core.registry`): ``learned`` is RF-DETR's table
``(1, 1 + g*g, C)`` for the pre-training grid ``g = image_size / patch``, resized to ``(h, w)``
bicubically with ``align_corners=False`` and anti-aliasing, in float32 (transformers'
``interpolate_pos_encoding``; the table itself when the grid is unchanged); ``none``: no position;
``peg``: a PEG (depthwise 3x3 conv, CPVT) after the blocks of ``peg_at`` (default block 0, CPVT's
choice), zero-initialised so it computes what ``none`` computes until it trains, and free of any
grid size; ``learned+peg`` both.  The rotary kinds (``rope-axial``, ``rope-mixed``, ``rope-dinov3``)
and attention biases (``alibi-2d``, ``fire``, ``lookhere``) are built for the whole ``h x w`` grid of
the call, as CPVT builds them, and each token keeps its own row in every block: a windowed block
reads the rows of its window's tokens (the class-token copies the prefix row), a global block the
rows of all windows in their order (:func:`window_token_order`), so a window's attention sees the
true grid positions of its tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from peg_core.errors import InputError
from peg_core.models.cpvt import CPVT
from peg_core.registry import EncodingSupport, parse_pos_enc

from ..common import IMAGENET_MEAN, IMAGENET_STD  # RF-DETR's input standardisation (RfDetrImageProcessor's)
from ..layers import create_act

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "RFDETR_VIT_ENCODINGS",
    "C2fLayer",
    "ConvLNLayer",
    "LayerNorm2d",
    "ScaleProjector",
    "WindowedViTBackbone",
    "build_windowed_vit",
    "from_windows",
    "to_windows",
    "window_token_order",
]


#: What the windowed ViT builds from a ``pos_enc``: a table added once at the input, a conditional
#: encoding (PEG) after chosen blocks, a rotary encoding and an attention bias of every block, at
#: most one of each.  ``table`` is accepted as RF-DETR's name of
#: its learned table (:func:`normalize_pos_enc`).
RFDETR_VIT_ENCODINGS = EncodingSupport(
    "RF-DETR's windowed ViT", 2, slots=("table", "conditional", "rotary", "bias"), exclude=("sine",),
    examples=("learned", "peg", "learned+peg", "peg+rope-axial", "peg+alibi-2d"),
)  # fmt: skip


def normalize_pos_enc(pos_enc: str) -> str:
    """``"table"`` (RF-DETR's learned table) -> ``"learned"``; anything else as given, checked."""
    text = "+".join("learned" if part == "table" else part for part in pos_enc.split("+"))
    parse_pos_enc(text, RFDETR_VIT_ENCODINGS)
    return text


def to_windows(tokens: Tensor, grid: tuple[int, int], num_windows: int) -> Tensor:
    """``(B, 1 + h*w, C)`` -> ``(B * nw^2, 1 + h*w / nw^2, C)`` in transformers' window layout.

    The grid tokens are viewed as ``(nw, w / nw, nw, h / nw)`` (transformers' order; the usual
    ``(rows of windows, rows in a window, columns of windows, columns in a window)`` when
    ``h == w``) and window ``(a, c)`` keeps axes 1 and 3.  The class token (the same for every
    image: class token plus its table entry) is put in front of every window.
    """
    b, _, c = tokens.shape
    h, w = grid
    nw = num_windows
    if nw == 1:
        return tokens
    cells = tokens[:, 1:].reshape(b, nw, w // nw, nw, h // nw, c).transpose(2, 3)
    cells = cells.reshape(b * nw * nw, (h // nw) * (w // nw), c)
    cls = tokens[:, :1].repeat_interleave(nw * nw, dim=0)
    return torch.cat([cls, cells], dim=1)


def from_windows(windows: Tensor, grid: tuple[int, int], num_windows: int) -> Tensor:
    """The exact inverse of :func:`to_windows` for the grid tokens: ``(B*nw^2, 1 + L, C)`` -> ``(B, h*w, C)``.

    Row-major over the true ``h x w`` grid at any size (what a PEG's convolution needs); the
    class-token copies are dropped.
    """
    h, w = grid
    nw = num_windows
    c = windows.shape[-1]
    b = windows.shape[0] // (nw * nw)
    cells = windows[:, 1:].reshape(b, nw, nw, w // nw, h // nw, c).transpose(2, 3)
    return cells.reshape(b, h * w, c)


def window_token_order(grid: tuple[int, int], num_windows: int, device: torch.device | None = None) -> Tensor:
    """``(nw^2, 1 + L)`` long: the index in the unwindowed ``(1 + h*w)`` sequence of every windowed token.

    Column 0 (each window's class-token copy) is 0; a rotary table or attention bias built for the
    whole grid is gathered with it, so every token keeps its own position (module docstring).
    """
    n = 1 + grid[0] * grid[1]
    return to_windows(torch.arange(n, device=device).view(1, n, 1), grid, num_windows)[..., 0]


def _rows(table: Tensor, order: Tensor, batch: int, merged: bool) -> Tensor:
    """A rotary table ``(N, D)`` / ``(heads, N, D)`` -> the rows of the windowed tokens.

    ``merged`` (a global block): ``(M, D)`` / ``(heads, M, D)`` for the ``M = nw^2 (1 + L)`` tokens of
    an image; else ``(B * nw^2, 1 | heads, 1 + L, D)`` for the window batch (window ``j`` of image
    ``b`` at ``b * nw^2 + j``, as :func:`to_windows` orders them).
    """
    if merged:
        return table[..., order.reshape(-1), :]
    rows = table[..., order, :]  # (nw^2, 1 + L, D) | (heads, nw^2, 1 + L, D)
    rows = rows.unsqueeze(1) if table.dim() == 2 else rows.transpose(0, 1)
    return rows.repeat(batch, 1, 1, 1)


def _bias_rows(bias: Tensor, order: Tensor, batch: int, merged: bool) -> Tensor:
    """An attention bias ``(1, heads, N, N)`` -> ``(1, heads, M, M)`` (merged) or ``(B * nw^2, heads, 1 + L, 1 + L)``."""
    if merged:
        flat = order.reshape(-1)
        return bias[:, :, flat[:, None], flat[None, :]]
    rows = bias[0][:, order[:, :, None], order[:, None, :]]  # (heads, nw^2, 1 + L, 1 + L)
    return rows.transpose(0, 1).repeat(batch, 1, 1, 1)


def windows_to_map(windows: Tensor, grid: tuple[int, int], num_windows: int) -> Tensor:
    """Windowed tokens ``(B*nw^2, 1 + L, C)`` -> a map ``(B, C, h, w)`` as transformers reads it back.

    Windows as ``(nw, nw, h / nw, w / nw)`` with the middle axes swapped: :func:`from_windows` on a
    square grid, a fixed permutation of it otherwise (module docstring).
    """
    h, w = grid
    nw = num_windows
    c = windows.shape[-1]
    b = windows.shape[0] // (nw * nw)
    cells = windows[:, 1:].reshape(b, nw, nw, h // nw, w // nw, c).transpose(2, 3)
    return cells.reshape(b, h, w, c).permute(0, 3, 1, 2).contiguous()


class WindowedViTBackbone(nn.Module):
    """A CPVT run as RF-DETR's windowed DINOv2: ``(B, 3, H, W)`` -> maps ``(B, C, H / p, W / p)``.

    Args:
        vit: a :class:`CPVT` with a class token (its head, pooling and unused blocks are ignored).
        out_blocks: 0-based blocks whose outputs are the maps (transformers' stage ``k`` = block ``k - 1``).
        global_blocks: blocks attending over the whole image; the others attend in windows.
        num_windows: ``nw``: the patch grid is cut into ``nw x nw`` windows (1: every block global).
        apply_layernorm: the ViT's final ``norm`` on every map (transformers' ``apply_layernorm``).
        normalize_input: standardise ``[0, 1]`` pixels with ImageNet's mean / std first, as the
            suite's detectors take pixels; transformers' model takes the standardised image
            (its processor normalises), so ``ours(x) == theirs((x - mean) / std)``.
    """

    def __init__(
        self,
        vit: CPVT,
        out_blocks: Sequence[int],
        global_blocks: Sequence[int],
        *,
        num_windows: int = 4,
        apply_layernorm: bool = True,
        normalize_input: bool = True,
    ) -> None:
        super().__init__()
        depth = len(vit.blocks)
        if vit.cls_token is None or vit.reg_token is not None:
            raise ValueError("RF-DETR's ViT has a class token and no registers")
        out_blocks = sorted({int(i) for i in out_blocks})
        if not out_blocks or not all(0 <= i < depth for i in out_blocks):
            raise ValueError(f"out_blocks must be block indices 0..{depth - 1}; got {out_blocks}")
        if num_windows < 1:
            raise ValueError(f"num_windows must be >= 1; got {num_windows}")
        self.vit = vit
        self.out_blocks = out_blocks
        self.global_blocks = sorted({int(i) for i in global_blocks if 0 <= int(i) < depth})
        self.num_windows = num_windows
        self.apply_layernorm = apply_layernorm
        self.normalize_input = normalize_input
        # not in the state dict: the input convention, not a weight
        self.register_buffer("input_mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("input_std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)
        self.out_channels = [vit.embed_dim] * len(out_blocks)

    @property
    def patch_size(self) -> int:
        return self.vit.patch_size

    @property
    def size_multiple(self) -> int:
        """Sides must be multiples of this: ``patch_size * num_windows``."""
        return self.vit.patch_size * self.num_windows

    def check_input_size(self, height: int, width: int) -> None:
        """:class:`InputError` unless both sides are multiples of ``patch_size * num_windows``."""
        m = self.size_multiple
        if height % m or width % m:
            near = sorted(
                {max(m, s // m * m) for s in (height, width)} | {-(-s // m) * m for s in (height, width)}
            )
            raise InputError(
                f"RF-DETR's windowed ViT needs both sides to be multiples of patch_size x num_windows = "
                f"{self.vit.patch_size} x {self.num_windows} = {m} px (the {self.num_windows} x "
                f"{self.num_windows} windows must tile the patch grid); nearest valid sides: "
                f"{', '.join(map(str, near))}",
                f"{height} x {width} px",
            )

    def _peg(self, key: str, windows: Tensor, grid: tuple[int, int]) -> Tensor:
        """The PEG ``pos_blocks[key]`` on the true ``h x w`` grid of windowed tokens, back in windows."""
        peg = self.vit.pos_blocks[key]
        cells = from_windows(windows, grid, self.num_windows)  # (B, h*w, C) row-major
        # the PEG leaves its prefix tokens as they are; a zero stand-in keeps the class-token
        # copies (one per window, different after a block) out of it
        prefix = cells.new_zeros(cells.shape[0], peg.num_prefix_tokens, cells.shape[-1])
        cells = peg(torch.cat([prefix, cells], dim=1), grid)[:, peg.num_prefix_tokens :]
        b, c = cells.shape[0], cells.shape[-1]
        h, w = grid
        nw = self.num_windows
        redone = cells.reshape(b, nw, w // nw, nw, h // nw, c).transpose(2, 3)
        redone = redone.reshape(b * nw * nw, -1, c)
        return torch.cat([windows[:, :1], redone], dim=1)

    def forward(self, x: Tensor, *, pad: bool = False) -> list[Tensor]:
        """``x`` ``(B, 3, H, W)`` -> one ``(B, C, H' / p, W' / p)`` map per out block.

        ``pad``: the standardised image is zero-padded at the bottom and right to ``H'``, ``W'``, the
        next multiples of :attr:`size_multiple` (zero after standardisation: the mean colour, as
        transformers' processor pads); without it a side that is no multiple is an :class:`InputError`.
        """
        if x.dim() != 4:
            raise ValueError(f"expected images (B, 3, H, W); got shape {tuple(x.shape)}")
        if not (pad or torch.compiler.is_exporting() or torch.jit.is_tracing()):
            self.check_input_size(int(x.shape[-2]), int(x.shape[-1]))
        if self.normalize_input:
            x = (x - self.input_mean.to(x.dtype)) / self.input_std.to(x.dtype)
        if pad:  # unconditional (a zero pad is a no-op), so an exported graph has no branch on the size
            m = self.size_multiple
            x = F.pad(x, (0, (-x.shape[-1]) % m, 0, (-x.shape[-2]) % m))
        vit, nw = self.vit, self.num_windows
        tokens, grid = vit.patch_embed(x)
        tokens = torch.cat([vit.cls_token.expand(tokens.shape[0], -1, -1), tokens], dim=1)
        if vit.pos_enc is not None:
            tokens = vit.pos_enc(tokens, grid)
        if "-1" in vit.pos_blocks:
            tokens = vit.pos_blocks["-1"](tokens, grid)
        b = tokens.shape[0]
        windows = to_windows(tokens, grid, nw)  # (B * nw^2, 1 + L, C)
        # rotary table / attention bias for the whole grid, once per call (CPVT's); each block reads
        # its tokens' rows of it
        rope = None if vit.rope is None else vit.rope(grid, num_prefix_tokens=1)
        bias = None
        if vit.attn_bias is not None:
            bias = vit.attn_bias(grid, num_prefix_tokens=1, dtype=tokens.dtype, device=tokens.device)
        order = None if rope is None and bias is None else window_token_order(grid, nw, tokens.device)
        wanted, global_blocks = set(self.out_blocks), set(self.global_blocks)
        maps: list[Tensor] = []
        for i, blk in enumerate(vit.blocks[: self.out_blocks[-1] + 1]):
            merged = i in global_blocks and nw > 1
            extras: tuple[object, ...] = ()
            if order is not None:
                table = None
                if rope is not None:
                    sin, cos = (rope[0][i], rope[1][i]) if vit.rope.learned else rope
                    table = (_rows(sin, order, b, merged), _rows(cos, order, b, merged))
                mask = (
                    None if bias is None else _bias_rows(vit.attn_bias.layer_bias(bias, i), order, b, merged)
                )
                extras = (table, mask)
            if merged:
                # every token of an image in one sequence; norms and MLPs are per token, so the
                # whole block runs on it and the window layout comes back unchanged
                windows = blk(windows.reshape(b, -1, windows.shape[-1]), *extras).reshape(windows.shape)
            else:
                windows = blk(windows, *extras)
            if str(i) in vit.pos_blocks:
                windows = self._peg(str(i), windows, grid)
            if i in wanted:
                out = vit.norm(windows) if self.apply_layernorm else windows
                maps.append(windows_to_map(out, grid, nw))
        return maps


def build_windowed_vit(
    *,
    embed_dim: int = 384,
    depth: int = 12,
    num_heads: int = 6,
    mlp_ratio: float = 4.0,
    patch_size: int = 16,
    image_size: int = 512,
    out_blocks: Sequence[int] = (2, 5, 8, 11),
    global_blocks: Sequence[int] | None = None,
    num_windows: int = 2,
    pos_enc: str = "learned",
    peg_at: Sequence[int] | str = (0,),
    layer_scale: float | None = 1.0,
    qkv_bias: bool = True,
    norm_eps: float = 1e-6,
    drop_path_rate: float = 0.0,
    apply_layernorm: bool = True,
    normalize_input: bool = True,
) -> WindowedViTBackbone:
    """A randomly initialised windowed ViT (weights: :mod:`peg_detr.interop.hf_rfdetr` or a checkpoint).

    ``image_size`` sizes the learned table (grid ``image_size // patch_size``); ``global_blocks``
    defaults to transformers' rule (the block after each out block, module docstring).  A PEG
    (``pos_enc`` holding ``peg``) starts at zero.
    """
    pos_enc = normalize_pos_enc(pos_enc)
    vit = CPVT(
        embed_dim,
        depth,
        num_heads,
        num_classes=0,
        img_size=image_size,
        patch_size=patch_size,
        mlp_ratio=mlp_ratio,
        pos_enc=pos_enc,
        peg_at=peg_at if isinstance(peg_at, str) else tuple(peg_at),
        global_pool="token",
        class_token=True,
        drop_path_rate=drop_path_rate,
        pos_interpolation="bicubic",
        pos_antialias=True,
        init_values=layer_scale,
        qkv_bias=qkv_bias,
        norm_eps=norm_eps,
    )
    # stochastic depth: the same rate in every block (DINOv2 / transformers' RF-DETR), not CPVT's ramp
    for blk in vit.blocks:
        blk.drop_path.p = drop_path_rate
    # zero PEG: the model computes what "none" computes until the PEG trains (CPVT's PEG added to
    # a pre-trained backbone); done here so any PEG variant the registry builds starts at zero
    with torch.no_grad():
        for p in vit.pos_blocks.parameters():
            p.zero_()
    if global_blocks is None:
        taken = {i + 1 for i in out_blocks}
        global_blocks = [i for i in range(depth) if i in taken or i > max(out_blocks) + 1]
    return WindowedViTBackbone(
        vit, out_blocks, global_blocks, num_windows=num_windows, apply_layernorm=apply_layernorm,
        normalize_input=normalize_input,
    )  # fmt: skip


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of a ``(B, C, H, W)`` map (LW-DETR's channels-first norm)."""

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(
            x.permute(0, 2, 3, 1), self.normalized_shape, self.weight, self.bias, self.eps
        ).permute(0, 3, 1, 2)


class ConvLNLayer(nn.Module):
    """``Conv2d`` (no bias, padding ``k // 2``) -> :class:`LayerNorm2d` -> activation; keys ``conv.*``, ``norm.*``."""

    def __init__(self, cin: int, cout: int, kernel_size: int, act: str | None, eps: float = 1e-5) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel_size, padding=kernel_size // 2, bias=False)
        self.norm = LayerNorm2d(cout, eps=eps)
        self.activation = create_act(act, "projector activation")

    def forward(self, x: Tensor) -> Tensor:
        return self.activation(self.norm(self.conv(x)))


class _Bottleneck(nn.Module):
    """Two 3x3 :class:`ConvLNLayer` (no shortcut, as LW-DETR's projector)."""

    def __init__(self, channels: int, act: str, eps: float) -> None:
        super().__init__()
        self.conv1 = ConvLNLayer(channels, channels, 3, act, eps)
        self.conv2 = ConvLNLayer(channels, channels, 3, act, eps)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv2(self.conv1(x))


class C2fLayer(nn.Module):
    """YOLOv8's C2f with LayerNorms: ``(B, cin, H, W)`` -> ``(B, cout, H, W)``.

    ``conv1`` (1x1) to ``2 * hidden`` channels, split in two halves; the second half goes through
    the bottlenecks one after the other; both halves and every bottleneck output are
    concatenated (``(2 + n) * hidden``) and ``conv2`` (1x1) maps them to ``cout``.
    """

    def __init__(
        self,
        cin: int,
        cout: int,
        num_blocks: int = 3,
        expansion: float = 0.5,
        act: str = "silu",
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        create_act(act, "projector activation", optional=False)  # an unknown name: before any layer is built
        self.hidden = int(cout * expansion)
        self.conv1 = ConvLNLayer(cin, 2 * self.hidden, 1, act, eps)
        self.bottlenecks = nn.ModuleList(_Bottleneck(self.hidden, act, eps) for _ in range(num_blocks))
        self.conv2 = ConvLNLayer((2 + num_blocks) * self.hidden, cout, 1, act, eps)

    def forward(self, x: Tensor) -> Tensor:
        parts = list(self.conv1(x).split(self.hidden, dim=1))
        y = parts[-1]
        for block in self.bottlenecks:
            y = block(y)
            parts.append(y)
        return self.conv2(torch.cat(parts, dim=1))


class ScaleProjector(nn.Module):
    """LW-DETR's projector at one scale (P4, the patch stride): the ViT maps -> one ``(B, d_model, h, w)`` map.

    The maps are concatenated on channels, mixed by a :class:`C2fLayer` and layer-normed.  (The
    original rf-detr also had two-scale projectors, P3 + P5, for its first "large"; transformers'
    ``RfDetrConfig`` and every published N / S / M / L size use this single P4 scale.)

    Args:
        in_channels: channels of each ViT map.
        d_model: output channels (the decoder's width).
        num_blocks, expansion, act: the C2f's (``c2f_num_blocks``, ``hidden_expansion``, ``activation_function``).
        eps: the C2f's LayerNorm eps (``layer_norm_eps``); the final norm's is ``1e-6`` (transformers').
    """

    def __init__(
        self,
        in_channels: Sequence[int],
        d_model: int = 256,
        *,
        num_blocks: int = 3,
        expansion: float = 0.5,
        act: str = "silu",
        eps: float = 1e-5,
        out_eps: float = 1e-6,
    ) -> None:
        super().__init__()
        self.c2f = C2fLayer(sum(in_channels), d_model, num_blocks, expansion, act, eps)
        self.norm = LayerNorm2d(d_model, eps=out_eps)

    def forward(self, maps: Sequence[Tensor]) -> Tensor:
        return self.norm(self.c2f(torch.cat(list(maps), dim=1)))
