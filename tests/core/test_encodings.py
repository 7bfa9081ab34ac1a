"""Fixed and learned encodings against float64 formula references, mask invariance and the builder."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from peg_core import (
    LearnedPositionEncoding2d,
    NoPositionEncoding,
    PEG2d,
    SinCosPositionEncoding2d,
    SinePositionEncoding2d,
    build_position_encoding,
    resize_pos_embed,
    sincos_2d,
)

F64 = torch.float64


def bottom_right_mask(sizes: list[tuple[int, int]], grid: tuple[int, int]) -> Tensor:
    mask = torch.ones(len(sizes), *grid, dtype=torch.bool)
    for b, (h, w) in enumerate(sizes):
        mask[b, :h, :w] = False
    return mask


def detr_sine_reference(mask: Tensor, dim: int, temperature: float = 10000.0) -> Tensor:
    """DETR's normalised sine encoding, position by position in Python floats: ``(B, H, W, dim)``."""
    b_, h_, w_ = mask.shape
    half, eps, scale = dim // 2, 1e-6, 2 * math.pi
    real = (~mask).tolist()
    out = []
    for b in range(b_):
        for i in range(h_):
            for j in range(w_):
                y = sum(real[b][r][j] for r in range(i + 1)) / (sum(real[b][r][j] for r in range(h_)) + eps)
                x = sum(real[b][i][: j + 1]) / (sum(real[b][i]) + eps)
                feats = []
                for coord in (y * scale, x * scale):  # y half first, then x
                    for k in range(half):
                        d = temperature ** (2 * (k // 2) / half)
                        feats.append(math.sin(coord / d) if k % 2 == 0 else math.cos(coord / d))
                out.append(feats)
    return torch.tensor(out, dtype=F64).reshape(b_, h_, w_, dim)


def mae_sincos_reference(h: int, w: int, dim: int) -> Tensor:
    """MAE's 2D sin-cos table in float64: token ``i*W + j`` = [sin(jω), cos(jω), sin(iω), cos(iω)]."""
    q = dim // 4
    out = torch.zeros(h * w, dim, dtype=F64)
    for i in range(h):
        for j in range(w):
            for k in range(q):
                omega = 1.0 / 10000 ** (k / q)
                out[i * w + j, k] = math.sin(j * omega)
                out[i * w + j, q + k] = math.cos(j * omega)
                out[i * w + j, 2 * q + k] = math.sin(i * omega)
                out[i * w + j, 3 * q + k] = math.cos(i * omega)
    return out


def test_sine_matches_detr_formula_with_mask():
    mask = bottom_right_mask([(3, 5), (4, 2), (4, 6)], (4, 6))
    mask[1, 0, 5] = True  # a lone padded pixel inside the extent: the cumsum still follows DETR
    enc = SinePositionEncoding2d(16)
    want = detr_sine_reference(mask, 16)
    x = torch.zeros(3, 24, 16)
    pos = enc.position(x, (4, 6), mask)
    assert pos.shape == (3, 24, 16) and pos.dtype == torch.float32
    torch.testing.assert_close(pos.double(), want.flatten(1, 2), atol=1e-6, rtol=0)
    # float64 callers get a float64 computation
    pos64 = enc.position(x.double(), (4, 6), mask)
    torch.testing.assert_close(pos64, want.flatten(1, 2), atol=1e-12, rtol=0)
    # without a mask: every pixel real, shared over the batch
    nomask = enc.position(x, (4, 6))
    assert nomask.shape == (1, 24, 16)
    full = detr_sine_reference(torch.zeros(1, 4, 6, dtype=torch.bool), 16)
    torch.testing.assert_close(nomask.double(), full.flatten(1, 2), atol=1e-6, rtol=0)
    assert enc.apply_to == "qk" and not enc.conditional


def test_sine_options_and_prefix():
    enc = SinePositionEncoding2d(8, normalize=False, num_prefix_tokens=2)
    pos = enc.position(torch.zeros(1, 2 + 6, 8), (2, 3))
    assert torch.equal(pos[:, :2], torch.zeros(1, 2, 8))
    # unnormalised: the y code of row i is sin((i+1) / 1) in feature 0
    assert torch.allclose(pos[0, 2:, 0], torch.tensor([1.0, 1, 1, 2, 2, 2]).sin())
    with pytest.raises(ValueError, match="divisible by 4"):
        SinePositionEncoding2d(6)
    with pytest.raises(ValueError, match="normalize"):
        SinePositionEncoding2d(8, normalize=False, scale=1.0)


@pytest.mark.parametrize("size", [(4, 4), (3, 5), (6, 1)])
def test_sincos_matches_mae_formula(size):
    h, w = size
    torch.testing.assert_close(
        sincos_2d(size, 12, dtype=F64), mae_sincos_reference(h, w, 12), atol=1e-12, rtol=0
    )
    enc = SinCosPositionEncoding2d(12, num_prefix_tokens=1)
    x = torch.randn(2, 1 + h * w, 12)
    pos = enc.position(x, size)
    assert pos.shape == (1, 1 + h * w, 12) and torch.equal(pos[:, 0], torch.zeros(1, 12))
    torch.testing.assert_close(pos[0, 1:].double(), mae_sincos_reference(h, w, 12), atol=1e-6, rtol=0)
    torch.testing.assert_close(enc(x, size), x + pos)
    assert enc.apply_to == "tokens"


def test_learned_init_and_identity():
    enc = LearnedPositionEncoding2d(64, grid_size=(14, 14), num_prefix_tokens=1)
    table = enc.pos_embed
    assert table.shape == (1, 1 + 196, 64)
    assert abs(table.std().item() - 0.02) < 0.0015 and abs(table.mean().item()) < 0.002
    x = torch.randn(2, 197, 64)
    assert enc.position(x, (14, 14)) is table  # built grid: the table itself, no resize
    assert enc.apply_to == "tokens"


@pytest.mark.parametrize("mode", ["nearest", "bilinear", "bicubic"])
def test_learned_resizes_with_chosen_mode(mode):
    enc = LearnedPositionEncoding2d(8, grid_size=(4, 6), num_prefix_tokens=1, interpolation=mode)
    x = torch.randn(2, 1 + 5 * 3, 8)
    pos = enc.position(x, (5, 3))
    want = resize_pos_embed(enc.pos_embed, (5, 3), (4, 6), num_prefix_tokens=1, mode=mode)
    assert torch.equal(pos, want)
    # and against interpolate directly
    grid = enc.pos_embed[:, 1:].reshape(1, 4, 6, 8).permute(0, 3, 1, 2)
    ref = F.interpolate(
        grid, size=(5, 3), mode=mode, **({} if mode == "nearest" else {"align_corners": False})
    )
    torch.testing.assert_close(pos[:, 1:], ref.flatten(2).mT)
    assert torch.equal(pos[:, :1], enc.pos_embed[:, :1])
    # the per-call override wins over the built-in mode
    other = "nearest" if mode != "nearest" else "bilinear"
    assert torch.equal(
        enc.table((5, 3), mode=other), resize_pos_embed(enc.pos_embed, (5, 3), (4, 6), 1, other)
    )
    # gradients reach the table through the resize
    enc(x, (5, 3)).sum().backward()
    assert enc.pos_embed.grad is not None and enc.pos_embed.grad[0, 1:].abs().sum() > 0


def test_learned_rejects_unknown_mode():
    with pytest.raises(ValueError, match="interpolation='cubic'"):
        LearnedPositionEncoding2d(8, interpolation="cubic")


def _alone_vs_batched(enc, c: int, num_prefix: int = 0) -> None:
    """An image's codes at its real positions are the same alone and padded in a larger batch."""
    small = torch.randn(1, num_prefix + 3 * 5, c)
    alone = enc(small, (3, 5))
    mask = bottom_right_mask([(3, 5), (6, 8)], (6, 8))
    grid = torch.zeros(2, 6, 8, c)
    grid[0, :3, :5] = small[0, num_prefix:].reshape(3, 5, c)
    grid[1] = torch.randn(6, 8, c)
    batch = torch.cat(
        [torch.cat([small[:, :num_prefix], torch.zeros(1, num_prefix, c)]), grid.flatten(1, 2)], 1
    )
    out = enc(batch, (6, 8), mask)
    real = out[0, num_prefix:].reshape(6, 8, c)[:3, :5].reshape(15, c)
    torch.testing.assert_close(real, alone[0, num_prefix:], atol=1e-6, rtol=0)
    torch.testing.assert_close(out[0, :num_prefix], alone[0, :num_prefix], atol=1e-6, rtol=0)


def test_mask_invariance_of_encodings():
    _alone_vs_batched(SinePositionEncoding2d(16, apply_to="tokens"), 16)
    _alone_vs_batched(SinCosPositionEncoding2d(16, num_prefix_tokens=1), 16, num_prefix=1)
    _alone_vs_batched(LearnedPositionEncoding2d(16, grid_size=(4, 4), num_prefix_tokens=1), 16, num_prefix=1)
    _alone_vs_batched(PEG2d(16, num_prefix_tokens=1), 16, num_prefix=1)


def test_sine_normalisation_is_per_image():
    """With DETR normalisation each image spans (0, 2π] on its own extent, whatever the batch grid."""
    enc = SinePositionEncoding2d(8)
    mask = bottom_right_mask([(2, 3), (5, 7)], (5, 7))
    grid = enc.grid(mask)  # (B, H, W, C)
    # feature 1 is cos(y) (dim_t = 1): rows of the 2-high image sit at y = π and 2π
    torch.testing.assert_close(grid[0, :2, 0, 1], torch.tensor([-1.0, 1.0]), atol=1e-5, rtol=0)
    # the 5-high image: y = 2π·(i+1)/5
    want = torch.cos(2 * math.pi * torch.arange(1, 6, dtype=F64) / 5).float()
    torch.testing.assert_close(grid[1, :, 0, 1], want, atol=1e-5, rtol=0)
    # x half (feature 4 + 1 = cos(x)) of the 3-wide image: x = 2π/3, 4π/3, 2π
    want_x = torch.cos(2 * math.pi * torch.arange(1, 4, dtype=F64) / 3).float()
    torch.testing.assert_close(grid[0, 0, :3, 5], want_x, atol=1e-5, rtol=0)
    alone = enc.grid(torch.zeros(1, 2, 3, dtype=torch.bool))[0]
    assert torch.equal(grid[0, :2, :3], alone)


def test_builder_and_apply_to():
    expected = {"peg": "tokens", "sine": "qk", "sincos": "tokens", "learned": "tokens", "none": "none"}
    classes = {
        "peg": PEG2d,
        "sine": SinePositionEncoding2d,
        "sincos": SinCosPositionEncoding2d,
        "learned": LearnedPositionEncoding2d,
        "none": NoPositionEncoding,
    }
    for kind, where in expected.items():
        enc = build_position_encoding(kind, 16)
        assert isinstance(enc, classes[kind]) and enc.apply_to == where, kind
    assert build_position_encoding("peg", 16).conditional
    assert build_position_encoding("sincos", 16, apply_to="qk").apply_to == "qk"
    peg = build_position_encoding("peg", 16, kernel_size=5, num_prefix_tokens=1)
    assert peg.proj.weight.shape == (16, 1, 5, 5) and peg.num_prefix_tokens == 1
    none = build_position_encoding("none", 16)
    x = torch.randn(2, 6, 16)
    assert none(x, (2, 3)) is x and none.position(x, (2, 3)) is None
    with pytest.raises(ValueError, match=r"unknown position encoding 'rope' \(registered: .*learned.*sine"):
        build_position_encoding("rope", 16)
    with pytest.raises(TypeError, match=r"build_position_encoding\('sine'"):
        build_position_encoding("sine", 16, kernel_size=3)
    with pytest.raises(ValueError, match="apply_to must be one of"):
        build_position_encoding("sine", 16, apply_to="values")


@pytest.mark.parametrize("kind", ["sine", "sincos", "learned"])
def test_encoding_errors_name_shapes(kind):
    enc = build_position_encoding(kind, 8, num_prefix_tokens=1)
    x = torch.randn(2, 1 + 6, 8)
    with pytest.raises(ValueError, match=r"N=7 .*size=\(2, 4\)"):
        enc.position(x, (2, 4))
    with pytest.raises(ValueError, match=r"mask has shape \(2, 3, 2\)"):
        enc.position(x, (2, 3), torch.zeros(2, 3, 2, dtype=torch.bool))
