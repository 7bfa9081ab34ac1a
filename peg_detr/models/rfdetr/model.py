"""The RF-DETR detector: windowed DINOv2 ViT, LW-DETR's projector, Group DETR two-stage decoder."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from peg_core.errors import InputError
from peg_core.interop.classes import ClassParam

from ...structures import ImageBatch
from ..common import to_image_batch
from .backbone import ScaleProjector, WindowedViTBackbone
from .decoder import RFDETRDecoder

__all__ = ["RFDETR", "image_cells"]


def _full_precision(x: Tensor) -> Tensor:
    """float16/bfloat16 -> float32 (the losses, matcher and post-processor run in float32)."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _unpad(boxes: Tensor, sx: float, sy: float) -> Tensor:
    """cxcywh ``(..., 4)`` normalised by the padded image -> by the image (``x * sx``, ``y * sy``; exact at 1)."""
    cx, cy, w, h = boxes.unbind(-1)
    return torch.stack([cx * sx, cy * sy, w * sx, h * sy], dim=-1)


def image_cells(grid: tuple[int, int], height: int, width: int, patch: int, device: torch.device) -> Tensor:
    """``(1, h*w, 1)`` bool, row-major over the padded ``grid`` ``(h, w)``: true where a cell starts inside
    the ``height`` x ``width`` image (its first pixel is the image's), false for cells of the padding.

    A cell partly over the image counts as the image's (transformers' pixel mask, resized to the
    feature map by nearest neighbour, reads each cell's first pixel the same way).
    """
    h, w = grid
    rows = torch.arange(h, device=device) * patch < height
    cols = torch.arange(w, device=device) * patch < width
    return (rows[:, None] & cols[None, :]).reshape(1, h * w, 1)


def _heads(logits: Tensor, boxes: Tensor) -> list[dict[str, Tensor]]:
    """``(L, B, N, C)``, ``(L, B, N, 4)`` -> one ``{"pred_logits", "pred_boxes"}`` per layer."""
    return [{"pred_logits": lg, "pred_boxes": bx} for lg, bx in zip(logits, boxes)]


class RFDETR(nn.Module):
    """RF-DETR (Robinson et al., 2025, "RF-DETR: Neural Architecture Search for Real-Time Detection Transformers").

    ``forward(samples, targets=None)`` takes what the suite's detectors take (a ``(B, 3, H, W)``
    tensor of ``[0, 1]`` pixels, a list of same-size images, an :class:`ImageBatch`; the padding
    mask is ignored) and returns float32, as :class:`~peg_detr.models.rtdetr.RTDETR` does:

    * ``pred_logits`` ``(B, N, C)`` sigmoid logits (no "no object" class) and ``pred_boxes``
      ``(B, N, 4)`` normalised cxcywh of the last decoder layer; ``N = Q`` in eval (group 0) and
      ``G * Q`` in training (all Group DETR groups, group ``g`` at rows ``g*Q:(g+1)*Q``);
    * in training with ``aux_loss``: ``aux_outputs`` (the earlier layers, all groups) and
      ``enc_aux_outputs`` (one dict: every group's ``Q`` selected cells with that group's score
      and box heads);
    * in training: ``num_groups`` ``G``, so a criterion matches each group of ``Q`` queries to the
      targets on its own (Group DETR: one-to-one within a group, ``G`` matches per image).

    ``targets`` are accepted for the suite's calling convention; RF-DETR has no denoising queries,
    so they change nothing here.

    The size rule: the windows must tile the patch grid, so a side that is no multiple of
    ``m = patch_size * num_windows`` is padded at the bottom / right to the next multiple (with the
    mean colour, zero after standardisation, as transformers' processor pads) and the boxes are
    mapped back to the unpadded image (``cx * W' / W``...; a box may reach past 1 into the padding).
    Cells of the padding (:func:`image_cells`) are no proposals: the query selection scores them
    ``-inf``, so every query starts from a cell of the image.  At multiples of ``m`` (every
    published size's resolution) nothing is padded and the outputs are transformers'.
    :meth:`check_input_size` refuses only inputs with fewer image cells than queries.
    """

    def __init__(
        self,
        backbone: WindowedViTBackbone,
        projector: ScaleProjector,
        decoder: RFDETRDecoder,
        *,
        aux_loss: bool = True,
    ) -> None:
        super().__init__()
        self.backbone, self.projector, self.decoder = backbone, projector, decoder
        self.num_classes, self.num_queries = decoder.num_classes, decoder.num_queries
        self.group_detr = decoder.group_detr
        self.aux_loss = aux_loss

    def class_parameters(self) -> tuple[ClassParam, ...]:
        """The tensors with a row per class: the decoder's score head and every group's encoder score head."""
        heads = ["decoder.class_embed"] + [f"decoder.enc_out_class_embed.{g}" for g in range(self.group_detr)]
        return tuple(ClassParam(f"{h}.{p}") for h in heads for p in ("weight", "bias"))

    @property
    def feature_strides(self) -> list[int]:
        """The stride of the one map the decoder reads (the ViT's patch)."""
        return [self.backbone.patch_size]

    def padded_size(self, height: int, width: int) -> tuple[int, int]:
        """The input size the backbone runs at: each side rounded up to a multiple of ``patch_size * num_windows``."""
        m = self.backbone.size_multiple
        return -(-height // m) * m, -(-width // m) * m

    def check_input_size(self, height: int, width: int, where: Any = None) -> None:
        """An :class:`~peg_core.errors.InputError` when a ``height`` x ``width`` input has fewer cells than
        ``num_queries`` (the query selection takes that many among the image's cells, not its padding's);
        ``where``: the setting the size comes from."""
        p = self.backbone.patch_size
        cells = -(-height // p) * -(-width // p)
        if cells < self.num_queries:
            side = math.isqrt(self.num_queries - 1) + 1  # cells per side of the smallest square that holds Q
            raise InputError(
                f"input too small for RF-DETR's {self.num_queries} queries, chosen among the image's cells "
                f"({height} x {width} px gives {cells} cells of {p} px; at least {side * p} x {side * p} px needed)",
                f"{height} x {width} px" if where is None else where,
            )

    def memory(
        self, samples: ImageBatch | Tensor | Sequence[Tensor]
    ) -> tuple[Tensor, tuple[int, int], tuple[float, float], Tensor]:
        """The decoder's memory ``(B, S, D)`` of ``samples``, its grid ``(h, w)`` (``S = h * w``, of the padded
        image), the factors ``(sx, sy)`` that map its boxes to the unpadded image and the cells of the
        image ``(1, S, 1)`` bool (:func:`image_cells`; all true when nothing is padded)."""
        images = to_image_batch(samples).tensors
        feat = self.projector(self.backbone(images, pad=True))  # (B, D, h, w) of the padded image
        p = self.backbone.patch_size
        grid = (feat.shape[-2], feat.shape[-1])
        scale = (feat.shape[-1] * p / images.shape[-1], feat.shape[-2] * p / images.shape[-2])
        cells = image_cells(grid, images.shape[-2], images.shape[-1], p, feat.device)
        return feat.flatten(2).transpose(1, 2), grid, scale, cells

    def cell_scores(self, samples: ImageBatch | Tensor | Sequence[Tensor]) -> Tensor:
        """``(B, S)``: every backbone cell's score in the (eval) query selection, which takes the top ``num_queries``
        (``-inf``: an invalid cell or one of the padding)."""
        memory, shape, _, cells = self.memory(samples)
        return self.decoder.cell_scores(memory, [shape], cell_mask=cells)

    def forward(
        self, samples: ImageBatch | Tensor | Sequence[Tensor], targets: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        memory, shape, (sx, sy), cells = self.memory(samples)
        dec = self.decoder(memory, [shape], cells)
        # boxes of the padded image -> of the image (a factor 1 at multiples of the windows' size)
        logits, boxes = _full_precision(dec.logits), _full_precision(_unpad(dec.boxes, sx, sy))
        out: dict[str, Any] = {"pred_logits": logits[-1], "pred_boxes": boxes[-1]}
        if self.training:
            out["num_groups"] = dec.groups
            if self.aux_loss:
                out["aux_outputs"] = _heads(logits[:-1], boxes[:-1])
                out["enc_aux_outputs"] = _heads(
                    _full_precision(dec.enc_logits)[None],
                    _full_precision(_unpad(dec.enc_boxes, sx, sy))[None],
                )
        return out
