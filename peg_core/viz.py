"""Cosine-similarity maps of position encodings (the ViT paper's figure), written as PNG.

For a grid ``H×W`` of codes, the map of position ``(i, j)`` is the cosine
similarity of its code with every other position's: an ``H×W`` image.  The
figure tiles all ``H*W`` small maps in grid order.  Works for a learned table
and for the codes a PEG produces on a constant input (position then comes
only from the zero padding at the border).

matplotlib is an optional extra, imported only when a PNG is drawn.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from .errors import require
from .peg import PEG2d

__all__ = [
    "cosine_similarity_map",
    "peg_position_codes",
    "plot_peg_similarity",
    "plot_similarity",
    "plot_table_similarity",
    "similarity_mosaic",
]


def cosine_similarity_map(codes: Tensor, size: tuple[int, int], num_prefix_tokens: int = 0) -> Tensor:
    """Pairwise cosine similarity of the grid codes.

    Args:
        codes: ``(1, P + H*W, C)`` or ``(P + H*W, C)`` table (row-major grid after ``P`` prefix rows).
        size: grid ``(H, W)``.
        num_prefix_tokens: leading rows that are not on the grid (class token).

    Returns:
        float32 ``(H, W, H, W)``: ``out[i, j]`` is the map for position ``(i, j)``.
        A zero code has similarity 0 with everything.
    """
    if codes.dim() == 3:
        if codes.shape[0] != 1:
            raise ValueError(f"codes must be (1, N, C) or (N, C); got {tuple(codes.shape)}")
        codes = codes[0]
    h, w = int(size[0]), int(size[1])
    if codes.dim() != 2 or codes.shape[0] != num_prefix_tokens + h * w:
        raise ValueError(
            f"codes of shape {tuple(codes.shape)} do not hold {num_prefix_tokens} prefix rows + {h}x{w} grid"
        )
    g = F.normalize(codes[num_prefix_tokens:].detach().float(), dim=-1)  # zero rows stay zero
    return (g @ g.T).reshape(h, w, h, w)


@torch.no_grad()
def peg_position_codes(peg: PEG2d, size: tuple[int, int], value: float = 1.0) -> Tensor:
    """What ``peg`` adds to a constant input ``value`` on grid ``size``: ``(H*W, C)`` float32.

    Inside the grid every position sees the same neighbourhood, so the codes
    are equal there; they differ only within ``k // 2`` of the border.
    """
    h, w = int(size[0]), int(size[1])
    p = peg.num_prefix_tokens
    weight = peg.proj.weight
    x = torch.full((1, p + h * w, peg.dim), float(value), dtype=weight.dtype, device=weight.device)
    return peg.position(x, (h, w))[0, p:].float().cpu()


def similarity_mosaic(sim: Tensor) -> Tensor:
    """Tile an ``(H, W, H, W)`` similarity into one ``(H*(H+1)-1, W*(W+1)-1)`` image, NaN between tiles."""
    h, w = sim.shape[:2]
    out = torch.full((h * (h + 1) - 1, w * (w + 1) - 1), float("nan"))
    for i in range(h):
        for j in range(w):
            out[i * (h + 1) : i * (h + 1) + h, j * (w + 1) : j * (w + 1) + w] = sim[i, j]
    return out


def plot_similarity(
    sim: Tensor, path: str | os.PathLike, title: str | None = None, tile_inches: float = 0.45, dpi: int = 100
) -> Path:
    """Draw an ``(H, W, H, W)`` similarity (:func:`cosine_similarity_map`) as a PNG of ``H×W`` small maps."""
    require("matplotlib", "viz", what="peg_core.viz")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    h, w = sim.shape[:2]
    mosaic = similarity_mosaic(sim.detach().float().cpu()).numpy()
    # A Figure without pyplot: no global backend state is touched.
    fig = Figure(figsize=(max(2.5, w * tile_inches) + 1.0, max(2.5, h * tile_inches) + 0.5), dpi=dpi)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    im = ax.imshow(mosaic, cmap="viridis", vmin=-1.0, vmax=1.0, interpolation="nearest")
    ax.set_xticks([(w + 1) * j + (w - 1) / 2 for j in range(w)], [str(j + 1) for j in range(w)], fontsize=6)
    ax.set_yticks([(h + 1) * i + (h - 1) / 2 for i in range(h)], [str(i + 1) for i in range(h)], fontsize=6)
    ax.set_xlabel("input patch column")
    ax.set_ylabel("input patch row")
    if title:
        ax.set_title(title)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="cosine similarity")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", bbox_inches="tight")
    return path


def plot_table_similarity(
    table: Tensor,
    size: tuple[int, int],
    path: str | os.PathLike,
    num_prefix_tokens: int = 0,
    title: str | None = "position table similarity",
) -> Path:
    """PNG of the similarity map of a learned table ``(1, P + H*W, C)``."""
    return plot_similarity(cosine_similarity_map(table, size, num_prefix_tokens), path, title)


def plot_peg_similarity(
    peg: PEG2d,
    size: tuple[int, int],
    path: str | os.PathLike,
    value: float = 1.0,
    title: str | None = "PEG codes on a constant input",
) -> Path:
    """PNG of the similarity map of the codes ``peg`` produces for a constant input on grid ``size``."""
    return plot_similarity(cosine_similarity_map(peg_position_codes(peg, size, value), size), path, title)
