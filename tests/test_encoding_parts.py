"""The registry builds a family's encoding parts; the PEG's options travel as one value.

``build_encoding_parts`` is the one glue the families share (CPVT, the video ViT, RT-DETR's AIFI,
DETR); ``PegOptions`` carries the PEG's options and ``fold_peg_keys`` reads the loose ``peg_*``
keywords stored configs hold.  Rotary kinds register themselves in ``peg_core.rope``.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn

import peg_core
from peg_core import bias as bias_module
from peg_core.models import CPVT
from peg_core.peg import PEG2d, PegOptions, fold_peg_keys
from peg_core.registry import (
    EncodingContext,
    build_encoding_parts,
    encoding_names,
    get_encoding,
    parse_pos_enc,
    unregister_encoding,
)
from peg_core.rope import ROPE_KINDS, ROTARY_KINDS, RoPEAxial, rotary_kind
from peg_video.models import VideoTransformer, build_video_model

CTX = EncodingContext(32, (4, 5), num_prefix_tokens=1, num_heads=4, depth=3)


def test_parts_fill_their_slots():
    parts = build_encoding_parts(parse_pos_enc("peg+rope-mixed"), CTX, peg_at=(-1, 1))
    assert parts.table is None and parts.bias is None
    assert parts.peg_at == (-1, 1) and all(isinstance(m, PEG2d) for m in parts.pegs.values())
    assert list(parts.peg_modules()) == ["-1", "1"]
    assert tuple(parts.rotary.freqs.shape) == (2, 3, 4, 4)  # per layer and head, head dim 8
    parts = build_encoding_parts(parse_pos_enc("learned+alibi-2d"), CTX, table_prefix_tokens=0)
    assert parts.pegs == {} and parts.rotary is None and parts.bias.num_heads == 4
    assert tuple(parts.table.pos_embed.shape) == (1, 20, 32)  # no prefix entry: table_prefix_tokens=0


def test_parts_take_the_peg_options_and_the_familys_own_builders():
    ctx = EncodingContext(16, (4, 4), depth=2, peg=PegOptions(kernel_size=5, separable=True))
    parts = build_encoding_parts(parse_pos_enc("peg"), ctx, peg_at="all")
    assert parts.peg_at == (0, 1) and tuple(parts.pegs[0].proj.weight.shape) == (16, 1, 5, 1)
    marker = nn.Identity()
    own = {"sincos": lambda c: marker}
    assert build_encoding_parts(parse_pos_enc("sincos"), ctx, own=own).table is marker


def test_parts_are_built_in_the_order_asked_and_only_those():
    spec = parse_pos_enc("peg+rope-mixed")
    torch.manual_seed(0)
    first = build_encoding_parts(spec, CTX, peg_at=(0,), order=("rotary", "conditional"))
    torch.manual_seed(0)
    rotary_only = build_encoding_parts(spec, CTX, order=("rotary",))
    assert rotary_only.pegs == {} and torch.equal(rotary_only.rotary.freqs, first.rotary.freqs)
    with pytest.raises(ValueError, match="slots"):
        build_encoding_parts(spec, CTX, order=("rope",))


def test_peg_options_are_one_value_and_old_keys_fold_into_it():
    assert PegOptions.of(None) == PegOptions()
    assert PegOptions.of({"kernel_size": [3, 5, 5]}).kernel_size == (3, 5, 5)
    with pytest.raises(TypeError, match="no field"):
        PegOptions.of({"kernel": 3})
    old = {"pos_enc": "peg", "peg_kernel_size": 5, "peg_dynamic": True, "peg_num_kernels": None, "depth": 2}
    new = fold_peg_keys(old)
    assert new == {"pos_enc": "peg", "depth": 2, "peg": PegOptions(kernel_size=5, dynamic=True)}
    assert fold_peg_keys({"depth": 2}) == {"depth": 2}  # nothing to fold: the builder's default
    assert PegOptions(kernel_size=5, dynamic=True).as_config()["peg_kernel_size"] == 5
    assert (
        "separable" not in PegOptions().class_options(3) and PegOptions().class_options(2)["num_kernels"] == 4
    )


def test_stored_loose_keywords_build_the_same_models():
    """Checkpoints and configs written before PegOptions store peg_* keywords: they build the same weights."""
    small = {"embed_dim": 16, "depth": 2, "num_heads": 2, "patch_size": 8, "img_size": 32, "num_classes": 3}
    torch.manual_seed(0)
    old = CPVT(
        **fold_peg_keys({**small, "peg_dynamic": True, "peg_num_kernels": 3, "peg_padding": "circular"})
    )
    torch.manual_seed(0)
    new = CPVT(**small, peg=PegOptions(dynamic=True, num_kernels=3, padding_mode="circular"))
    assert all(torch.equal(a, b) for a, b in zip(old.state_dict().values(), new.state_dict().values()))
    video = {"num_classes": 3, "num_frames": 4, "img_size": 16, "tubelet": (2, 8, 8), "depth": 2, "embed_dim": 16,
             "num_heads": 2}  # fmt: skip
    torch.manual_seed(0)
    old = build_video_model("vit_tiny", "peg3d", **video, peg_kernel_size=[3, 5, 5], peg_zero_init=True)
    torch.manual_seed(0)
    new = VideoTransformer(**video, peg=PegOptions(kernel_size=(3, 5, 5), zero_init=True))
    assert all(torch.equal(a, b) for a, b in zip(old.state_dict().values(), new.state_dict().values()))
    assert not old.pos_blocks["0"].proj.weight.any()  # zero_init reached the PEG3d
    with pytest.raises(ValueError, match="peg_num_kernels"):
        VideoTransformer(**video, peg=PegOptions(num_kernels=2))


@pytest.mark.parametrize("cls", [CPVT, VideoTransformer])
def test_model_signatures_stay_within_25_parameters(cls):
    params = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    assert (
        len(params) <= 25
        and "peg" in params
        and not any(p.startswith("peg_") and p != "peg_at" for p in params)
    )


def test_rotary_kinds_are_one_list():
    assert encoding_names(kind="rotate") == list(ROTARY_KINDS) == list(ROPE_KINDS)
    assert get_encoding("rope-3d").dims == ROTARY_KINDS["rope-3d"].dims == (3,)

    @rotary_kind("test-rope-self", dims=(2, 3), description="a kind registered by its module alone")
    def _build(head_dim, *, num_heads=None, depth=None, temperature=None, **kwargs):
        return RoPEAxial(head_dim, 2, temperature=7.0 if temperature is None else temperature, **kwargs)

    try:
        e = get_encoding("test-rope-self")
        assert e.kind == "rotate" and e.dims == (2, 3) and e.description.startswith("a kind")
        assert peg_core.build_rope("test-rope-self", 8).temperature == 7.0
    finally:
        ROTARY_KINDS.pop("test-rope-self")
        unregister_encoding("test-rope-self")


def test_the_bias_kind_is_exported_beside_the_rotary_one():
    for name in ("AttentionBias", "ALiBiBias", "FIREBias", "LookHereBias", "with_key_padding"):
        assert getattr(peg_core, name) is getattr(bias_module, name) and name in peg_core.__all__
    for name in ("RotaryEmbedding", "PegOptions", "build_encoding_parts", "EncodingParts"):
        assert name in peg_core.__all__
