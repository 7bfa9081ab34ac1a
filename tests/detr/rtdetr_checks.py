"""Checks shared by the RT-DETR tests: the top-K query selection's margin, non-trivial BN statistics.

RT-DETR picks its decoder queries as the top-K cells by score.  Two backends (PyTorch and
onnxruntime, or an unfused and a fused model) round the scores differently by ~1e-6, so two cells
closer than that may swap, and the outputs then differ by far more than any tolerance.  A test
that compares two such computations first checks :func:`topk_margin`: a failure then says "near
tie" instead of a wrong output.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torchvision.ops import FrozenBatchNorm2d


def cell_scores(model: nn.Module, x: Tensor) -> Tensor:
    """The query selection's score of every memory cell: ``(B, S)`` (max over classes of the encoder head)."""
    with torch.no_grad():
        if hasattr(model, "cell_scores"):  # a family that computes them itself (RF-DETR: no encoder)
            return model.cell_scores(x)
        memory, shapes = model.decoder.flatten_features(model.encoder(model.backbone(x)))
        _, logits, _ = model.decoder.score_cells(memory, shapes)
    return logits.max(-1).values


def outputs_and_cell_scores(model: nn.Module, x: Tensor) -> tuple[dict[str, Tensor], Tensor]:
    """``model(x)`` (eval, no grad) and the cell scores of that same call (:func:`cell_scores`), in one pass."""
    seen: list[Tensor] = []
    # the encoder score head runs once per call, on every cell: (B, S, C)
    handle = model.decoder.enc_score_head.register_forward_hook(lambda _m, _i, out: seen.append(out))
    try:
        with torch.no_grad():
            out = model(x)
    finally:
        handle.remove()
    return out, seen[0].max(-1).values


def topk_gap(scores: Tensor, k: int) -> float:
    """Smallest gap between consecutive values of the top ``k`` of each row of ``scores`` ``(B, S)``."""
    top = scores.topk(k, dim=1).values
    return float((top[:, :-1] - top[:, 1:]).min())


def topk_margin(model: nn.Module, x: Tensor) -> float:
    """Smallest gap between consecutive scores of the top ``Q + 1`` cells (the query selection's margin)."""
    return topk_gap(cell_scores(model, x), model.num_queries + 1)


def randomise_norms_and_heads(model: nn.Module, seed: int) -> None:
    """Random BN statistics and affine weights (trainable and frozen BN) and box heads, in place.

    A fresh model's BNs are identities (mean 0, variance 1, weight 1, bias 0) and its box heads
    output zero offsets, so a fold that mixed up mean and variance, or dropped the bias, would go
    unnoticed.  Weights in [0.5, 1.5] and variances in [0.5, 2] keep the activations' scale (and
    the top-K scores apart).
    """
    gen = torch.Generator().manual_seed(seed)

    def fill(t: Tensor, low: float, high: float) -> None:
        t.copy_(torch.rand(t.shape, generator=gen) * (high - low) + low)

    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.BatchNorm2d, FrozenBatchNorm2d)):
                fill(module.weight, 0.5, 1.5)
                fill(module.bias, -0.2, 0.2)
                fill(module.running_mean, -0.2, 0.2)
                fill(module.running_var, 0.5, 2.0)
        for name, p in model.named_parameters():
            if "bbox_embed" in name or "bbox_head" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)


def tiny_rtdetr_config(transformers: Any, **overrides: Any) -> Any:
    """A tiny transformers ``RTDetrConfig`` (basic ResNet of widths 16-128, width 32, 2 decoder layers).

    ``overrides`` replace its fields (``num_labels``, ``id2label``, ``decoder_layers``, ...).  The one
    small RT-DETR folder layout the tests save with ``save_pretrained``.
    """
    backbone = transformers.RTDetrResNetConfig(
        layer_type="basic", depths=[1, 1, 1, 1], hidden_sizes=[16, 32, 64, 128], embedding_size=16,
        out_features=["stage2", "stage3", "stage4"],
    )  # fmt: skip
    fields = dict(
        backbone_config=backbone, encoder_hidden_dim=32, d_model=32, encoder_in_channels=[32, 64, 128],
        decoder_in_channels=[32, 32, 32], encoder_ffn_dim=64, decoder_ffn_dim=64, decoder_layers=2,
        num_queries=20, num_labels=4, anchor_image_size=None, num_denoising=10,
    )  # fmt: skip
    return transformers.RTDetrConfig(**{**fields, **overrides})


def tiny_rfdetr_config(transformers: Any, **overrides: Any) -> Any:
    """A tiny transformers ``RfDetrConfig`` (a 4-block ViT of width 32, patch 4, 2 x 2 windows, a 14 x 14
    table; width 32, 2 decoder layers, 3 groups of 10 queries, 5 labels).

    ``overrides`` replace its fields.  The one small RF-DETR folder layout the tests save with
    ``save_pretrained``.
    """
    backbone = dict(
        model_type="rf_detr_dinov2", hidden_size=32, num_hidden_layers=4, num_attention_heads=2, image_size=56,
        patch_size=4, num_windows=2, out_features=["stage1", "stage2", "stage4"],
    )  # fmt: skip
    fields = dict(
        backbone_config=backbone, d_model=32, decoder_ffn_dim=64, decoder_layers=2, decoder_self_attention_heads=2,
        decoder_cross_attention_heads=4, decoder_n_points=2, num_queries=10, group_detr=3, num_labels=5,
        c2f_num_blocks=1, dropout=0.0,
    )  # fmt: skip
    return transformers.RfDetrConfig(**{**fields, **overrides})
