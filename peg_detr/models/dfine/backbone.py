"""HGNetv2 (PP-HGNetV2, B0-B5), the backbone of D-FINE, DEIM and the small DEIMv2 models, built from timm's modules.

timm ships HGNetv2's building blocks in ``timm.models.hgnet`` (``StemV2``, ``HighPerfGpuStage``);
:class:`HGNetv2Backbone` assembles them for a layout (the presets :data:`HGNETV2_BACKBONES`, or
any explicit stem / stage spec such as a small test config or DEIMv2's Atto / Femto / Pico), with
frozen batch norm and frozen stages as D-FINE configures them, and returns the stage outputs a
detector's encoder takes (D-FINE's ``return_idx``).  No third hand-written HGNetv2: the tests
(``tests/detr/test_dfine_backbone.py``) check that these modules compute what transformers'
``HGNetV2Backbone`` computes, at odd and non-square sizes, after the key map of
:mod:`peg_detr.interop.hf_hgnetv2`.

timm is an optional dependency (``pip install 'peg-detr[timm]'``): it is imported when a backbone
is built, never by ``import peg_detr``.  ``pretrained`` weights are never fetched here; they come
through ``--backbone-weights`` / the Hugging Face interop.

Keys are timm's (so a timm ``hgnetv2_b*`` checkpoint loads after dropping its ``head.*``)::

    stem.{stem1,stem2a,stem2b,stem3,stem4}.{conv,bn,lab}.*         the stem (LAB only with use_lab)
    stages.{s}.downsample.{conv,bn}.*                              3×3 depthwise stride-2 conv + norm
    stages.{s}.blocks.{b}.layers.{l}.{conv,bn,lab}.*               a plain conv layer
    stages.{s}.blocks.{b}.layers.{l}.{conv1,conv2}.{conv,bn,lab}.* a light layer (1×1, then depthwise k×k)
    stages.{s}.blocks.{b}.aggregation.{0,1}.{conv,bn,lab}.*        squeeze / excitation 1×1 convs

(``bn`` holds ``weight``, ``bias``, ``running_mean``, ``running_var``; a trainable norm also
``num_batches_tracked``.)  The official D-FINE / DEIM code (``src/nn/backbone/hgnetv2.py``) names
its modules the same way, so the ``backbone.*`` keys of their checkpoints are ours unchanged.

A stage spec is timm's 8-tuple ``(in_chs, mid_chs, out_chs, num_blocks, downsample, light_block,
kernel_size, num_layers)``; the stem spec is ``(mid_chs, out_chs)``.  Stage ``s`` has output stride
``4 * 2**(number of downsampling stages up to s)``: 4, 8, 16, 32 for the presets, so
``return_idx=(1, 2, 3)`` gives strides 8 / 16 / 32 (D-FINE S-X) and ``(2, 3)`` strides 16 / 32
(D-FINE N).
"""

from __future__ import annotations

import types
from collections.abc import Sequence
from functools import partial
from typing import Any

from torch import Tensor, nn
from torchvision.ops import FrozenBatchNorm2d

from peg_core.errors import require

from ..layers import ACTIVATIONS

__all__ = ["HGNETV2_ACTIVATIONS", "HGNETV2_BACKBONES", "HGNetv2Backbone", "StageSpec", "build_hgnetv2"]

#: ``(in_chs, mid_chs, out_chs, num_blocks, downsample, light_block, kernel_size, num_layers)``
StageSpec = tuple[int, int, int, int, bool, bool, int, int]


def _layout(
    stem: tuple[int, int],
    mids: Sequence[int],
    outs: Sequence[int],
    blocks: Sequence[int],
    layers: int,
    kernels: Sequence[int] = (3, 3, 5, 5),
    *,
    use_lab: bool,
) -> dict[str, Any]:
    """A PP-HGNetV2 layout from its widths and depths: what every preset shares is computed, not restated.

    Stage ``i`` takes the previous stage's ``outs`` (stage 0 the stem's), downsamples from stage 1
    on, uses light blocks from stage 2 on, and has ``layers`` conv layers per block; ``mids``,
    ``outs``, ``blocks`` and ``kernels`` are per stage (their length is the number of stages).
    """
    ins = (stem[1], *outs[:-1])
    stages = tuple(
        (cin, mid, cout, n, i > 0, i > 1, k, layers)
        for i, (cin, mid, cout, n, k) in enumerate(zip(ins, mids, outs, blocks, kernels, strict=False))
    )
    return {"stem_channels": stem, "stages": stages, "use_lab": use_lab}


#: ``name -> {"stem_channels", "stages", "use_lab"}``: the PP-HGNetV2 layouts D-FINE uses (B0: N/S,
#: B2: M, B4: L, B5: X; B1 / B3 for completeness), the same numbers as timm's ``model_cfgs`` (a
#: test checks) and D-FINE's ``HGNetv2.arch_configs``; and DEIMv2's Atto / Femto / Pico.  ``use_lab`` is timm's and D-FINE's default
#: per size (learnable affine blocks in B0-B3 only).
HGNETV2_BACKBONES: dict[str, dict[str, Any]] = {
    # _layout(stem, mid widths, out widths, blocks per stage, conv layers per block)
    "hgnetv2_b0": _layout((16, 16), (16, 32, 64, 128), (64, 256, 512, 1024), (1, 1, 2, 1), 3, use_lab=True),
    "hgnetv2_b1": _layout((24, 32), (32, 48, 96, 192), (64, 256, 512, 1024), (1, 1, 2, 1), 3, use_lab=True),
    "hgnetv2_b2": _layout((24, 32), (32, 64, 128, 256), (96, 384, 768, 1536), (1, 1, 3, 1), 4, use_lab=True),
    "hgnetv2_b3": _layout((24, 32), (32, 64, 128, 256), (128, 512, 1024, 2048), (1, 1, 3, 1), 5, use_lab=True),
    "hgnetv2_b4": _layout((32, 48), (48, 96, 192, 384), (128, 512, 1024, 2048), (1, 1, 3, 1), 6, use_lab=False),
    "hgnetv2_b5": _layout((32, 64), (64, 128, 256, 512), (128, 512, 1024, 2048), (1, 2, 5, 2), 6, use_lab=False),
    # DEIMv2's three-stage cuts of B0 (its HGNetv2.arch_configs Atto / Femto / Pico; not in timm),
    # used with return_idx (2,) and the lite encoder; initialised from B0's weights where shapes match.
    "hgnetv2_atto": _layout((16, 16), (16, 32, 64), (64, 256, 256), (1, 1, 1), 3, (3, 3, 3), use_lab=True),
    "hgnetv2_femto": _layout((16, 16), (16, 32, 64), (64, 256, 512), (1, 1, 1), 3, use_lab=True),
    "hgnetv2_pico": _layout((16, 16), (16, 32, 64), (64, 256, 512), (1, 1, 2), 3, use_lab=True),
}  # fmt: skip


#: Activations every activated layer may use instead of timm's ReLU (DEIMv2's HGNetv2 ``act``,
#: whose ``get_activation`` names these the same way).
HGNETV2_ACTIVATIONS: dict[str, type[nn.Module]] = ACTIVATIONS


def _timm_hgnet() -> types.ModuleType:
    """``timm.models.hgnet``, imported on first use (timm is heavy and optional), or a MissingDependency."""
    return require("timm.models.hgnet", "timm", "peg-detr", what="the HGNetv2 backbones (D-FINE, DEIM)")


def _check_stages(stem_channels: Sequence[int], stages: Sequence[Sequence]) -> tuple[tuple, tuple]:
    """Validate and normalise a stem / stage spec to plain tuples (json round trips give lists)."""
    stem = tuple(int(c) for c in stem_channels)
    if len(stem) != 2 or min(stem) < 1:
        raise ValueError(f"HGNetv2 stem_channels must be (mid, out) > 0; got {tuple(stem_channels)}")
    if not stages:
        raise ValueError("HGNetv2 needs at least one stage")
    specs = []
    prev = stem[1]
    for i, spec in enumerate(stages):
        if len(spec) != 8:
            raise ValueError(
                f"HGNetv2 stage {i}: need (in_chs, mid_chs, out_chs, num_blocks, downsample, "
                f"light_block, kernel_size, num_layers); got {tuple(spec)}"
            )
        cin, mid, cout, blocks, down, light, k, layers = spec
        spec = (int(cin), int(mid), int(cout), int(blocks), bool(down), bool(light), int(k), int(layers))
        if min(spec[0], spec[1], spec[2], spec[3], spec[7]) < 1 or spec[6] < 1 or spec[6] % 2 == 0:
            raise ValueError(f"HGNetv2 stage {i}: sizes must be >= 1 and the kernel odd; got {spec}")
        if spec[0] != prev:
            raise ValueError(f"HGNetv2 stage {i} takes {spec[0]} channels but receives {prev}")
        specs.append(spec)
        prev = spec[2]
    return stem, tuple(specs)


def _set_activation(module: nn.Module, act: type[nn.Module]) -> None:
    """Replace every ``nn.ReLU`` below ``module`` (timm's layers hard-code it) by ``act()``; no keys change."""
    for name, child in module.named_children():
        if isinstance(child, nn.ReLU):
            setattr(module, name, act())
        else:
            _set_activation(child, act)


def _freeze_norms(module: nn.Module) -> None:
    """Replace every ``nn.BatchNorm2d`` below ``module`` by a :class:`FrozenBatchNorm2d` with its values.

    Same keys (minus ``num_batches_tracked``, which the frozen norm drops on load); eps 1e-5, as
    transformers' ``DFineFrozenBatchNorm2d`` and D-FINE's ``FrozenBatchNorm2d``.
    """
    for name, child in module.named_children():
        if isinstance(child, nn.BatchNorm2d):
            frozen = FrozenBatchNorm2d(child.num_features, eps=1e-5)
            for key in ("weight", "bias", "running_mean", "running_var"):
                getattr(frozen, key).copy_(getattr(child, key).detach())
            setattr(module, name, frozen)
        else:
            _freeze_norms(child)


class HGNetv2Backbone(nn.Module):
    """PP-HGNetV2 returning the stage outputs ``return_idx`` (strides 8 / 16 / 32 by default).

    Args:
        stem_channels: ``(mid, out)`` channels of the stem (HF ``stem_channels[1:]``).
        stages: one :data:`StageSpec` per stage (HF ``stage_*`` lists, zipped).
        use_lab: learnable affine blocks (a scalar scale and bias after every activation; HF
            ``use_learnable_affine_block``).
        return_idx: the 0-based stages whose outputs are returned, increasing (D-FINE's
            ``return_idx``; HF ``out_indices`` minus one).
        freeze_bn: every batch norm is a :class:`torchvision.ops.FrozenBatchNorm2d` (D-FINE's
            ``freeze_norm``, HF ``freeze_backbone_batch_norms``); otherwise trainable
            ``nn.BatchNorm2d`` (except in frozen parts, below).
        freeze_at: ``-1`` trains everything; ``0`` freezes the stem; ``k >= 1`` the stem and the
            first ``k`` stages (RT-DETR's ResNet-vd convention in this package).  D-FINE's
            ``freeze_stem_only=True, freeze_at=0`` (L / X) is ``freeze_at=0`` here; its
            ``freeze_stem_only=False, freeze_at=k`` is ``freeze_at=k + 1``.  Frozen parts get
            frozen norms too, so their statistics stay fixed in training (D-FINE only stops their
            gradients; no published recipe freezes stages with trainable norms).
        act: the activation after every activated layer, a key of :data:`HGNETV2_ACTIVATIONS`
            (``"relu"``: HGNetv2's, D-FINE's; DEIMv2 makes it an option).
        in_channels: image channels.
        name: the preset this layout came from (``None``: an explicit spec); kept in
            :attr:`build_options`.

    Shapes: ``(B, in_channels, H, W) -> [(B, C_i, H_i, W_i)]`` for the stages in ``return_idx``,
    with ``H_i = ceil(H / s_i)`` for the presets' strides ``s_i`` (exactly ``H / s_i`` when ``s_i``
    divides ``H``); any ``H, W >= 2``, channels-last inputs too.  :attr:`out_channels` and
    :attr:`strides` list ``C_i`` and ``s_i``; :attr:`build_options` is the json-safe keyword set of
    :func:`build_hgnetv2` that rebuilds this module.
    """

    def __init__(
        self,
        stem_channels: Sequence[int],
        stages: Sequence[StageSpec],
        *,
        use_lab: bool = False,
        return_idx: Sequence[int] = (1, 2, 3),
        freeze_bn: bool = True,
        freeze_at: int = -1,
        act: str = "relu",
        in_channels: int = 3,
        name: str | None = None,
    ) -> None:
        super().__init__()
        stem, specs = _check_stages(stem_channels, stages)
        return_idx = tuple(int(i) for i in return_idx)
        if not return_idx or list(return_idx) != sorted(set(return_idx)) or return_idx[0] < 0:
            raise ValueError(f"return_idx must be increasing stage indices; got {return_idx}")
        if return_idx[-1] >= len(specs):
            raise ValueError(f"return_idx {return_idx} asks for a stage beyond the {len(specs)} built")
        if not -1 <= freeze_at <= len(specs):
            raise ValueError(
                f"freeze_at must be -1 (nothing), 0 (stem) .. {len(specs)} (all stages); got {freeze_at}"
            )
        if act not in HGNETV2_ACTIVATIONS:
            raise ValueError(
                f"HGNetv2 activation {act!r} is not supported; choose from {sorted(HGNETV2_ACTIVATIONS)}"
            )
        hgnet = _timm_hgnet()
        self.stem = hgnet.StemV2(in_channels, stem[0], stem[1], use_lab=bool(use_lab))
        # 'se' aggregation (squeeze then excitation 1×1 conv) is what HGNetv2 uses (timm picks it
        # for the v2 stem); stride 2 is timm's and HF's default downsampling stride.
        # what every stage shares; per stage, timm's positional in_chs, mid_chs, out_chs, block_num, layer_num
        stage = partial(hgnet.HighPerfGpuStage, stride=2, use_lab=bool(use_lab), agg="se")
        self.stages = nn.Sequential(
            *(
                stage(cin, mid, cout, blocks, layers, downsample=down, light_block=light, kernel_size=k)
                for cin, mid, cout, blocks, down, light, k, layers in specs
            )
        )
        if act != "relu":
            _set_activation(self, HGNETV2_ACTIVATIONS[act])
        strides, stride = [], 4
        for spec in specs:
            stride *= 2 if spec[4] else 1
            strides.append(stride)
        self.return_idx = list(return_idx)
        self.out_channels = [specs[i][2] for i in return_idx]
        self.strides = [strides[i] for i in return_idx]
        self.build_options: dict[str, Any] = {
            "name": name,
            "stem_channels": list(stem),
            "stages": [list(s) for s in specs],
            "use_lab": bool(use_lab),
            "return_idx": list(return_idx),
            "freeze_bn": bool(freeze_bn),
            "freeze_at": int(freeze_at),
            "act": act,
            "in_channels": int(in_channels),
        }
        self._init_weights()
        frozen = [] if freeze_at < 0 else [self.stem, *self.stages[:freeze_at]]
        if freeze_bn:
            _freeze_norms(self)
        for part in frozen:
            _freeze_norms(part)
            part.requires_grad_(False)

    def _init_weights(self) -> None:
        # timm's HighPerfGpuNet init (He fan-out for the ReLU convs, identity norms); the stage
        # modules alone would keep PyTorch's default conv init.
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: Tensor) -> list[Tensor]:
        """``(B, C, H, W)`` images -> the ``return_idx`` stage outputs, shallow to deep."""
        x = self.stem(x)
        outs = []
        last = self.return_idx[-1]
        for i, stage in enumerate(self.stages):
            x = stage(x)
            if i in self.return_idx:
                outs.append(x)
            if i == last:
                break  # deeper stages are not needed (and not run)
        return outs


def build_hgnetv2(
    name: str | None = "hgnetv2_b4",
    *,
    use_lab: bool | None = None,
    stem_channels: Sequence[int] | None = None,
    stages: Sequence[StageSpec] | None = None,
    **options: Any,
) -> HGNetv2Backbone:
    """An :class:`HGNetv2Backbone` by preset name (:data:`HGNETV2_BACKBONES`) or explicit spec.

    Args:
        name: ``"hgnetv2_b0"`` .. ``"hgnetv2_b5"``, ``"hgnetv2_atto"`` / ``"_femto"`` / ``"_pico"``; with ``stages`` given, only a label (may be
            ``None``).
        options: :class:`HGNetv2Backbone`'s ``freeze_bn``, ``freeze_at``, ``return_idx``, ``act``,
            ``in_channels`` (its defaults when left out).  D-FINE's
            recipes: N / S / M ``freeze_bn=False, freeze_at=-1``; L / X ``freeze_bn=True,
            freeze_at=0``; N returns ``(2, 3)``.
        use_lab: ``None``: the preset's (B0-B3 and DEIMv2's on, B4-B5 off; off for an explicit spec).
        stem_channels, stages: an explicit layout (both or neither), e.g. from
            :func:`peg_detr.interop.hf_hgnetv2.hgnetv2_options_from_hf`.

    The returned module's ``build_options`` passed back as keywords (``build_hgnetv2(**opts)``)
    rebuild the same architecture.  Raises ``ValueError`` for an unknown name or a bad spec,
    :class:`peg_core.errors.MissingDependency` when timm is not installed.
    """
    if (stem_channels is None) != (stages is None):
        raise ValueError("give both stem_channels and stages for an explicit HGNetv2 layout, or neither")
    if stages is None:
        if name not in HGNETV2_BACKBONES:
            raise ValueError(f"unknown HGNetv2 backbone {name!r}; choose from {sorted(HGNETV2_BACKBONES)}")
        preset = HGNETV2_BACKBONES[name]
        stem_channels, stages = preset["stem_channels"], preset["stages"]
        if use_lab is None:
            use_lab = preset["use_lab"]
    return HGNetv2Backbone(stem_channels, stages, use_lab=bool(use_lab), name=name, **options)
