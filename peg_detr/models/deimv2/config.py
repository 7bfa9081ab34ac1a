"""``DEIMv2Config``: DEIMv2's settings, one typed source (defaults: DEIMv2-S's decoder shape, a DINOv3 ViT-Tiny).

DEIMv2 is not D-FINE's config extended: it has its own encoder (hybrid or lite, one width for
encoder and decoder), decoder (SwiGLU, gateway, shared heads) and backbones (DINOv3 + STA or
HGNetv2), and lacks D-FINE's learned table and PEG variants; the fields they share carry the same
names, flags and Hugging Face names (:data:`peg_detr.models.config.COMMON`).
:data:`DEIMV2_SIZES` holds the published sizes as overrides of the defaults.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from peg_core.registry import EncodingSupport, parse_pos_enc

from ..config import DetectorConfig, option
from ..dfine.criterion import DFINE_WEIGHTS
from ..rtdetr.config import NUM_QUERIES, check_counts
from ..rtdetr.encoder import AIFI_ENCODINGS
from .backbone import DINOV3_VITS

__all__ = ["DEIMV2_LOSSES", "DEIMV2_SIZES", "DEIMv2Config"]

#: DEIMv2's losses: MAL, L1 + GIoU, FGL + DDF (atto / femto / pico train without ``local``)
DEIMV2_LOSSES = ("mal", "boxes", "local")

#: DEIMv2's published sizes (Intellindust-AI-Lab/DEIMv2 ``configs/deimv2/deimv2_*_coco.yml``, as overrides of
#: :class:`DEIMv2Config`'s defaults; COCO AP
#: 23.8 / 31.0 / 38.5 / 43.0 / 50.9 / 53.0 / 56.0 / 57.8 for atto .. X, not reproduced here).  X
#: (``dinov3_vits16plus``, a SwiGLU ViT: hidden 256, STA 64, expansion 1.25, depth 1.37, 6 decoder
#: layers, FFN 2048) is not buildable (CPVT's blocks have a GELU MLP).  The ViT blocks feeding the
#: three scales are ``vit_out_indices=(5, 8, 11)`` (DEIMv2's README; a third-party copy of the S / M
#: configs lists ``[3, 7, 11]``).  Parameter counts built here (80 classes): atto 0.51 M, femto 0.99 M,
#: pico 1.55 M, N 3.62 M, S 9.82 M, M 18.42 M, L 32.6 M (published 0.5 / 1.0 / 1.5 / 3.6 / 9.7 / 18.1 / 32.2).
DEIMV2_SIZES: dict[str, dict[str, Any]] = {
    "atto": dict(losses=["mal", "boxes"], pos_enc="none", backbone="hgnetv2_atto", hgnet_return_idx=[2],
                 encoder="lite", hidden_dim=64, encoder_expansion=0.34, depth_mult=0.5, dec_layers=3,
                 dim_feedforward=160, num_queries=100, num_points=[4, 2], share_bbox_head=True, use_gateway=False,
                 trailing_conv=True),
    "femto": dict(losses=["mal", "boxes"], pos_enc="none", backbone="hgnetv2_femto", hgnet_return_idx=[2],
                  encoder="lite", hidden_dim=96, encoder_expansion=0.34, depth_mult=0.5, dec_layers=3,
                  dim_feedforward=256, num_queries=150, num_points=[4, 2], share_bbox_head=True, use_gateway=False,
                  trailing_conv=True),
    "pico": dict(losses=["mal", "boxes"], pos_enc="none", backbone="hgnetv2_pico", hgnet_return_idx=[2],
                 encoder="lite", hidden_dim=112, encoder_expansion=0.34, depth_mult=0.5, dec_layers=3,
                 dim_feedforward=320, num_queries=200, num_points=[4, 2], share_bbox_head=True, use_gateway=False,
                 trailing_conv=True),
    "n": dict(backbone="hgnetv2_b0", hgnet_return_idx=[2, 3], encoder="hybrid", hidden_dim=128,
              enc_dim_feedforward=512, encoder_expansion=0.34, depth_mult=0.5, dec_layers=3, dim_feedforward=512,
              num_queries=NUM_QUERIES, num_points=[6, 6], trailing_conv=True),
    "s": dict(backbone="vit_tiny", hidden_dim=192, enc_dim_feedforward=512, encoder_expansion=0.34, depth_mult=0.67,
              dec_layers=4, dim_feedforward=512, num_queries=NUM_QUERIES, num_points=[3, 6, 3]),
    "m": dict(backbone="vit_tinyplus", hidden_dim=256, enc_dim_feedforward=512, encoder_expansion=0.67,
              depth_mult=1.0, dec_layers=4, dim_feedforward=512, num_queries=NUM_QUERIES, num_points=[3, 6, 3]),
    "l": dict(backbone="dinov3_vits16", hidden_dim=224, enc_dim_feedforward=896, encoder_expansion=1.0,
              depth_mult=1.0, dec_layers=4, dim_feedforward=1792, num_queries=NUM_QUERIES, num_points=[3, 6, 3],
              sta_inplanes=32),
}  # fmt: skip

#: ``--model-size tiny``: the CPU demo's DEIMv2 (a 4-block, 32-wide DINOv3 ViT with the STA, width 32)
_TINY: dict[str, Any] = dict(
    backbone="vit_tiny", vit_options=dict(embed_dim=32, depth=4, num_heads=2, num_reg_tokens=2),
    vit_out_indices=[1, 2, 3], sta_inplanes=8, hidden_dim=32, num_heads=2, dec_heads=2, enc_dim_feedforward=64,
    dim_feedforward=64, dec_layers=2, encoder_expansion=0.5, depth_mult=0.34,
)  # fmt: skip


@dataclass(kw_only=True)
class DEIMv2Config(DetectorConfig):
    """DEIMv2 with the chosen AIFI position encoding.

    Attributes:
        backbone: a DINOv3 ViT of :data:`DINOV3_VITS` (STA + hybrid encoder, strides 8/16/32) or
            ``hgnetv2_*`` (D-FINE's HGNetv2; ``hgnet_return_idx`` stages; ``hgnetv2_custom``: the layout
            in ``hgnet_options``).
        pos_enc: AIFI's encoding (the hybrid encoder's; the lite encoder has no attention: ``none``): ``sincos``
            for the actual size, ``peg`` (zero-initialised), ``none``, rotary kinds, biases.  The
            DINOv3 ViT always uses its own ``rope-dinov3`` rotation, rebuilt for every input size.
        encoder: ``"hybrid"`` or ``"lite"`` (atto / femto / pico).
        hidden_dim: width of the encoder and decoder (DEIMv2 uses one width for both).
        num_heads, enc_layers, enc_dim_feedforward: AIFI's.
        encoder_expansion, depth_mult, trailing_conv, fuse_op: the encoder's CSP blocks and fusion.
        dec_layers, dec_heads, dim_feedforward (SwiGLU: half of it hidden), dropout, num_queries,
            num_points (int or one per level), max_num_bins, reg_scale, up, use_gateway,
            share_bbox_head, query_pos_act: the decoder's.
        num_denoising, label_noise_ratio, box_noise_scale, aux_loss: training outputs.
        vit_out_indices, vit_options, sta_inplanes, vit_layer_scale, vit_apply_layernorm, vit_final_norm,
            drop_path_rate: the DINOv3 backbone's blocks, ViT keywords (shape, ``rope_temperature``, ...),
            STA width, layer-scale init, LayerNorm on the selected / last block (``"preset"`` / None:
            the ViT preset's; :func:`~peg_detr.models.deimv2.backbone.build_dinov3_sta`), stochastic depth.
        use_encoder_idx, temperature: AIFI's levels and sin-cos temperature.
        offset_scale, lqe_hidden_dim, lqe_layers, lqe_k, learn_initial_query, layer_norm_eps,
            batch_norm_eps: as :class:`~peg_detr.models.deimv2.decoder.DEIMv2Decoder`.
        hgnet_return_idx, hgnet_options, freeze_backbone_bn: the HGNetv2's returned stages, explicit
            layout (``stem_channels``, ``stages``, ``use_lab``: ``build_hgnetv2``'s; DEIMv2's Atto /
            Femto / Pico layouts are not presets there and come from a config this way) and frozen BN.
        peg_at, peg_kernel_size: the PEG's place and kernel in AIFI.
        *_loss_coef, losses, focal_alpha, focal_gamma, mal_alpha, use_uni_set: the criterion
            (``deimv2_training_parts``; DEIMv2: MAL 1, L1 5, GIoU 2, FGL 0.15, DDF 1.5, alpha
            0.75, gamma 2, dense one-to-one matching of the box losses).
    """

    TITLE = "DEIMv2"
    ENCODINGS: ClassVar[EncodingSupport] = AIFI_ENCODINGS
    SIZES: ClassVar[Mapping[str, Mapping[str, Any]]] = {**DEIMV2_SIZES, "tiny": _TINY}

    backbone: str = "vit_tiny"
    pos_enc: str = "sincos"
    num_classes: int = 80
    # the one width: the export writes it as encoder_hidden_dim too (the lite encoder has no hparams of it)
    hidden_dim: int = option(192, hf="d_model", where="decoder.hidden_dim")
    encoder: str = option("hybrid", hf="encoder_type")
    num_heads: int = option(8, hf="encoder_attention_heads", where="encoder.num_heads")
    enc_layers: int = 1
    enc_dim_feedforward: int = option(1024, hf="encoder_ffn_dim", where="encoder.dim_feedforward")
    encoder_expansion: float = 1.0
    depth_mult: float = option(1.0, hf="depth_mult", where="encoder.depth_mult")
    trailing_conv: bool = option(False, hf="encoder_has_trailing_conv", where="encoder.trailing_conv")
    fuse_op: str = option("sum", hf="encoder_fuse_op", where="encoder.fuse_op")
    use_encoder_idx: Sequence[int] = (-1,)
    temperature: float = option(10000.0, hf="positional_encoding_temperature", where="encoder.temperature")
    dec_layers: int = 6
    dec_heads: int = option(8, hf="decoder_attention_heads", where="decoder.num_heads")
    dim_feedforward: int = option(1024, hf="decoder_ffn_dim", where="decoder.dim_feedforward")
    dropout: float = option(0.0, where="decoder.dropout")  # one value; the export writes the decoder's
    num_queries: int = NUM_QUERIES
    num_points: int | Sequence[int] = option(4, hf="decoder_n_points", where="decoder.num_points")
    offset_scale: float = option(0.5, hf="decoder_offset_scale", where="decoder.offset_scale")
    max_num_bins: int = option(32, hf="max_num_bins", where="decoder.max_num_bins")
    reg_scale: float = option(4.0, hf="reg_scale", where="decoder.reg_scale")
    up: float = option(0.5, hf="up", where="decoder.up")
    use_gateway: bool = option(True, hf="use_gateway", where="decoder.use_gateway")
    share_bbox_head: bool = option(False, hf="share_bbox_head", where="decoder.share_bbox_head")
    query_pos_act: str = option("relu", hf="decoder_activation_function", where="decoder.query_pos_act")
    lqe_hidden_dim: int = option(64, hf="lqe_hidden_dim", where="decoder.lqe_hidden_dim")
    lqe_layers: int = option(2, hf="lqe_layers", where="decoder.lqe_layers")
    lqe_k: int = option(4, hf="top_prob_values", where="decoder.lqe_k")
    learn_initial_query: bool = option(False, hf="learn_initial_query", where="decoder.learn_initial_query")
    layer_norm_eps: float = option(1e-5, hf="layer_norm_eps", where="decoder.layer_norm_eps")
    batch_norm_eps: float = option(1e-5, hf="batch_norm_eps", where="decoder.batch_norm_eps")
    num_denoising: int = 100
    label_noise_ratio: float = 0.5
    box_noise_scale: float = 1.0
    aux_loss: bool = True
    vit_out_indices: Sequence[int] = (5, 8, 11)
    vit_options: dict[str, Any] | None = None
    sta_inplanes: int = 16
    vit_layer_scale: float | str | None = "preset"
    vit_apply_layernorm: bool | None = None
    vit_final_norm: bool | None = None
    drop_path_rate: float = 0.0
    hgnet_return_idx: Sequence[int] = (2, 3)
    hgnet_options: dict[str, Any] | None = None
    freeze_backbone_bn: bool = False
    peg_at: Sequence[int] | int | str = (-1,)
    peg_kernel_size: int = 3
    # the weights' defaults are D-FINE's criterion's (DEIMv2 keeps them; MAL weighs as VFL did)
    mal_loss_coef: float = DFINE_WEIGHTS["loss_mal"]
    bbox_loss_coef: float = DFINE_WEIGHTS["loss_bbox"]
    giou_loss_coef: float = DFINE_WEIGHTS["loss_giou"]
    fgl_loss_coef: float = DFINE_WEIGHTS["loss_fgl"]
    ddf_loss_coef: float = DFINE_WEIGHTS["loss_ddf"]
    losses: Sequence[str] = DEIMV2_LOSSES
    focal_alpha: float = 0.75
    focal_gamma: float = 2.0
    mal_alpha: float | None = None
    use_uni_set: bool = True

    def validate(self) -> None:
        """The encoding and encoder (refused before any backbone is built), the counts, the backbone's name."""
        parse_pos_enc(self.pos_enc, type(self).ENCODINGS)
        if self.encoder not in ("hybrid", "lite"):
            raise ValueError(f"encoder must be 'hybrid' or 'lite'; got {self.encoder!r}")
        if self.encoder == "lite" and self.pos_enc != "none":
            raise ValueError(
                f"the lite encoder has no attention and no position encoding: pos_enc='none', not {self.pos_enc!r}"
            )
        check_counts(self.num_classes, self.num_queries, self.num_denoising)
        if self.backbone in DINOV3_VITS:
            if self.encoder != "hybrid":
                raise ValueError("the DINOv3 backbones feed the hybrid encoder")
        elif not self.backbone.startswith("hgnetv2_"):
            raise ValueError(
                f"unknown DEIMv2 backbone {self.backbone!r}; choose from {sorted(DINOV3_VITS)} or hgnetv2_*"
            )
