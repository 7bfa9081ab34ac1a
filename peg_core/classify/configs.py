"""The classifier's named recipes (``train --config NAME``) and the defaults of its ``train`` flags.

Keys are the ``train`` parser's destinations (``num_train``, not the old ``n_train``): a key the
parser does not know is refused by :func:`peg_core.engine.parse_with_config`.
"""

from __future__ import annotations

from typing import Any

from ..interop.resolve import PublicModel

__all__ = ["CONFIGS", "DEFAULTS", "DESCRIPTIONS", "PUBLIC_MODELS"]

#: named recipes (``--config``); explicit flags override them
CONFIGS: dict[str, dict[str, Any]] = {
    # The `make demo` recipe: small CPVT-PEG on 2048 generated 48 px shapes (top-1 0.97-0.996 at 48 px:
    # the recipe is sensitive to float rounding, so the number moves with the CPU thread count).
    # The data settings apply when the shapes come from a folder (make-data): whole images, no flip
    # (it would swap the left/right classes), the scenes' own 2 rgb - 1 scaling.
    # batch 16 (768 steps): with 32 some seeds stay on the shape-only plateau (top-1 ~0.25) for 3 of the
    # 6 epochs and end at 0.75 (seed 1, 2026-12-03); with 16, seeds 0-2 end at >= 0.996 on both CPU paths
    "demo": {
        "arch": "demo", "pos_enc": "peg", "img_size": 48, "num_train": 2048, "num_val": 512, "epochs": 6,
        "batch_size": 16, "lr": 2e-3, "weight_decay": 0.05, "warmup_epochs": 1.0, "clip_max_norm": 1.0,
        "augment": "none", "crop_ratio": 1.0, "normalize": "half",
    },
}  # fmt: skip
CONFIGS["demo_quick"] = {**CONFIGS["demo"], "num_train": 512, "epochs": 2}  # seconds; near chance

#: folder-only data settings: left unset by default, so a folder gets its own defaults
#: (flip + random-resized crop, 0.875 centre crop, ImageNet statistics; see task.data_settings)
_FOLDER_SETTINGS = ("augment", "crop_ratio", "normalize")
#: ``train``'s defaults without ``--config``: the demo recipe (minus the folder settings)
DEFAULTS: dict[str, Any] = {
    **{k: v for k, v in CONFIGS["demo"].items() if k not in _FOLDER_SETTINGS},
    "pos_interpolation": "bicubic",
}

#: one line per recipe for ``python -m peg_core configs``
DESCRIPTIONS: dict[str, str] = {
    "demo": "the `make demo` recipe: small CPVT-PEG, 2048 generated 48 px shapes, 6 epochs (minutes on a CPU)",
    "demo_quick": "demo with 512 images and 2 epochs: seconds, near chance (a smoke run)",
}


_ROPE = "naver-ai/rope-vit README, DeiT-III recipe, ImageNet-1k val at 224 px"
_TIMM = "timm ViTs (peg_core.from_timm; timm's pretrained weights, fetched into the hub cache)"


def _timm_run(name: str, pos_enc: str) -> str:
    return (f"python -m peg_core train --init timm:{name} --pos-enc {pos_enc} --data-root /data/imagenet100 "
            f"--img-size 224 --epochs 30 --output-dir runs/{name}_peg")  # fmt: skip


#: ``python -m peg_core models``: public weights ``train --init`` reads, with their published top-1
PUBLIC_MODELS: tuple[PublicModel, ...] = (
    PublicModel(_TIMM, "timm:vit_small_patch16_rope_mixed_224", "80.9 top-1", _ROPE,
                _timm_run("vit_small_patch16_rope_mixed_224", "peg+rope-mixed")),
    PublicModel(_TIMM, "timm:vit_base_patch16_rope_mixed_224", "83.8 top-1", _ROPE,
                _timm_run("vit_base_patch16_rope_mixed_224", "peg+rope-mixed")),
    PublicModel(_TIMM, "timm:vit_small_patch16_rope_224", "80.9 top-1", _ROPE,
                _timm_run("vit_small_patch16_rope_224", "peg+rope-axial")),
    PublicModel(_TIMM, "timm:vit_small_patch16_dinov3", "—", "—",
                _timm_run("vit_small_patch16_dinov3", "peg+rope-dinov3")),
)  # fmt: skip
