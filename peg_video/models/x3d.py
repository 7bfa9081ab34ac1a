"""pytorchvideo's X3D (Feichtenhofer, 2020) as a baseline in the same builder and training command.

``x3d_xs`` / ``x3d_s`` / ``x3d_m`` differ only in the clip length and crop
they are trained at (4×160, 13×160, 16×224 in the paper); the network
(depth factor 2.2, width factor 2.0) is the same, so here the builder's
``num_frames`` and ``img_size`` set them.  pytorchvideo is imported lazily:
the ViT path does not need it.
"""

from __future__ import annotations

from torch import nn

__all__ = ["X3D_CONFIGS", "build_x3d"]

#: name -> (depth_factor, the paper's clip length, the paper's crop size)
X3D_CONFIGS: dict[str, tuple[float, int, int]] = {
    "x3d_xs": (2.2, 4, 160),
    "x3d_s": (2.2, 13, 160),
    "x3d_m": (2.2, 16, 224),
}


def build_x3d(
    name: str, num_classes: int = 400, num_frames: int = 16, img_size: int = 224, **options
) -> nn.Module:
    """X3D via ``pytorchvideo.models.x3d.create_x3d``, returning logits ``(B, num_classes)``.

    Args:
        name: ``"x3d_xs"``, ``"x3d_s"`` or ``"x3d_m"``.
        num_classes, num_frames, img_size: as for the ViTs.
        **options: passed to ``create_x3d`` (``dropout_rate``, ``width_factor``, ...).

    The head's softmax is removed (the losses and the evaluator expect
    logits), and its fixed-size average pool becomes a global one: identical
    at the training size, and other clip lengths and crops now run too.
    """
    if name not in X3D_CONFIGS:
        raise ValueError(f"unknown X3D model {name!r}; choose from {sorted(X3D_CONFIGS)}")
    from ..compat import import_pytorchvideo

    create_x3d = import_pytorchvideo("pytorchvideo.models.x3d").create_x3d

    depth_factor, _, _ = X3D_CONFIGS[name]
    options.setdefault("depth_factor", depth_factor)
    options.setdefault("head_activation", None)
    model = create_x3d(
        input_clip_length=num_frames,
        input_crop_size=img_size,
        model_num_class=num_classes,
        **options,
    )
    model.blocks[-1].pool.pool = nn.AdaptiveAvgPool3d(1)
    return model
