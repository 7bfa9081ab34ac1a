"""resize_pos_embed against direct F.interpolate references, the worked example and every error."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from peg_core import infer_grid, resize_pos_embed, resize_pos_embed_1d, resize_pos_embed_3d


def interpolate_reference(posemb: Tensor, old: tuple, new: tuple, prefix: int, mode: str, **kw) -> Tensor:
    """Prefix kept, grid reshaped NC(...)-contiguous in float32, ``F.interpolate``, flattened back."""
    c = posemb.shape[-1]
    grid = posemb[:, prefix:].float().reshape(1, *old, c).movedim(-1, 1).contiguous()
    out = F.interpolate(grid, size=new, mode=mode, **kw).movedim(1, -1).reshape(1, -1, c)
    return torch.cat([posemb[:, :prefix], out.to(posemb.dtype)], dim=1)


def test_identity_returns_input_object():
    pe = torch.randn(1, 1 + 196, 8)
    assert resize_pos_embed(pe, (14, 14)) is pe
    assert resize_pos_embed(pe, 14, old_size=(14, 14)) is pe
    flat = torch.randn(12, 8)
    assert resize_pos_embed(flat, (3, 4), (3, 4), num_prefix_tokens=0) is flat


def test_same_count_other_grid_is_resized():
    pe = torch.randn(1, 1 + 16, 4)
    out = resize_pos_embed(pe, (4, 4), old_size=(2, 8), mode="bilinear")
    assert out is not pe and out.shape == pe.shape
    assert not torch.equal(out, pe)
    want = interpolate_reference(pe, (2, 8), (4, 4), 1, "bilinear", align_corners=False)
    torch.testing.assert_close(out, want)


def test_worked_example_224_to_384_nearest():
    """14×14 (224 px, 16 px patches) -> 24×24 (384 px): new patch (12, 12) takes old (7, 7)."""
    pe = torch.randn(1, 1 + 14 * 14, 16)
    out = resize_pos_embed(pe, (24, 24), num_prefix_tokens=1, mode="nearest")
    assert out.shape == (1, 1 + 24 * 24, 16)
    assert torch.equal(out[0, 1 + 12 * 24 + 12], pe[0, 1 + 7 * 14 + 7])
    # every new patch (i, j) takes old (floor(i·14/24), floor(j·14/24))
    new = out[0, 1:].reshape(24, 24, 16)
    old = pe[0, 1:].reshape(14, 14, 16)
    idx = torch.arange(24) * 14 // 24
    assert torch.equal(new, old[idx][:, idx])
    assert torch.equal(out[:, :1], pe[:, :1])


@pytest.mark.parametrize("old,new", [((3, 5), (6, 4)), ((6, 4), (3, 5)), ((4, 4), (2, 7)), ((1, 9), (5, 1))])
@pytest.mark.parametrize("mode", ["nearest", "bilinear", "bicubic", "area"])
def test_modes_non_square_match_interpolate(old, new, mode):
    pe = torch.randn(1, 2 + old[0] * old[1], 6)
    out = resize_pos_embed(pe, new, old, num_prefix_tokens=2, mode=mode)
    kw = {"align_corners": False} if mode in ("bilinear", "bicubic") else {}
    want = interpolate_reference(pe, old, new, 2, mode, **kw)
    assert out.shape == (1, 2 + new[0] * new[1], 6)
    torch.testing.assert_close(out, want, atol=1e-6, rtol=1e-6)
    assert torch.equal(out[:, :2], pe[:, :2])


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_antialias_and_align_corners(mode):
    pe = torch.randn(1, 1 + 12 * 10, 4)
    out = resize_pos_embed(pe, (5, 4), (12, 10), mode=mode, antialias=True)
    want = interpolate_reference(pe, (12, 10), (5, 4), 1, mode, align_corners=False, antialias=True)
    torch.testing.assert_close(out, want, atol=1e-6, rtol=1e-6)
    assert not torch.allclose(out, resize_pos_embed(pe, (5, 4), (12, 10), mode=mode), atol=1e-3)
    out = resize_pos_embed(pe, (7, 13), (12, 10), mode=mode, align_corners=True)
    want = interpolate_reference(pe, (12, 10), (7, 13), 1, mode, align_corners=True)
    torch.testing.assert_close(out, want, atol=1e-6, rtol=1e-6)
    # align_corners=True keeps the four corner embeddings exactly
    new, old = out[0, 1:].reshape(7, 13, 4), pe[0, 1:].reshape(12, 10, 4)
    torch.testing.assert_close(new[[0, 0, -1, -1], [0, -1, 0, -1]], old[[0, 0, -1, -1], [0, -1, 0, -1]])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dtype_round_trip_computed_in_float32(dtype):
    pe = torch.randn(1, 1 + 7 * 7, 8).to(dtype)
    out = resize_pos_embed(pe, (10, 9), mode="bicubic")
    assert out.dtype == dtype
    want = interpolate_reference(pe, (7, 7), (10, 9), 1, "bicubic", align_corners=False)
    assert torch.equal(out, want)  # float32 maths, one rounding at the end
    assert torch.equal(out[:, :1], pe[:, :1])


def test_float64_stays_float64():
    pe = torch.randn(1, 1 + 9, 4, dtype=torch.float64)
    out = resize_pos_embed(pe, (5, 5), mode="bilinear")
    grid = pe[:, 1:].reshape(1, 3, 3, 4).permute(0, 3, 1, 2)
    want = F.interpolate(grid, size=(5, 5), mode="bilinear", align_corners=False).flatten(2).mT
    assert out.dtype == torch.float64
    torch.testing.assert_close(out[:, 1:], want, atol=1e-12, rtol=0)


@pytest.mark.parametrize("prefix", [0, 1, 4])
def test_prefix_tokens_untouched_and_2d_input(prefix):
    pe = torch.randn(1, prefix + 16, 5, requires_grad=True)
    out = resize_pos_embed(pe, (2, 3), num_prefix_tokens=prefix, mode="area")
    assert torch.equal(out[:, :prefix], pe[:, :prefix])
    # the unbatched (N, C) form gives the same values back unbatched
    flat = resize_pos_embed(pe[0], (2, 3), num_prefix_tokens=prefix, mode="area")
    assert flat.shape == (prefix + 6, 5) and torch.equal(flat, out[0])
    # prefix entries are copied through, so each gets a gradient of exactly one
    out.sum().backward()
    assert pe.grad is not None and torch.equal(pe.grad[0, :prefix], torch.ones(prefix, 5))


def test_errors():
    pe = torch.randn(1, 1 + 12, 4)
    with pytest.raises(ValueError, match=r"square.*12 grid tokens.*old_size"):
        resize_pos_embed(pe, (4, 4))
    with pytest.raises(ValueError, match=r"antialias.*'nearest'"):
        resize_pos_embed(torch.randn(1, 1 + 16, 4), (8, 8), mode="nearest", antialias=True)
    with pytest.raises(ValueError, match=r"antialias.*'area'"):
        resize_pos_embed(torch.randn(1, 1 + 16, 4), (2, 2), mode="area", antialias=True)
    with pytest.raises(ValueError, match=r"align_corners.*'nearest'"):
        resize_pos_embed(torch.randn(1, 1 + 16, 4), (8, 8), mode="nearest", align_corners=True)
    with pytest.raises(ValueError, match=r"mode='trilinear' is not available for a 2D grid"):
        resize_pos_embed(pe, (4, 4), (3, 4), mode="trilinear")
    with pytest.raises(ValueError, match=r"old_size=\(3, 3\) holds 9"):
        resize_pos_embed(pe, (4, 4), (3, 3))
    with pytest.raises(ValueError, match="different ranks"):
        resize_pos_embed(pe, (4, 4), (2, 2, 3))
    with pytest.raises(ValueError, match=r"posemb must be \(1, N, C\)"):
        resize_pos_embed(torch.randn(13), (4, 4))
    with pytest.raises(ValueError, match="must be positive"):
        resize_pos_embed(pe, (0, 4), (3, 4))
    with pytest.raises(ValueError, match="num_prefix_tokens=20"):
        resize_pos_embed(pe, (4, 4), num_prefix_tokens=20)


def test_infer_grid():
    assert infer_grid(196) == (14, 14) and infer_grid(1) == (1, 1) and infer_grid(27, 3) == (3, 3, 3)
    with pytest.raises(ValueError, match="cubic"):
        infer_grid(12, 3)


def test_1d_temporal():
    pe = torch.randn(1, 8, 6)
    out = resize_pos_embed_1d(pe, 5)
    want = F.interpolate(pe.mT, size=5, mode="linear", align_corners=False).mT
    torch.testing.assert_close(out, want)
    assert resize_pos_embed_1d(pe, 8) is pe
    near = resize_pos_embed_1d(pe, 16, mode="nearest")
    assert torch.equal(near[0, 1::2], pe[0]) and torch.equal(near[0, 0::2], pe[0])
    with_cls = resize_pos_embed_1d(torch.cat([torch.zeros(1, 1, 6), pe], 1), 5, num_prefix_tokens=1)
    torch.testing.assert_close(with_cls[:, 1:], want)
    with pytest.raises(ValueError, match="not available for a 1D grid"):
        resize_pos_embed_1d(pe, 5, mode="bicubic")


@pytest.mark.parametrize("mode", ["trilinear", "nearest", "area"])
def test_3d_space_time(mode):
    pe = torch.randn(1, 1 + 2 * 3 * 4, 6)
    out = resize_pos_embed_3d(pe, (4, 6, 2), (2, 3, 4), num_prefix_tokens=1, mode=mode)
    kw = {"align_corners": False} if mode == "trilinear" else {}
    want = interpolate_reference(pe, (2, 3, 4), (4, 6, 2), 1, mode, **kw)
    torch.testing.assert_close(out, want, atol=1e-6, rtol=1e-6)
    assert out.shape == (1, 1 + 48, 6)
    # a cubic table is inferred when old_size is omitted
    cube = torch.randn(1, 27, 6)
    assert resize_pos_embed_3d(cube, (3, 3, 3)) is cube
    assert resize_pos_embed_3d(cube, (2, 3, 3), mode=mode).shape == (1, 18, 6)


@pytest.mark.parametrize("bad", [(2.5, 3.5), (0, 3), (-1, 3), (3, 2.5)])
def test_bad_sizes_are_value_errors(bad):
    """Non-positive or fractional sizes are refused by name: 2.5 is not truncated to 2, -1 is not torch's error."""
    pe = torch.randn(1, 1 + 12, 4)
    text = str(bad).replace("(", r"\(").replace(")", r"\)")
    with pytest.raises(ValueError, match=r"new_size must be positive integers; got " + text):
        resize_pos_embed(pe, bad, (3, 4))
    with pytest.raises(ValueError, match=r"old_size must be positive integers; got " + text):
        resize_pos_embed(pe, (4, 4), bad)
    cube = torch.randn(1, 24, 4)
    with pytest.raises(ValueError, match=r"new_size must be positive integers; got \(2, " + text[2:]):
        resize_pos_embed_3d(cube, (2, *bad))
    with pytest.raises(ValueError, match=r"old_size must be positive integers; got \(2, " + text[2:]):
        resize_pos_embed_3d(cube, (2, 3, 4), (2, *bad))


@pytest.mark.parametrize("bad", [2.5, 0, -1])
def test_bad_scalar_sizes_are_value_errors(bad):
    pe = torch.randn(1, 8, 4)
    with pytest.raises(ValueError, match=f"new_len must be a positive integer; got {bad}"):
        resize_pos_embed_1d(pe, bad)
    with pytest.raises(ValueError, match=f"old_len must be a positive integer; got {bad}"):
        resize_pos_embed_1d(pe, 4, bad)
    with pytest.raises(ValueError, match=f"new_size must be a positive integer; got {bad}"):
        resize_pos_embed(torch.randn(1, 16, 4), bad, num_prefix_tokens=0)
    # a valid resize still works and keeps its values
    out = resize_pos_embed_1d(pe, 16, mode="nearest")
    assert torch.equal(out[0, ::2], pe[0])


def test_prefix_tokens_beyond_the_table():
    """More prefix tokens than rows: a clear error, not round() of a complex square root."""
    from peg_core.interop import resize_checkpoint

    table = torch.randn(1, 197, 8)
    with pytest.raises(ValueError, match=r"num_prefix_tokens=500 exceeds the 197 tokens of the table"):
        resize_pos_embed(table, (7, 7), num_prefix_tokens=500)
    with pytest.raises(ValueError, match=r"num_prefix_tokens=197 exceeds the 197 tokens"):
        resize_pos_embed(table, (7, 7), num_prefix_tokens=197)
    with pytest.raises(ValueError, match=r"num_prefix_tokens must be an int >= 0; got -1"):
        resize_pos_embed(table, (7, 7), num_prefix_tokens=-1)
    with pytest.raises(ValueError, match=r"num_prefix_tokens=500 exceeds the 197 tokens of the table"):
        resize_checkpoint({"pos_embed": table}, (7, 7), num_prefix_tokens=500)
    with pytest.raises(ValueError, match=r"at least one token; got -303"):
        infer_grid(197 - 500)
    # the right count still resizes
    _, change = resize_checkpoint({"pos_embed": table}, (7, 7), num_prefix_tokens=1)
    assert change.old_grid == (14, 14) and change.new_shape == (1, 50, 8)


def test_cli_prefix_tokens_beyond_the_table(tmp_path, capsys):
    from peg_core.__main__ import main as cli

    torch.save({"pos_embed": torch.randn(1, 197, 8)}, tmp_path / "in.pth")
    argv = ["resize-pos-embed", str(tmp_path / "in.pth"), str(tmp_path / "out.pth"), "--grid", "7x7"]
    assert cli([*argv, "--prefix-tokens", "500"]) == 1
    err = capsys.readouterr().err
    assert "num_prefix_tokens=500 exceeds the 197 tokens of the table" in err and "complex" not in err
    assert not (tmp_path / "out.pth").exists()
