"""Build any video model of the project by name: the PEG video transformers and the X3D baselines."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from peg_core.peg import fold_peg_keys

from .vit import VideoTransformer
from .x3d import X3D_CONFIGS, build_x3d

__all__ = ["VIT_CONFIGS", "VIT_ONLY_OPTIONS", "build_video_model", "list_video_models"]

#: VideoTransformer keywords an X3D (a CNN: no attention, no PEG) cannot honour
VIT_ONLY_OPTIONS = ("num_heads", "peg_at", "peg", "peg_kernel_size", "peg_padding", "peg_dynamic", "peg_num_kernels",
                    "pos_interpolation", "pos_temporal_interpolation", "pool_depth", "pool_mlp_ratio")  # fmt: skip

#: name -> (embed_dim, depth, num_heads), the DeiT shapes
VIT_CONFIGS: dict[str, tuple[int, int, int]] = {
    "vit_tiny": (192, 12, 3),
    "vit_small": (384, 12, 6),
    "vit_base": (768, 12, 12),
}


def list_video_models() -> list[str]:
    """Names :func:`build_video_model` accepts."""
    return sorted(VIT_CONFIGS) + sorted(X3D_CONFIGS)


def build_video_model(
    name: str = "vit_small",
    pos_enc: str = "peg3d",
    num_classes: int = 400,
    num_frames: int = 16,
    img_size: int | Sequence[int] = 224,
    tubelet: int | Sequence[int] = (2, 16, 16),
    **options,
) -> nn.Module:
    """A video classifier: clips ``(B, 3, T, H, W)`` -> logits ``(B, num_classes)``.

    Args:
        name: ``"vit_tiny"`` (192 wide, 3 heads), ``"vit_small"`` (384, 6),
            ``"vit_base"`` (768, 12), all 12 blocks; or an X3D baseline
            ``"x3d_xs"`` / ``"x3d_s"`` / ``"x3d_m"`` (pytorchvideo).
        pos_enc: for a ViT, what :data:`~peg_video.models.vit.VIDEO_ENCODINGS` accepts from the
            position-encoding registry (:mod:`peg_core.registry`; a registered plugin's name too):

            * ``"peg3d"``: a space-time PEG (depthwise Conv3d) after the blocks of ``peg_at``;
            * ``"peg3d-factorized"``: the PEG3d as a spatial then a temporal depthwise conv;
            * ``"learned"``: spatial + temporal tables, resized at another clip shape
              (``pos_interpolation``, ``pos_temporal_interpolation``);
            * ``"sincos"``: fixed 3-D sin-cos codes computed for the input's grid;
            * ``"sinusoid-1d"``: VideoMAE's fixed 1-D sinusoid over the flattened token index,
              resized trilinearly at another clip shape;
            * ``"rope-3d"``: 3-D rotary queries / keys from the input's grid (``rope_layout``);
            * ``"peg3d+rope-3d"``: both (a conditional and a rotary encoding combine);
            * ``"alibi-2d"`` / ``"fire"``: attention biases on the 3-D grid (ALiBi slopes times the
              ``(t, h, w)`` distance; FIRE's MLP), added to every attention's logits; ``peg3d+alibi-2d`` /
              ``peg3d+fire`` combine with the PEG3d;
            * ``"none"``: no position information.

            An X3D has no position encoding and takes ``"peg3d"`` (the default) or ``"none"``.
        num_classes, num_frames, img_size: classes, training clip length and crop.
        tubelet: ViT tubelet ``(t, p, p)`` (unused by X3D).
        **options: for a ViT, any :class:`~peg_video.models.vit.VideoTransformer` keyword:

            * size: ``embed_dim``, ``depth``, ``num_heads``, ``mlp_ratio`` (override the named
              size: tiny test/demo models), ``qkv_bias`` (True, False or ``"qv"``: query and
              value biases only, VideoMAE), ``norm_eps``, ``in_chans``;
            * attention: ``attention`` (``"joint"`` or ``"divided"``, TimeSformer),
              ``temporal_fc`` (divided: TimeSformer's projection after the temporal attention);
            * PEG3d: ``peg_at``, ``peg`` (:class:`peg_core.peg.PegOptions`), or the loose
              keywords configs store: ``peg_kernel_size``, ``peg_padding``, ``peg_dynamic``,
              ``peg_num_kernels``, ``peg_zero_init`` (start as the identity, for a PEG3d added
              to a pre-trained model);
            * tables: ``pos_interpolation`` (spatial resize mode of ``"learned"``, and the mode
              of ``"sinusoid-1d"``), ``pos_temporal_interpolation`` (``"linear"``,
              ``"nearest"``, ``"area"``), ``rope_layout`` (``"pairs"`` or ``"vjepa2"``);
            * head: ``global_pool`` (``"avg"``, ``"token"``, ``"first"`` or ``"attentive"``:
              V-JEPA 2's attentive pooler), ``pool_depth`` / ``pool_mlp_ratio`` (the attentive
              pooler's self-attention blocks and their MLP width), ``fc_norm_eps`` (a LayerNorm
              after the pooling instead of one over the tokens), ``drop_rate``,
              ``drop_path_rate``.

            For X3D, keywords of ``create_x3d`` (the ViT's head and PEG keywords are a
            ``ValueError``).
    """
    if name in X3D_CONFIGS:
        if pos_enc not in ("peg3d", "none"):
            raise ValueError(
                f"{name} is a CNN without a position encoding; pos_enc={pos_enc!r} does not apply"
            )
        foreign = sorted(set(options) & set(VIT_ONLY_OPTIONS))
        if foreign:
            raise ValueError(
                f"{name} is a CNN without attention heads or a PEG; {', '.join(foreign)} do not apply"
            )
        if isinstance(img_size, Sequence):
            if len(set(img_size)) != 1:
                raise ValueError(f"X3D takes square crops; got img_size={tuple(img_size)}")
            img_size = img_size[0]
        return build_x3d(name, num_classes=num_classes, num_frames=num_frames, img_size=img_size, **options)
    if name not in VIT_CONFIGS:
        raise ValueError(f"unknown video model {name!r}; choose from {list_video_models()}")
    embed_dim, depth, num_heads = VIT_CONFIGS[name]
    options = fold_peg_keys(options)  # a stored config's loose peg_* keywords -> peg=PegOptions(...)
    options.setdefault("embed_dim", embed_dim)
    options.setdefault("depth", depth)
    options.setdefault("num_heads", num_heads)
    try:
        return VideoTransformer(
            num_classes=num_classes,
            num_frames=num_frames,
            img_size=img_size,
            tubelet=tubelet,
            pos_enc=pos_enc,
            **options,
        )
    except TypeError as e:
        raise TypeError(f"build_video_model({name!r}, ...): {e}") from None
