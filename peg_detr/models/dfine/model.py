"""The D-FINE detector: backbone, D-FINE hybrid encoder, query selection + FDR decoder, denoising training."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from ..rtdetr.denoising import DenoisingGroup
from ..rtdetr.model import RTDETR, full_precision

__all__ = ["DFINE"]


def _layer_dicts(
    logits: Tensor, boxes: Tensor, corners: Tensor, refs: Tensor, teacher: tuple[Tensor, Tensor]
) -> list[dict[str, Tensor]]:
    """``(L, B, N, ...)`` stacks -> one dict per layer, each with the teacher's corners and logits (GO-LSD)."""
    return [
        {"pred_logits": lg, "pred_boxes": bx, "pred_corners": cn, "ref_points": rf,
         "teacher_corners": teacher[0], "teacher_logits": teacher[1]}
        for lg, bx, cn, rf in zip(logits, boxes, corners, refs)
    ]  # fmt: skip


class DFINE(RTDETR):
    """D-FINE (Peng et al., ICLR 2025, "D-FINE: Redefine Regression Task in DETRs as Fine-grained Distribution Refinement").

    RT-DETR's input contract (:class:`~peg_detr.models.rtdetr.RTDETR`, whose size checks,
    ``feature_strides`` / ``encoder_cells`` / ``min_input_side`` and denoising groups it inherits):
    ``forward(samples, targets=None)`` takes a ``(B, 3, H, W)`` tensor, a list of images or an
    :class:`ImageBatch` (the padding mask is ignored) and returns float32

    * in eval: ``pred_logits`` ``(B, Q, C)`` raw sigmoid logits and ``pred_boxes`` ``(B, Q, 4)``
      normalised cxcywh of the decoder's ``eval_idx`` layer;
    * in training, of the last layer: also ``pred_corners`` ``(B, Q, 4 * (N + 1))``,
      ``ref_points`` ``(B, Q, 4)`` (the detached initial boxes the corners are relative to), ``up``
      and ``reg_scale`` (one-element tensors of the weighting function); with ``aux_loss``:
      ``aux_outputs`` (one dict per earlier layer: ``pred_logits, pred_boxes, pred_corners,
      ref_points, teacher_corners, teacher_logits``, the teacher being the last layer),
      ``pre_outputs`` (``pred_logits, pred_boxes`` of layer 0's ``pre_bbox_head``),
      ``enc_aux_outputs`` (one dict: the top-K encoder proposals), ``enc_meta``
      (``{"class_agnostic": False}``);
    * when denoising ran: ``dn_outputs`` (every layer, last included, with the denoising queries'
      last layer as teacher), ``dn_pre_outputs`` and ``dn_meta`` (:attr:`DenoisingGroup.meta`).

    ``targets``: list of ``{"labels": (N,) int64, "boxes": (N, 4) normalised cxcywh}``.
    """

    family = "D-FINE"

    def outputs(self, dec: Any, dn: DenoisingGroup | None) -> dict[str, Any]:
        """RT-DETR's hook (:meth:`RTDETR.outputs`) with D-FINE's outputs: corners, refs, pre-outputs, GO-LSD teachers."""
        logits, boxes = full_precision(dec.logits), full_precision(dec.boxes)
        corners, refs = full_precision(dec.corners), full_precision(dec.refs)
        pre_logits, pre_boxes = full_precision(dec.pre_logits), full_precision(dec.pre_boxes)
        out: dict[str, Any] = {}
        if dn is not None:
            n = dn.queries.shape[1]
            dn_logits, dn_boxes, dn_corners, dn_refs = (t[:, :, :n] for t in (logits, boxes, corners, refs))
            dn_layers = _layer_dicts(
                dn_logits, dn_boxes, dn_corners, dn_refs, (dn_corners[-1], dn_logits[-1])
            )
            # the last denoising layer is its own teacher (the same tensors: its DDF is zero)
            dn_layers[-1].update(
                pred_corners=dn_layers[-1]["teacher_corners"], pred_logits=dn_layers[-1]["teacher_logits"]
            )
            out["dn_outputs"] = dn_layers
            out["dn_pre_outputs"] = {"pred_logits": pre_logits[:, :n], "pred_boxes": pre_boxes[:, :n]}
            out["dn_meta"] = dn.meta
            logits, boxes, corners, refs = (t[:, :, n:] for t in (logits, boxes, corners, refs))
            pre_logits, pre_boxes = pre_logits[:, n:], pre_boxes[:, n:]
        out["pred_logits"], out["pred_boxes"] = logits[-1], boxes[-1]
        if not self.training:
            return out
        out.update(
            pred_corners=corners[-1],
            ref_points=refs[-1],
            up=self.decoder.up,
            reg_scale=self.decoder.reg_scale,
        )
        if self.aux_loss:
            teacher = (out["pred_corners"], out["pred_logits"])  # GO-LSD: the last layer teaches the others
            out["aux_outputs"] = _layer_dicts(logits[:-1], boxes[:-1], corners[:-1], refs[:-1], teacher)
            out["pre_outputs"] = {"pred_logits": pre_logits, "pred_boxes": pre_boxes}
            enc_logits, enc_boxes = full_precision(dec.enc_logits), full_precision(dec.enc_boxes)
            out["enc_aux_outputs"] = [{"pred_logits": enc_logits, "pred_boxes": enc_boxes}]
            out["enc_meta"] = {"class_agnostic": False}
        return out
