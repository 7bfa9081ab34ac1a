"""``RFDETRConfig``: RF-DETR's settings, one typed source (defaults: transformers' ``RfDetrConfig()``).

The defaults are those of transformers' ``RfDetrConfig()`` (its "Roboflow/rf-detr-base style"
configuration: a DINOv2-S ViT, 384 wide, 12 blocks, 6 heads, patch 14, a 37 x 37 table
(``image_size`` 518), 4 x 4 windows, features after blocks 1 / 4 / 7 / 10 (transformers' stages
2, 5, 8, 11); ``hidden_dim`` 256, 3 decoder layers with 8 / 16 self / cross heads and 4 points,
FFN 2048, dropout 0.1, 300 queries, 13 Group DETR groups), so ``RFDETRConfig()`` builds the model
``RfDetrForObjectDetection(RfDetrConfig())`` is.  :data:`RFDETR_SIZES` holds the published sizes
(roboflow/rf-detr ``config.py``; the package docstring of :mod:`peg_detr.models.rfdetr` has the
table with their COCO AP and sources) as overrides of these defaults; ``tiny`` is the CPU demo's.

Every field that transformers' ``config.json`` holds declares its name there once (``hf``; a
dotted name is a field of ``backbone_config``), and :mod:`peg_detr.interop.hf_rfdetr` reads and
writes the folders from these declarations.  Three fields are not one-to-one and are converted
there: ``out_blocks`` (transformers' ``out_indices`` are stages, block ``k - 1``), ``global_blocks``
(the complement of ``window_block_indexes``) and ``image_size`` (the table's grid times the patch).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from peg_core.registry import EncodingSupport

from ..config import DetectorConfig, option
from ..layers import LAYER_ACTIVATIONS
from ..rtdetr.config import NUM_QUERIES, check_counts
from .backbone import RFDETR_VIT_ENCODINGS, normalize_pos_enc
from .criterion import CLASS_KEY, RFDETR_WEIGHTS

__all__ = ["RFDETR_BACKBONES", "RFDETR_SIZES", "RFDETRConfig"]

#: the backbone names: rf-detr's windowed DINOv2 (its shape in the ``vit_*`` fields)
RFDETR_BACKBONES = ("dinov2_windowed_small",)

#: N / S / M / L: patch 16, 2 x 2 windows, features after blocks 2 / 5 / 8 / 11 (rf-detr's
#: ``out_feature_indexes`` [3, 6, 9, 12]); 2 sampling points; the table at the training resolution
_P16: dict[str, Any] = dict(patch_size=16, num_windows=2, out_blocks=[2, 5, 8, 11], num_points=2)

#: ``size -> RFDETRConfig overrides`` of the published COCO models (rf-detr's ``RFDETR{Nano,Small,
#: Medium,Large,Base}Config``: resolution = table grid x patch, decoder layers, points)
RFDETR_SIZES: dict[str, dict[str, Any]] = {
    "n": dict(**_P16, image_size=384, dec_layers=2),
    "s": dict(**_P16, image_size=512, dec_layers=3),
    "m": dict(**_P16, image_size=576, dec_layers=4),
    "l": dict(**_P16, image_size=704, dec_layers=4),
    "base": dict(
        patch_size=14, num_windows=4, image_size=518, out_blocks=[1, 4, 7, 10], dec_layers=3, num_points=2
    ),
}

#: ``--model-size tiny``: the CPU demo's RF-DETR (a 4-block ViT of width 48, patch 8, 2 x 2 windows,
#: a 12 x 12 table; width 32, 2 decoder layers, 3 groups of 20 queries)
_TINY: dict[str, Any] = dict(
    vit_dim=48, vit_depth=4, vit_heads=2, patch_size=8, image_size=96, num_windows=2, out_blocks=[1, 3],
    hidden_dim=32, num_heads=2, cross_heads=4, dim_feedforward=64, dec_layers=2, num_points=2, num_queries=20,
    group_detr=3, projector_blocks=1, dropout=0.0,
)  # fmt: skip


@dataclass(kw_only=True)
class RFDETRConfig(DetectorConfig):
    """RF-DETR with the chosen backbone position encoding (module docstring: defaults, sizes, Hugging Face names).

    Attributes:
        backbone: ``dinov2_windowed_small`` (:data:`RFDETR_BACKBONES`): the windowed DINOv2 whose
            shape the ``vit_*`` fields give.
        pos_enc: the ViT's encoding (:data:`~.backbone.RFDETR_VIT_ENCODINGS`): ``learned`` (RF-DETR's
            table, ``table`` is read as it; interpolated as transformers does), ``none``, ``peg``
            (zero-initialised after the blocks of ``peg_at``: computes what ``none`` computes until it
            trains), ``learned+peg``, rotary and bias kinds.
        peg_at: the blocks a PEG follows (CPVT: block 0).
        vit_dim, vit_depth, vit_heads, mlp_ratio, patch_size, layer_scale, drop_path_rate: the ViT.
        image_size: the table's pre-training side (grid ``image_size // patch_size``).
        num_windows: ``nw``: windowed blocks attend in ``nw x nw`` windows; an input side is padded to
            a multiple of ``patch_size * num_windows`` (:meth:`~.model.RFDETR.forward`).
        out_blocks: the blocks whose outputs the projector reads (0-based).
        global_blocks: the blocks attending over the whole image (None: transformers' rule, the
            block after each of ``out_blocks`` and every block past the last one's successor).
        hidden_dim, projector_blocks, projector_expansion, projector_act, layer_norm_eps: the
            projector (its width is the decoder's).
        dec_layers, num_heads, cross_heads, dim_feedforward, dropout, attention_dropout,
            decoder_activation, num_points: the decoder (self / cross attention heads: 8 / 16).
        num_queries, group_detr: queries per group, Group DETR groups in training (one in eval).
        aux_loss: losses on every decoder layer and the encoder proposals.
        cls_loss_coef, bbox_loss_coef, giou_loss_coef: the IA-BCE, L1 and GIoU weights (1, 5, 2).
    """

    TITLE = "RF-DETR"
    ENCODINGS: ClassVar[EncodingSupport] = RFDETR_VIT_ENCODINGS
    SIZES: ClassVar[Mapping[str, Mapping[str, Any]]] = {**RFDETR_SIZES, "tiny": _TINY}

    backbone: str = "dinov2_windowed_small"
    pos_enc: str = "learned"
    peg_at: Sequence[int] | int | str = (0,)
    num_classes: int = 80
    # the ViT (transformers' backbone_config)
    vit_dim: int = option(384, hf="backbone_config.hidden_size")
    vit_depth: int = option(12, hf="backbone_config.num_hidden_layers")
    vit_heads: int = option(6, hf="backbone_config.num_attention_heads")
    mlp_ratio: int = option(4, hf="backbone_config.mlp_ratio")
    patch_size: int = option(14, hf="backbone_config.patch_size")
    image_size: int = 518  # backbone_config.image_size (hf_rfdetr: the table's grid x patch)
    num_windows: int = option(
        4, flag="--num-windows", type="positive_int", hf="backbone_config.num_windows",
        help="windows per side of the ViT's windowed blocks (inputs padded to a multiple of patch x windows)",
    )  # fmt: skip
    out_blocks: Sequence[int] = (1, 4, 7, 10)  # backbone_config.out_indices - 1
    global_blocks: Sequence[int] | None = None  # not backbone_config.window_block_indexes
    layer_scale: float = option(1.0, hf="backbone_config.layerscale_value")
    drop_path_rate: float = option(0.0, hf="backbone_config.drop_path_rate")
    vit_norm_eps: float = option(1e-6, hf="backbone_config.layer_norm_eps")
    # the projector
    hidden_dim: int = option(256, hf="d_model")
    projector_blocks: int = option(3, hf="c2f_num_blocks")
    projector_expansion: float = option(0.5, hf="hidden_expansion")
    projector_act: str = option("silu", hf="activation_function")
    layer_norm_eps: float = option(1e-5, hf="layer_norm_eps")
    # the decoder
    dec_layers: int = 3
    num_heads: int = option(8, hf="decoder_self_attention_heads")
    cross_heads: int = option(16, hf="decoder_cross_attention_heads")
    dim_feedforward: int = option(2048, hf="decoder_ffn_dim")
    dropout: float = 0.1
    attention_dropout: float = option(0.0, hf="attention_dropout")
    decoder_activation: str = option("relu", hf="decoder_activation_function")
    num_points: int = option(4, hf="decoder_n_points")
    num_queries: int = NUM_QUERIES
    group_detr: int = option(
        13, flag="--group-detr", type="positive_int", hf="group_detr",
        help="Group DETR: query groups in training, each matched one-to-one (RF-DETR 13; eval runs one)",
    )  # fmt: skip
    aux_loss: bool = True
    cls_loss_coef: float = option(RFDETR_WEIGHTS[CLASS_KEY], hf="class_loss_coefficient")
    bbox_loss_coef: float = option(RFDETR_WEIGHTS["loss_bbox"], hf="bbox_loss_coefficient")
    giou_loss_coef: float = option(RFDETR_WEIGHTS["loss_giou"], hf="giou_loss_coefficient")

    def validate(self) -> None:
        """The encoding, the backbone, the counts, every width's head split, the blocks and the activations."""
        normalize_pos_enc(self.pos_enc)
        if self.backbone not in RFDETR_BACKBONES:
            raise ValueError(f"unknown RF-DETR backbone {self.backbone!r}; choose from {RFDETR_BACKBONES}")
        check_counts(self.num_classes, self.num_queries, 0)
        for name, width, heads in (
            ("vit_dim", self.vit_dim, self.vit_heads),
            ("hidden_dim", self.hidden_dim, self.num_heads),
            ("hidden_dim", self.hidden_dim, self.cross_heads),
        ):
            if heads < 1 or width % heads:
                raise ValueError(f"{name}={width} must be divisible by its {heads} heads")
        for name in ("group_detr", "num_windows", "patch_size", "dec_layers", "vit_depth", "num_points"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1; got {getattr(self, name)}")
        if self.image_size < self.patch_size:
            raise ValueError(f"image_size={self.image_size} is smaller than patch_size={self.patch_size}")
        blocks = list(self.out_blocks)
        if not blocks or not all(0 <= int(i) < self.vit_depth for i in blocks):
            raise ValueError(f"out_blocks must be block indices 0..{self.vit_depth - 1}; got {blocks}")
        for name in ("projector_act", "decoder_activation"):
            if getattr(self, name) not in LAYER_ACTIVATIONS:
                raise ValueError(
                    f"{name} must be one of {sorted(LAYER_ACTIVATIONS)}; got {getattr(self, name)!r}"
                )

    def vit_options(self) -> dict[str, Any]:
        """The keywords of :func:`~.backbone.build_windowed_vit` (the ViT's fields)."""
        return dict(
            embed_dim=self.vit_dim, depth=self.vit_depth, num_heads=self.vit_heads, mlp_ratio=self.mlp_ratio,
            patch_size=self.patch_size, image_size=self.image_size, out_blocks=list(self.out_blocks),
            global_blocks=None if self.global_blocks is None else list(self.global_blocks),
            num_windows=self.num_windows, pos_enc=self.pos_enc, peg_at=_blocks(self.peg_at),
            layer_scale=self.layer_scale, norm_eps=self.vit_norm_eps, drop_path_rate=self.drop_path_rate,
        )  # fmt: skip


def _blocks(value: Sequence[int] | int | str) -> list[int] | str:
    """``peg_at`` as the ViT takes it: block indices, or ``"all"``."""
    if isinstance(value, str):
        return value
    return [int(value)] if isinstance(value, int) else [int(i) for i in value]
