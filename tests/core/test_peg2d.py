"""PEG2d against a plain float64 ``F.conv2d`` reference, plus masks, dtypes, layout and errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from peg_core import PEG2d, PEGNd, PositionEncoding

F64 = torch.float64


def bottom_right_mask(sizes: list[tuple[int, int]], grid: tuple[int, int]) -> Tensor:
    """``(B, H, W)`` bool mask, True outside each image's top-left ``(h_b, w_b)`` block (DETR padding)."""
    mask = torch.ones(len(sizes), *grid, dtype=torch.bool)
    for b, (h, w) in enumerate(sizes):
        mask[b, :h, :w] = False
    return mask


def reference(peg: PEG2d, x: Tensor, size: tuple[int, int], mask: Tensor | None = None) -> Tensor:
    """PEG written directly from the definition on an NCHW-contiguous float64 grid."""
    p, (h, w) = peg.num_prefix_tokens, size
    b, _, c = x.shape
    x = x.to(F64)
    grid = x[:, p:].transpose(1, 2).reshape(b, c, h, w).contiguous()
    keep = torch.ones(b, 1, h, w, dtype=F64) if mask is None else (~mask).to(F64)[:, None]
    k = peg.kernel_size
    bias = None if peg.proj.bias is None else peg.proj.bias.detach().to(F64)
    grid = grid * keep
    if peg.separable:
        grid = F.conv2d(grid, peg.proj_w.weight.detach().to(F64), None, padding=(0, k // 2), groups=c)
        grid = grid * keep
        out = F.conv2d(grid, peg.proj.weight.detach().to(F64), bias, padding=(k // 2, 0), groups=c)
    else:
        out = F.conv2d(grid, peg.proj.weight.detach().to(F64), bias, padding=k // 2, groups=c)
    out = out * keep
    return torch.cat([x[:, :p], x[:, p:] + out.flatten(2).transpose(1, 2)], dim=1)


def random_peg(dim: int, **kw) -> PEG2d:
    """A PEG with random (non-default-scale) weights and bias, in float64."""
    peg = PEG2d(dim, **kw).to(F64)
    with torch.no_grad():
        for prm in peg.parameters():
            prm.normal_()
    return peg


@pytest.mark.parametrize("size", [(5, 7), (7, 5), (1, 1), (1, 9), (4, 1)])
@pytest.mark.parametrize("num_prefix", [0, 1, 5])
@pytest.mark.parametrize("masked", [False, True])
def test_matches_conv2d_reference(size, num_prefix, masked):
    h, w = size
    peg = random_peg(6, num_prefix_tokens=num_prefix)
    x = torch.randn(3, num_prefix + h * w, 6, dtype=F64)
    mask = bottom_right_mask([(h, w), (max(h - 1, 1), w), (h, max(w - 2, 1))], size) if masked else None
    out = peg(x, size, mask)
    assert out.shape == x.shape and out.dtype == F64
    torch.testing.assert_close(out, reference(peg, x, size, mask), atol=1e-12, rtol=0)
    assert torch.equal(out[:, :num_prefix], x[:, :num_prefix])
    # position() is the conv output alone
    torch.testing.assert_close(peg.position(x, size, mask), out - x, atol=1e-12, rtol=0)


@pytest.mark.parametrize("kernel_size", [1, 3, 5, 7])
@pytest.mark.parametrize("separable", [False, True])
@pytest.mark.parametrize("num_prefix", [0, 1])
def test_kernel_sizes_and_separable(kernel_size, separable, num_prefix):
    size = (5, 7)
    peg = random_peg(4, kernel_size=kernel_size, separable=separable, num_prefix_tokens=num_prefix)
    x = torch.randn(2, num_prefix + 35, 4, dtype=F64)
    mask = bottom_right_mask([(3, 6), (5, 7)], size)
    for m in (None, mask):
        torch.testing.assert_close(peg(x, size, m), reference(peg, x, size, m), atol=1e-12, rtol=0)


def test_separable_is_two_convs():
    """The separable variant is exactly a 1×k then a k×1 depthwise conv (no mask)."""
    peg = random_peg(3, kernel_size=5, separable=True)
    x = torch.randn(2, 4 * 6, 3, dtype=F64)
    grid = x.transpose(1, 2).reshape(2, 3, 4, 6)
    mid = F.conv2d(grid, peg.proj_w.weight, None, padding=(0, 2), groups=3)
    want = grid + F.conv2d(mid, peg.proj.weight, peg.proj.bias, padding=(2, 0), groups=3)
    torch.testing.assert_close(peg(x, (4, 6)), want.flatten(2).transpose(1, 2), atol=1e-12, rtol=0)
    assert peg.proj_w.weight.shape == (3, 1, 1, 5) and peg.proj.weight.shape == (3, 1, 5, 1)


@pytest.mark.parametrize("separable", [False, True])
def test_zero_init_is_identity(separable):
    peg = PEG2d(8, num_prefix_tokens=1, zero_init=True, separable=separable)
    x = torch.randn(2, 1 + 12, 8)
    assert torch.equal(peg(x, (3, 4)), x)
    assert torch.equal(peg(x.permute(0, 2, 1)[..., 1:].reshape(2, 8, 3, 4)), x[:, 1:].mT.reshape(2, 8, 3, 4))
    assert peg.proj.weight.abs().sum() == 0 and peg.proj.bias.abs().sum() == 0


@pytest.mark.parametrize("masked", [False, True])
def test_feature_map_equals_tokens(masked):
    peg = random_peg(5, kernel_size=3)
    x = torch.randn(2, 4 * 7, 5, dtype=F64)
    mask = bottom_right_mask([(2, 5), (4, 7)], (4, 7)) if masked else None
    tokens_out = peg(x, (4, 7), mask)
    fmap = x.transpose(1, 2).reshape(2, 5, 4, 7).contiguous()
    for m in (fmap, fmap.contiguous(memory_format=torch.channels_last)):
        out = peg(m, mask=mask)
        assert out.shape == m.shape
        torch.testing.assert_close(out.flatten(2).transpose(1, 2), tokens_out, atol=1e-12, rtol=0)
        torch.testing.assert_close(peg.position(m, (4, 7), mask) + m, out, atol=1e-12, rtol=0)
    # a channels-last map stays channels-last
    cl = peg(fmap.contiguous(memory_format=torch.channels_last), (4, 7))
    assert cl.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("separable", [False, True])
@pytest.mark.parametrize("num_prefix", [0, 1])
def test_gradcheck(separable, num_prefix):
    peg = random_peg(2, num_prefix_tokens=num_prefix, separable=separable)
    names = [n for n, _ in peg.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_() for p in peg.parameters())
    x = torch.randn(2, num_prefix + 3 * 4, 2, dtype=F64, requires_grad=True)
    mask = bottom_right_mask([(2, 3), (3, 4)], (3, 4))

    def f(x, *ps):
        return torch.func.functional_call(peg, dict(zip(names, ps)), (x, (3, 4), mask))

    assert torch.autograd.gradcheck(f, (x, *params), fast_mode=True)
    # every parameter and the input receive a non-zero gradient
    f(x, *params).square().sum().backward()
    assert all(t.grad is not None and t.grad.abs().sum() > 0 for t in (x, *params))
    # padded positions pass through: their gradient is exactly the identity's
    g = x.grad[:, num_prefix:].reshape(2, 3, 4, 2)
    out = f(x, *params).detach()[:, num_prefix:].reshape(2, 3, 4, 2)
    assert torch.equal(g[0, 2], 2 * out[0, 2]) and torch.equal(g[0, :, 3], 2 * out[0, :, 3])


def test_bf16_module_close_to_fp32():
    peg = PEG2d(16, num_prefix_tokens=1)
    x = torch.randn(2, 1 + 5 * 6, 16)
    mask = bottom_right_mask([(4, 5), (5, 6)], (5, 6))
    want = peg(x, (5, 6), mask)
    out = peg.to(torch.bfloat16)(x.bfloat16(), (5, 6), mask)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), want, atol=0.05, rtol=0.02)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("num_prefix", [0, 1])
def test_cpu_autocast_close_to_fp32(dtype, num_prefix):
    peg = PEG2d(16, num_prefix_tokens=num_prefix)
    x = torch.randn(2, num_prefix + 5 * 6, 16)
    mask = bottom_right_mask([(4, 5), (5, 6)], (5, 6))
    want = peg(x, (5, 6), mask)
    with torch.autocast("cpu", dtype=dtype):
        out = peg(x, (5, 6), mask)
        fmap = peg(x[:, num_prefix:].mT.reshape(2, 16, 5, 6), mask=mask)
    # the residual stream keeps x's dtype; the conv ran in low precision
    assert out.dtype == torch.float32 and fmap.dtype == torch.float32
    assert not torch.equal(out, want)
    torch.testing.assert_close(out, want, atol=0.05, rtol=0.02)
    torch.testing.assert_close(fmap.flatten(2).mT, want[:, num_prefix:], atol=0.05, rtol=0.02)
    # padded positions are still exactly the input under autocast
    pad = mask.flatten(1)
    assert torch.equal(out[:, num_prefix:][pad], x[:, num_prefix:][pad])


def test_constant_input_position_only_through_zero_padding():
    """On a constant map a PEG's output varies with position only where the zero padding is seen."""
    peg = PEG2d(3, kernel_size=3)
    with torch.no_grad():
        peg.proj.weight.uniform_(0.5, 1.5)  # positive weights: a border sees fewer non-zero taps
    x = torch.full((1, 6 * 7, 3), 2.0)
    out = peg(x, (6, 7)).reshape(6, 7, 3)
    interior = out[1:-1, 1:-1]
    assert torch.allclose(interior, interior[0, 0].expand_as(interior), atol=1e-6)
    # corner, edge and centre all differ
    assert (out[0, 0] - out[3, 3]).abs().min() > 0.1
    assert (out[0, 3] - out[3, 3]).abs().min() > 0.1
    assert (out[0, 0] - out[0, 3]).abs().min() > 0.1
    # with padding that copies real values there is no position signal left
    for mode in ("circular", "replicate"):
        peg.proj.padding_mode = mode
        flat = peg(x, (6, 7)).reshape(6, 7, 3)
        assert torch.allclose(flat, flat[3, 3].expand_as(flat), atol=1e-6), mode


@pytest.mark.parametrize("separable", [False, True])
@pytest.mark.parametrize("num_prefix", [0, 1])
def test_mask_invariance_alone_vs_batched(separable, num_prefix):
    """An image's outputs do not depend on the padding its batch added (float64, exact)."""
    peg = random_peg(4, kernel_size=5, separable=separable, num_prefix_tokens=num_prefix)
    small = torch.randn(1, 4, 3, 5, dtype=F64)  # (1, C, h, w)
    big = torch.randn(1, 4, 6, 8, dtype=F64)
    padded = F.pad(small, (0, 3, 0, 3), value=7.0)  # junk in the padding must not leak in
    prefix = torch.randn(2, num_prefix, 4, dtype=F64)

    def tokens(fm: Tensor, pre: Tensor) -> Tensor:
        return torch.cat([pre, fm.flatten(2).mT], dim=1)

    alone = peg(tokens(small, prefix[:1]), (3, 5))
    mask = bottom_right_mask([(3, 5), (6, 8)], (6, 8))
    batch_in = tokens(torch.cat([padded, big]), prefix)
    batched = peg(batch_in, (6, 8), mask)
    real = batched[0, num_prefix:].reshape(6, 8, 4)[:3, :5].reshape(15, 4)
    torch.testing.assert_close(real, alone[0, num_prefix:], atol=1e-12, rtol=0)
    torch.testing.assert_close(batched[:1, :num_prefix], alone[:, :num_prefix], atol=0, rtol=0)
    # padded positions are left exactly as they were
    pad_pos = mask[0].flatten()
    assert torch.equal(batched[0, num_prefix:][pad_pos], batch_in[0, num_prefix:][pad_pos])
    # the larger image (no padding) equals its own unmasked run
    torch.testing.assert_close(batched[1:], peg(batch_in[1:], (6, 8)), atol=1e-12, rtol=0)
    # feature-map input gives the same
    fm_out = peg(torch.cat([padded, big]), mask=mask)
    torch.testing.assert_close(fm_out[0, :, :3, :5].flatten(1).mT, alone[0, num_prefix:], atol=1e-12, rtol=0)


def _conv_inputs(peg: PEG2d) -> list[Tensor]:
    seen: list[Tensor] = []
    for conv in (peg.proj, getattr(peg, "proj_w", None)):
        if conv is not None:
            conv.register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
    return seen


@pytest.mark.parametrize("num_prefix", [0, 1])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("separable", [False, True])
def test_conv_input_is_channels_last(num_prefix, masked, separable):
    """The depthwise conv gets a channels-last map (never an NCHW-contiguous copy)."""
    peg = PEG2d(16, num_prefix_tokens=num_prefix, separable=separable)
    seen = _conv_inputs(peg)
    x = torch.randn(4, num_prefix + 5 * 6, 16)
    mask = bottom_right_mask([(3, 4), (5, 6), (2, 6), (5, 1)], (5, 6)) if masked else None
    peg(x, (5, 6), mask)
    assert len(seen) == (2 if separable else 1)
    for g in seen:
        assert g.shape == (4, 16, 5, 6)
        assert g.is_contiguous(memory_format=torch.channels_last)
        assert not g.is_contiguous()
        assert g.stride() == (30 * 16, 1, 6 * 16, 16)
    if num_prefix == 0 and not masked and not separable:
        # no copy at all: the conv reads the caller's tokens in place
        assert seen[0].data_ptr() == x.data_ptr()


def test_errors_name_shapes():
    peg = PEG2d(8, num_prefix_tokens=1)
    x = torch.randn(2, 1 + 12, 8)
    with pytest.raises(ValueError, match=r"N=13 .*\(2, 13, 8\).*size=\(3, 5\).*num_prefix_tokens=1.*= 16"):
        peg(x, (3, 5))
    with pytest.raises(ValueError, match=r"N=13.*num_prefix_tokens=0"):
        PEG2d(8)(x, (3, 4))
    with pytest.raises(ValueError, match=r"mask has shape \(2, 4, 3\), expected \(B, H, W\) = \(2, 3, 4\)"):
        peg(x, (3, 4), torch.zeros(2, 4, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"mask has shape \(1, 3, 4\)"):
        peg(x, (3, 4), torch.zeros(1, 3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="bool"):
        peg(x, (3, 4), torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match=r"C=8 .*dim=4"):
        PEG2d(4, num_prefix_tokens=1)(x, (3, 4))
    with pytest.raises(ValueError, match=r"need size=\(H, W\)"):
        peg(x)
    with pytest.raises(ValueError, match=r"size=\(3, 3\) does not match .*\(3, 4\)"):
        peg(torch.randn(2, 8, 3, 4), (3, 3))
    with pytest.raises(ValueError, match=r"\(B, N, C\); got shape \(2, 13\)"):
        peg(x[..., 0], (3, 4))
    for k in (0, 2, 4, -1):
        with pytest.raises(ValueError, match=f"odd.*got {k}"):
            PEG2d(8, kernel_size=k)


@pytest.mark.parametrize("bad", [(0, 5), (-2, 3), (2.5, 4), (3, True), (3, None)])
def test_bad_sizes_are_value_errors(bad):
    """Zero, negative and non-integer sizes are named in a ValueError (not truncated, not a torch error)."""
    peg = PEG2d(4, num_prefix_tokens=1)
    x = torch.randn(2, 1 + 10, 4)
    msg = "size must be positive integers; got " + str(bad).replace("(", r"\(").replace(")", r"\)")
    for call in (peg, peg.position):
        with pytest.raises(ValueError, match=msg):
            call(x, bad)
    with pytest.raises(ValueError, match=msg):
        peg(torch.randn(2, 4, 2, 5), bad)
    # integer-like sizes are fine and give the plain-int result
    import numpy as np

    torch.testing.assert_close(peg(x, (np.int64(2), np.int64(5))), peg(x, (2, 5)), rtol=0, atol=0)


def test_state_dict_keys_and_attributes_unchanged():
    assert list(PEG2d(4).state_dict()) == ["proj.weight", "proj.bias"]
    sep = PEG2d(4, 5, num_prefix_tokens=2, separable=True)
    assert list(sep.state_dict()) == ["proj_w.weight", "proj.weight", "proj.bias"]
    assert sep.proj_w.weight.shape == (4, 1, 1, 5) and sep.proj.weight.shape == (4, 1, 5, 1)
    assert sep.kernel_size == 5 and sep.separable and sep.num_prefix_tokens == 2 and sep.dim == 4
    assert "dim=4, kernel_size=5, num_prefix_tokens=2, separable=True" in repr(sep)
    assert isinstance(sep, PEGNd) and isinstance(sep, PositionEncoding)


@pytest.mark.parametrize("num_prefix", [0, 2])
@pytest.mark.parametrize("masked", [False, True])
def test_pegnd_1d_matches_conv1d_reference(num_prefix, masked):
    """The shared implementation at rank 1: a PEG over a token sequence (tokens only, no map input)."""
    peg = PEGNd(3, (5,), num_prefix_tokens=num_prefix).to(F64)
    with torch.no_grad():
        for prm in peg.parameters():
            prm.normal_()
    x = torch.randn(2, num_prefix + 9, 3, dtype=F64)
    mask = torch.zeros(2, 9, dtype=torch.bool)
    mask[1, 6:] = True
    m = mask if masked else None
    keep = (~mask).to(F64)[:, None] if masked else torch.ones(2, 1, 9, dtype=F64)
    grid = x[:, num_prefix:].mT.contiguous() * keep
    delta = F.conv1d(grid, peg.proj.weight, peg.proj.bias, padding=2, groups=3) * keep
    want = torch.cat([x[:, :num_prefix], x[:, num_prefix:] + delta.mT], dim=1)
    out = peg(x, (9,), m)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)
    assert out.is_contiguous()  # conv1d answers channels-first: the residual add is out of place
    with pytest.raises(ValueError, match="factorized=True needs a grid of 2 or more"):
        PEGNd(3, (3,), factorized=True)
    with pytest.raises(ValueError, match=r"need size=\(L\)"):
        peg(x, (3, 3))


def test_module_pickled_before_the_shared_base_still_runs():
    """A whole PEG2d pickled by the old class (no PEGNd attributes) unpickles into a working module."""
    import pickle

    peg = random_peg(4, num_prefix_tokens=1, separable=True)
    for name in ("ndim", "_map_rank", "_factorized"):  # what the pre-PEGNd class did not have
        del peg.__dict__[name]
    back = pickle.loads(pickle.dumps(peg))
    x = torch.randn(2, 1 + 12, 4, dtype=F64)
    torch.testing.assert_close(back(x, (3, 4)), reference(back, x, (3, 4)), atol=1e-12, rtol=0)
    assert back.ndim == 2 and back.separable
