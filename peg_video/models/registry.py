"""Build any video model of the project by name: the PEG video transformers and the X3D baselines."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from .vit import VideoTransformer
from .x3d import X3D_CONFIGS, build_x3d

__all__ = ["VIT_CONFIGS", "VIT_ONLY_OPTIONS", "build_video_model", "list_video_models"]

#: VideoTransformer keywords an X3D (a CNN: no attention, no PEG) cannot honour
VIT_ONLY_OPTIONS = ("num_heads", "peg_at", "peg_kernel_size", "peg_padding", "peg_dynamic", "peg_num_kernels",
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
        pos_enc: ``"peg3d"``, ``"peg3d-factorized"``, ``"learned"``, ``"sincos"``,
            ``"none"``, ``"rope-3d"`` or ``"peg3d+rope-3d"`` (ViTs; an X3D has no position encoding and takes
            ``"peg3d"``, the default, or ``"none"``).
        num_classes, num_frames, img_size: classes, training clip length and crop.
        tubelet: ViT tubelet ``(t, p, p)`` (unused by X3D).
        **options: for a ViT, any :class:`~peg_video.models.vit.VideoTransformer`
            keyword, including ``embed_dim``, ``depth``, ``num_heads``,
            ``mlp_ratio`` to override the named size (tiny test/demo models),
            ``attention``, ``global_pool``, the PEG3d's ``peg_at``,
            ``peg_kernel_size``, ``peg_padding``, ``peg_dynamic``,
            ``peg_num_kernels``, ``drop_path_rate``; for X3D, keywords of
            ``create_x3d`` (the ViT's head and PEG keywords are a ``ValueError``).
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
