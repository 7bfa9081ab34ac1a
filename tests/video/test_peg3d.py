"""PEG3d against plain F.conv3d references, its PEG2d equivalences, layout, dtypes and errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from peg_core import PEG2d, PositionEncoding
from peg_video import PEG3d, inflate_peg2d


def conv3d_reference(x, weight, bias, size, num_prefix_tokens=0):
    """PEG from its definition: NCDHW grid, depthwise F.conv3d with zero padding, residual on grid tokens."""
    p = num_prefix_tokens
    b, _, c = x.shape
    grid = x[:, p:].transpose(1, 2).reshape(b, c, *size)
    pad = tuple(k // 2 for k in weight.shape[-3:])
    out = F.conv3d(grid, weight, bias, padding=pad, groups=c)
    return torch.cat([x[:, :p], x[:, p:] + out.flatten(2).transpose(1, 2)], dim=1)


def randomize(module):
    with torch.no_grad():
        for prm in module.parameters():
            prm.normal_()
    return module


@pytest.mark.parametrize("prefix", [0, 1])
@pytest.mark.parametrize(
    ("size", "kernel"),
    [((3, 5, 4), (3, 3, 3)), ((4, 3, 7), (3, 5, 3)), ((1, 4, 6), 3), ((5, 1, 1), (5, 1, 3))],
)
def test_matches_conv3d_reference(prefix, size, kernel):
    peg = randomize(PEG3d(6, kernel, num_prefix_tokens=prefix)).double()
    x = torch.randn(2, prefix + size[0] * size[1] * size[2], 6, dtype=torch.float64)
    ref = conv3d_reference(x, peg.proj.weight, peg.proj.bias, size, prefix)
    torch.testing.assert_close(peg(x, size), ref, rtol=0, atol=1e-12)
    # position() is the conv alone, zero at the prefix tokens.
    pos = peg.position(x, size)
    torch.testing.assert_close(pos, ref - x, rtol=0, atol=1e-12)
    assert torch.all(pos[:, :prefix] == 0)


def test_map_input_matches_tokens():
    peg = randomize(PEG3d(4)).double()
    size = (3, 4, 5)
    x = torch.randn(2, 60, 4, dtype=torch.float64)
    grid = x.transpose(1, 2).reshape(2, 4, *size)
    out_map = peg(grid, size)
    assert out_map.shape == grid.shape
    torch.testing.assert_close(out_map.flatten(2).transpose(1, 2), peg(x, size), rtol=0, atol=1e-12)
    torch.testing.assert_close(peg.position(grid), out_map - grid, rtol=0, atol=1e-12)


@pytest.mark.parametrize("prefix", [0, 1])
def test_factorized_is_spatial_then_temporal_conv(prefix):
    peg = randomize(PEG3d(5, (3, 5, 3), num_prefix_tokens=prefix, factorized=True)).double()
    assert peg.proj_s.weight.shape == (5, 1, 1, 5, 3) and peg.proj.weight.shape == (5, 1, 3, 1, 1)
    assert peg.proj_s.bias is None
    size = (4, 3, 5)
    x = torch.randn(2, prefix + 60, 5, dtype=torch.float64)
    grid = x[:, prefix:].transpose(1, 2).reshape(2, 5, *size)
    mid = F.conv3d(grid, peg.proj_s.weight, None, padding=(0, 2, 1), groups=5)
    out = F.conv3d(mid, peg.proj.weight, peg.proj.bias, padding=(1, 0, 0), groups=5)
    ref = x.clone()
    ref[:, prefix:] += out.flatten(2).transpose(1, 2)
    torch.testing.assert_close(peg(x, size), ref, rtol=0, atol=1e-12)
    # cheaper than the full kernel: 5*3 + 3 weights per channel instead of 3*5*3
    assert sum(p.numel() for p in peg.parameters()) == 5 * (15 + 3 + 1)


@pytest.mark.parametrize("prefix", [0, 1])
def test_single_frame_equals_peg2d_with_centre_slice(prefix):
    peg3 = randomize(PEG3d(6, (3, 5, 5), num_prefix_tokens=prefix)).double()
    peg2 = PEG2d(6, 5, num_prefix_tokens=prefix).double()
    with torch.no_grad():
        peg2.proj.weight.copy_(peg3.proj.weight[:, :, 1])
        peg2.proj.bias.copy_(peg3.proj.bias)
    x = torch.randn(3, prefix + 7 * 4, 6, dtype=torch.float64)
    torch.testing.assert_close(peg3(x, (1, 7, 4)), peg2(x, (7, 4)), rtol=0, atol=1e-12)


@pytest.mark.parametrize("separable", [False, True])
@pytest.mark.parametrize("factorized", [False, True])
def test_inflated_peg2d_acts_per_frame(separable, factorized):
    peg2 = randomize(PEG2d(4, 3, num_prefix_tokens=1, separable=separable)).double()
    peg3 = inflate_peg2d(peg2, temporal_kernel=5, factorized=factorized)
    assert peg3.kernel_size == (5, 3, 3) and peg3.num_prefix_tokens == 1 and peg3.factorized == factorized
    assert peg3.proj.weight.dtype == torch.float64
    if not factorized:  # zeros outside the centre slice
        assert torch.all(peg3.proj.weight[:, :, [0, 1, 3, 4]] == 0)
    t, h, w = 6, 5, 3
    grid = torch.randn(2, 4, t, h, w, dtype=torch.float64)
    per_frame = torch.stack([peg2(grid[:, :, i]) for i in range(t)], dim=2)
    torch.testing.assert_close(peg3(grid), per_frame, rtol=0, atol=1e-12)
    # token form, with the class token passed through
    tokens = torch.cat([torch.randn(2, 1, 4, dtype=torch.float64), grid.flatten(2).transpose(1, 2)], 1)
    out = peg3(tokens, (t, h, w))
    torch.testing.assert_close(out[:, 0], tokens[:, 0], rtol=0, atol=0)
    torch.testing.assert_close(out[:, 1:], per_frame.flatten(2).transpose(1, 2), rtol=0, atol=1e-12)


def test_gradients_match_reference():
    peg = randomize(PEG3d(3, (3, 3, 3), num_prefix_tokens=1)).double()
    size = (2, 3, 4)
    x = torch.randn(2, 25, 3, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda t: peg(t, size), (x,), fast_mode=True)
    g = torch.randn(2, 25, 3, dtype=torch.float64)
    gx, gw, gb = torch.autograd.grad((peg(x, size) * g).sum(), (x, peg.proj.weight, peg.proj.bias))
    w = peg.proj.weight.detach().clone().requires_grad_()
    b = peg.proj.bias.detach().clone().requires_grad_()
    rx, rw, rb = torch.autograd.grad((conv3d_reference(x, w, b, size, 1) * g).sum(), (x, w, b))
    for ours, ref in ((gx, rx), (gw, rw), (gb, rb)):
        torch.testing.assert_close(ours, ref, rtol=0, atol=1e-10)


def test_conv_runs_on_channels_last_view_without_copy():
    peg = PEG3d(8, factorized=False)
    size = (3, 4, 5)
    x = torch.randn(2, 60, 8)
    seen = {}
    peg.proj.register_forward_pre_hook(lambda m, args: seen.update(grid=args[0]))
    peg(x, size)
    grid = seen["grid"]
    assert grid.shape == (2, 8, *size)
    assert grid.data_ptr() == x.data_ptr()  # a view of the tokens
    assert grid.is_contiguous(memory_format=torch.channels_last_3d)
    assert not grid.is_contiguous()  # no NCDHW copy
    assert grid.stride() == (60 * 8, 1, 4 * 5 * 8, 5 * 8, 8)


def test_bfloat16_runs_and_tracks_float32():
    peg = PEG3d(16, num_prefix_tokens=1)
    x = torch.randn(2, 1 + 2 * 5 * 6, 16)
    ref = peg(x, (2, 5, 6))
    out = peg.to(torch.bfloat16)(x.bfloat16(), (2, 5, 6))
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=5e-2)


def test_zero_init_is_identity_and_interface():
    peg = PEG3d(4, zero_init=True)
    x = torch.randn(1, 2 * 3 * 3, 4)
    torch.testing.assert_close(peg(x, (2, 3, 3)), x, rtol=0, atol=0)
    assert isinstance(peg, PositionEncoding) and peg.apply_to == "tokens" and peg.conditional
    assert "factorized=False" in repr(peg)


def test_errors_name_the_shapes():
    peg = PEG3d(4, num_prefix_tokens=1)
    x = torch.randn(2, 1 + 2 * 3 * 4, 4)
    with pytest.raises(ValueError, match=r"N=25 tokens.*needs N = 1 \+ 2x3x5 = 31"):
        peg(x, (2, 3, 5))
    with pytest.raises(ValueError, match=r"need size=\(T, H, W\)"):
        peg(x, None)
    with pytest.raises(ValueError, match=r"need size=\(T, H, W\)"):
        peg(x, (6, 4))
    with pytest.raises(ValueError, match="C=5 channels"):
        peg(torch.randn(2, 25, 5), (2, 3, 4))
    with pytest.raises(ValueError, match=r"size=\(1, 3, 4\) does not match.*\(2, 3, 4\)"):
        peg(torch.randn(2, 4, 2, 3, 4), (1, 3, 4))
    with pytest.raises(ValueError, match="C=3 channels"):
        peg(torch.randn(2, 3, 2, 3, 4))
    with pytest.raises(ValueError, match="no padding mask"):
        peg(x, (2, 3, 4), mask=torch.zeros(2, 2, 3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="tokens"):
        peg(torch.randn(25, 4), (2, 3, 4))
    for bad in (2, (3, 3), (3, 4, 3), 0):
        with pytest.raises(ValueError, match="odd"):
            PEG3d(4, bad)
