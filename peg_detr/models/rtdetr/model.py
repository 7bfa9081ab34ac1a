"""The RT-DETR detector: backbone, hybrid encoder, query selection + decoder, denoising training."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from peg_core.errors import InputError
from peg_core.interop.classes import ClassParam
from peg_core.resize import is_tracing

from ...structures import ImageBatch
from ..common import to_image_batch
from .decoder import RTDETRDecoder
from .denoising import DenoisingGroup, contrastive_denoising_group

__all__ = ["RTDETR", "full_precision"]


def full_precision(x: Tensor) -> Tensor:
    """float16/bfloat16 -> float32 (the losses, matcher and post-processor run in float32)."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _heads(logits: Tensor, boxes: Tensor) -> list[dict[str, Tensor]]:
    """``(L, B, N, C)``, ``(L, B, N, 4)`` -> one ``{"pred_logits", "pred_boxes"}`` per layer."""
    return [{"pred_logits": lg, "pred_boxes": bx} for lg, bx in zip(logits, boxes)]


class RTDETR(nn.Module):
    """RT-DETR (Zhao et al., 2024, "DETRs Beat YOLOs on Real-time Object Detection").

    ``forward(samples, targets=None)`` takes what :class:`peg_detr.models.DETR` takes (a
    ``(B, 3, H, W)`` tensor, a list of ``(3, H_i, W_i)`` images, an :class:`ImageBatch`; the
    padding mask is ignored, as RT-DETR does) and returns float32:

    * ``pred_logits`` ``(B, Q, C)`` raw sigmoid logits (no "no object" class) and
      ``pred_boxes`` ``(B, Q, 4)`` normalised cxcywh, of the decoder's ``eval_idx`` layer in
      eval and its last layer in training;
    * in training with ``aux_loss``: ``aux_outputs`` (the earlier layers) and
      ``enc_aux_outputs`` (one dict: the top-K encoder proposals);
    * when denoising ran (training, ``targets`` given, ``num_denoising > 0``, some boxes):
      ``dn_aux_outputs`` (every layer's denoising queries) and ``dn_meta``
      (:attr:`DenoisingGroup.meta`).

    ``targets``: list of ``{"labels": (N,) int64, "boxes": (N, 4) normalised cxcywh}``.

    The ``Q`` queries are the top-``Q`` cells of the encoder's maps (strides 8, 16, 32), so an
    input needs at least ``Q`` cells: :meth:`min_input_side` (RT-DETR's 300 queries: 113 px).  A
    smaller input is an :class:`~peg_core.errors.InputError` naming its size and that minimum, as
    the reference implementations have no smaller selection either (lyuwenyu/RT-DETR and
    transformers' ``RTDetrModel`` call ``topk(num_queries)`` on the cells, which fails there).
    """

    #: the family's name in messages (a subclass names itself)
    family: str = "RT-DETR"

    def __init__(
        self,
        backbone: nn.Module,
        encoder: nn.Module,
        decoder: RTDETRDecoder,
        *,
        num_classes: int,
        num_queries: int = 300,
        num_denoising: int = 100,
        label_noise_ratio: float = 0.5,
        box_noise_scale: float = 1.0,
        aux_loss: bool = True,
    ) -> None:
        super().__init__()
        if (decoder.num_classes, decoder.num_queries) != (num_classes, num_queries):
            raise ValueError(
                f"the decoder has {decoder.num_classes} classes and {decoder.num_queries} queries; "
                f"the detector was given {num_classes} and {num_queries}"
            )
        self.num_classes, self.num_queries = num_classes, num_queries
        self.num_denoising, self.label_noise_ratio, self.box_noise_scale = (
            num_denoising,
            label_noise_ratio,
            box_noise_scale,
        )
        self.aux_loss = aux_loss
        self.backbone, self.encoder, self.decoder = backbone, encoder, decoder
        # The last row embeds the padding slots of the denoising groups (HF: padding_idx = num_classes).
        self.denoising_class_embed = (
            nn.Embedding(num_classes + 1, decoder.hidden_dim, padding_idx=num_classes)
            if num_denoising > 0
            else None
        )
        if self.denoising_class_embed is not None:
            nn.init.xavier_uniform_(self.denoising_class_embed.weight)

    def class_parameters(self) -> tuple[ClassParam, ...]:
        """The tensors with a row per class: every decoder layer's score head, the encoder's score
        head (query selection) and the denoising class embedding (its last row embeds padding)."""
        heads = [f"decoder.class_embed.{i}" for i in range(len(self.decoder.class_embed))]
        params = [
            ClassParam(f"{h}.{p}") for h in (*heads, "decoder.enc_score_head") for p in ("weight", "bias")
        ]
        if self.denoising_class_embed is not None:
            params.append(ClassParam("denoising_class_embed.weight", extra=1))
        return tuple(params)

    @property
    def feature_strides(self) -> list[int]:
        """Strides of the backbone maps the encoder and the query selection work on (RT-DETR: 8, 16, 32).

        A backbone names them ``out_strides`` (ResNet-vd) or ``strides`` (HGNetv2).
        """
        strides = getattr(self.backbone, "out_strides", None) or self.backbone.strides
        return list(strides)

    def encoder_cells(self, height: int, width: int) -> int:
        """Cells of the encoder's maps for a ``height`` x ``width`` px input: the queries' candidates.

        Each backbone map is ``ceil(H / s) x ceil(W / s)`` (:class:`ResNetVd`), and the hybrid encoder
        keeps those shapes.
        """
        return sum(math.ceil(height / s) * math.ceil(width / s) for s in self.feature_strides)

    def min_input_side(self) -> int:
        """The smallest side ``n`` of an ``n`` x ``n`` input with at least :attr:`num_queries` encoder cells."""
        side = 1
        while self.encoder_cells(side, side) < self.num_queries:  # cells grow with the side
            side += 1
        return side

    def check_input_size(self, height: int, width: int, where: Any = None) -> None:
        """An :class:`~peg_core.errors.InputError` when a ``height`` x ``width`` input has fewer cells than queries.

        ``where`` names the setting the size comes from (default: the size itself).
        """
        cells = self.encoder_cells(height, width)
        if cells < self.num_queries:
            side = self.min_input_side()
            raise InputError(
                f"input too small for {self.family}'s {self.num_queries} queries, chosen among the encoder's "
                f"cells ({height} x {width} px gives {cells} cells; at least {side} x {side} px needed)",
                f"{height} x {width} px" if where is None else where,
            )

    def denoising_group(self, targets: list[dict[str, Any]] | None) -> DenoisingGroup | None:
        """The contrastive denoising queries of a training batch, or None (eval, no targets, none wanted)."""
        if not self.training or targets is None or self.denoising_class_embed is None:
            return None
        return contrastive_denoising_group(
            targets,
            self.num_classes,
            self.num_queries,
            self.denoising_class_embed,
            num_denoising=self.num_denoising,
            label_noise_ratio=self.label_noise_ratio,
            box_noise_scale=self.box_noise_scale,
        )

    def forward(
        self, samples: ImageBatch | Tensor | Sequence[Tensor], targets: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        """Checks the input size, runs backbone, encoder and decoder; :meth:`outputs` reads the decoder's result."""
        images = to_image_batch(samples).tensors
        size = images.shape[-2:]
        # Eager only: an exported graph keeps the size symbolic (no Python branch on it).
        if not (is_tracing(size) or torch.compiler.is_exporting() or torch.jit.is_tracing()):
            self.check_input_size(int(size[0]), int(size[1]))
        feats = self.encoder(self.backbone(images))
        dn = self.denoising_group(targets)
        return self.outputs(self.decoder(feats, dn), dn)

    def outputs(self, dec: Any, dn: DenoisingGroup | None) -> dict[str, Any]:
        """The hook a family overrides: its decoder's result -> the output dict (class docstring), float32.

        ``dec`` holds ``logits`` ``(L, B, N, C)``, ``boxes`` ``(L, B, N, 4)`` per decoder layer and
        ``enc_logits`` / ``enc_boxes`` of the encoder's proposals; the first ``dn.queries.shape[1]``
        of the ``N`` queries are the denoising ones when ``dn`` is given.
        """
        logits, boxes = full_precision(dec.logits), full_precision(dec.boxes)
        out: dict[str, Any] = {}
        if dn is not None:
            n_dn = dn.queries.shape[1]
            out["dn_aux_outputs"] = _heads(logits[:, :, :n_dn], boxes[:, :, :n_dn])
            out["dn_meta"] = dn.meta
            logits, boxes = logits[:, :, n_dn:], boxes[:, :, n_dn:]
        out["pred_logits"], out["pred_boxes"] = logits[-1], boxes[-1]
        if self.training and self.aux_loss:
            out["aux_outputs"] = _heads(logits[:-1], boxes[:-1])
            out["enc_aux_outputs"] = _heads(
                full_precision(dec.enc_logits)[None], full_precision(dec.enc_boxes)[None]
            )
        return out
