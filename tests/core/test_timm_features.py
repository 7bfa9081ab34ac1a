"""timm's backbone API on the CPVT names registered with timm, tested as timm tests its own ViTs.

``timm.create_model(name, features_only=True, out_indices=...)`` (timm's feature getter around the
model: ``feature_info``, ``forward_intermediates``, ``prune_intermediate_layers``), and the model's own
``forward_intermediates`` / ``prune_intermediate_layers``, each at a size that is a multiple of the
patch and a non-square one that is not (the PEG makes every size valid; maps are ``ceil(side / 16)``),
after timm's ``tests/test_models.py`` (``test_model_forward_intermediates``, the features tests).
"""

from __future__ import annotations

import math

import pytest
import torch

timm = pytest.importorskip("timm")
pytest.importorskip("peg_core.interop.timm")

SIZES = [(64, 96), (72, 50)]  # a multiple of the patch; non-square and not one
NAMES = ["cpvt_tiny", "cpvt_tiny_gap"]  # class token (a prefix token) and none
DEPTH = 3  # the registered width, fewer blocks: fast


def _images(size, batch=2, seed=0):
    return torch.randn(batch, 3, *size, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("size", SIZES)
@torch.no_grad()
def test_forward_intermediates(name, size):
    torch.manual_seed(0)
    model = timm.create_model(name, depth=DEPTH, num_classes=5).eval()
    info = timm.models.FeatureInfo(model.feature_info, len(model.feature_info))
    assert info.module_name() == [f"blocks.{i}" for i in range(DEPTH)]
    x = _images(size)
    output, intermediates = model.forward_intermediates(x)
    assert len(intermediates) == len(info.channels()) == DEPTH
    for y, ch, r in zip(intermediates, info.channels(), info.reduction()):
        assert y.shape == (2, ch, math.ceil(size[0] / r), math.ceil(size[1] / r))
    assert torch.equal(output, model.forward_features(x))  # the final output is forward_features'
    # NLC: the same maps as token rows; norm: the final norm on each, so the last one is the output's grid
    nlc = model.forward_intermediates(x, output_fmt="NLC", norm=True, intermediates_only=True)
    p = model.num_prefix_tokens
    assert torch.allclose(nlc[-1], output[:, p:], atol=1e-6)
    flat = model.forward_intermediates(x, output_fmt="NLC", intermediates_only=True)
    assert all(torch.equal(a.flatten(2).transpose(1, 2), b) for a, b in zip(intermediates, flat))
    # indices: the last n, or a list (negative from the end); stop_early gives the same maps
    last2 = model.forward_intermediates(x, indices=2, intermediates_only=True)
    assert all(torch.equal(a, b) for a, b in zip(last2, intermediates[1:]))
    picked = model.forward_intermediates(x, indices=[0, -1], stop_early=True)[1]
    assert torch.equal(picked[0], intermediates[0]) and torch.equal(picked[1], intermediates[-1])
    with_prefix = model.forward_intermediates(
        x, indices=[1], return_prefix_tokens=True, intermediates_only=True
    )
    grid, prefix = with_prefix[0] if p else (with_prefix[0], None)
    assert torch.equal(grid, intermediates[1]) and (prefix is None or prefix.shape == (2, p, 192))
    with pytest.raises(ValueError, match="block indices"):
        model.forward_intermediates(x, indices=[DEPTH])


@pytest.mark.parametrize("name", NAMES)
@torch.no_grad()
def test_prune_intermediate_layers(name):
    torch.manual_seed(0)
    model = timm.create_model(name, depth=DEPTH, peg_at=[0, 2]).eval()  # a PEG after the block pruned away
    x = _images(SIZES[1])
    want = model.forward_intermediates(x, indices=[0, 1], intermediates_only=True)
    assert model.prune_intermediate_layers([0, 1], prune_norm=True) == [0, 1]
    assert len(model.blocks) == 2 and set(model.pos_blocks) == {"0"} and len(model.feature_info) == 2
    assert model.num_classes == 0 and isinstance(model.head, torch.nn.Identity)
    got = model.forward_intermediates(x, indices=[0, 1], intermediates_only=True)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("name", NAMES)
def test_features_only(name):
    torch.manual_seed(0)
    plain = timm.create_model(name, depth=DEPTH).eval()
    torch.manual_seed(0)  # the same draws: the same weights
    feats = timm.create_model(name, depth=DEPTH, features_only=True, out_indices=(0, 2)).eval()
    assert type(feats).__name__ == "FeatureGetterNet"
    assert feats.feature_info.channels() == [192, 192] and feats.feature_info.reduction() == [16, 16]
    assert feats.feature_info.module_name() == ["blocks.0", "blocks.2"]
    for size in SIZES:
        x = _images(size, seed=1)
        out = feats(x)
        assert [o.shape for o in out] == [(2, 192, math.ceil(size[0] / 16), math.ceil(size[1] / 16))] * 2
        with torch.no_grad():
            want = plain.forward_intermediates(x, indices=(0, 2), intermediates_only=True)
        assert all(torch.equal(a, b) for a, b in zip(out, want))
    sum(o.sum() for o in feats(_images(SIZES[0]))).backward()  # trains as a backbone
    assert feats.model.patch_embed.proj.weight.grad is not None
    default = timm.create_model(name, depth=4, features_only=True)  # timm's ViT default: the last 3 blocks
    assert default.feature_info.module_name() == ["blocks.1", "blocks.2", "blocks.3"]


def test_features_only_from_a_weights_file(tmp_path):
    """``pretrained=True`` with a local file and ``features_only``: the file's weights, then the getter."""
    torch.manual_seed(0)
    source = timm.create_model("cpvt_tiny", depth=DEPTH, num_classes=7).eval()
    torch.save(source.state_dict(), tmp_path / "w.pth")
    feats = timm.create_model("cpvt_tiny", depth=DEPTH, num_classes=7, pretrained=True, features_only=True,
                              out_indices=[1], pretrained_cfg_overlay=dict(file=str(tmp_path / "w.pth")))  # fmt: skip
    x = _images(SIZES[1], seed=2)
    with torch.no_grad():
        want = source.forward_intermediates(x, indices=[1], intermediates_only=True)
        assert torch.equal(feats(x)[0], want[0])
