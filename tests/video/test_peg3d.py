"""PEG3d against plain F.conv3d references, its PEG2d equivalences, layout, dtypes and errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from peg_core import PEG2d, PEGNd, PositionEncoding
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


@pytest.mark.parametrize("prefix", [0, 1, 2])
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
    # a mask is accepted now (see test_mask_invariance_alone_vs_batched), but must fit the grid
    with pytest.raises(
        ValueError, match=r"mask has shape \(2, 3, 4\), expected \(B, T, H, W\) = \(2, 2, 3, 4\)"
    ):
        peg(x, (2, 3, 4), mask=torch.zeros(2, 3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="bool"):
        peg(x, (2, 3, 4), mask=torch.zeros(2, 2, 3, 4))
    with pytest.raises(ValueError, match="tokens"):
        peg(torch.randn(25, 4), (2, 3, 4))
    for bad in (2, (3, 3), (3, 4, 3), 0):
        with pytest.raises(ValueError, match="odd"):
            PEG3d(4, bad)


# --- the shared PEGNd implementation: fast paths, masks, layout, sizes ---------------------------

F64 = torch.float64


def end_padding_mask(sizes, grid):
    """``(B, T, H, W)`` bool, True outside each clip's leading ``(t_b, h_b, w_b)`` block."""
    mask = torch.ones(len(sizes), *grid, dtype=torch.bool)
    for b, (t, h, w) in enumerate(sizes):
        mask[b, :t, :h, :w] = False
    return mask


def reference3d(peg, x, size, mask=None):
    """PEG3d from its definition on an NCDHW-contiguous float64 grid, masks and factorized included."""
    p = peg.num_prefix_tokens
    b, _, c = x.shape
    x = x.to(F64)
    grid = x[:, p:].transpose(1, 2).reshape(b, c, *size).contiguous()
    keep = torch.ones(b, 1, *size, dtype=F64) if mask is None else (~mask).to(F64)[:, None]
    bias = None if peg.proj.bias is None else peg.proj.bias.detach().to(F64)
    kt, kh, kw = peg.kernel_size
    grid = grid * keep
    if peg.factorized:
        grid = F.conv3d(
            grid, peg.proj_s.weight.detach().to(F64), None, padding=(0, kh // 2, kw // 2), groups=c
        )
        grid = grid * keep
        out = F.conv3d(grid, peg.proj.weight.detach().to(F64), bias, padding=(kt // 2, 0, 0), groups=c)
    else:
        out = F.conv3d(
            grid, peg.proj.weight.detach().to(F64), bias, padding=(kt // 2, kh // 2, kw // 2), groups=c
        )
    out = out * keep
    return torch.cat([x[:, :p], x[:, p:] + out.flatten(2).transpose(1, 2)], dim=1)


@pytest.mark.parametrize("prefix", [0, 1, 2])
@pytest.mark.parametrize("factorized", [False, True])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize(("size", "kernel"), [((3, 5, 4), (3, 5, 3)), ((2, 1, 6), (5, 3, 3)), ((4, 3, 2), 3)])
def test_fast_path_matches_float64_reference(prefix, factorized, masked, size, kernel):
    peg = randomize(PEG3d(5, kernel, num_prefix_tokens=prefix, factorized=factorized)).double()
    t, h, w = size
    x = torch.randn(3, prefix + t * h * w, 5, dtype=F64)
    small = (max(t - 1, 1), h, max(w - 1, 1))
    mask = end_padding_mask([size, small, (t, max(h - 1, 1), w)], size) if masked else None
    want = reference3d(peg, x, size, mask)
    out = peg(x, size, mask)
    assert out.shape == x.shape and out.is_contiguous()
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)
    assert torch.equal(out[:, :prefix], x[:, :prefix])
    pos = peg.position(x, size, mask)
    torch.testing.assert_close(pos, want - x, rtol=0, atol=1e-12)
    if masked:  # padded positions are left exactly as they were, their codes are zero
        pad = mask.flatten(1)
        assert torch.equal(out[:, prefix:][pad], x[:, prefix:][pad])
        assert torch.all(pos[:, prefix:][pad] == 0)
    # the same in float32 (channels-last conv kernels, in-place residual) to float32 accuracy
    out32 = peg.float()(x.float(), size, mask)
    torch.testing.assert_close(out32, want.float(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("factorized", [False, True])
@pytest.mark.parametrize("prefix", [0, 1])
def test_mask_invariance_alone_vs_batched(factorized, prefix):
    """A clip's outputs do not depend on the padding its batch added (float64, exact)."""
    peg = randomize(PEG3d(4, (3, 5, 3), num_prefix_tokens=prefix, factorized=factorized)).double()
    small = torch.randn(1, 4, 2, 3, 5, dtype=F64)  # (1, C, t, h, w)
    big = torch.randn(1, 4, 4, 6, 7, dtype=F64)
    padded = F.pad(small, (0, 2, 0, 3, 0, 2), value=7.0)  # junk in the padding must not leak in
    pre = torch.randn(2, prefix, 4, dtype=F64)

    def tokens(clip, p):
        return torch.cat([p, clip.flatten(2).mT], dim=1)

    alone = peg(tokens(small, pre[:1]), (2, 3, 5))
    mask = end_padding_mask([(2, 3, 5), (4, 6, 7)], (4, 6, 7))
    batch_in = tokens(torch.cat([padded, big]), pre)
    batched = peg(batch_in, (4, 6, 7), mask)
    real = batched[0, prefix:].reshape(4, 6, 7, 4)[:2, :3, :5].reshape(30, 4)
    torch.testing.assert_close(real, alone[0, prefix:], rtol=0, atol=1e-12)
    assert torch.equal(batched[:1, :prefix], alone[:, :prefix])
    pad = mask[0].flatten()
    assert torch.equal(batched[0, prefix:][pad], batch_in[0, prefix:][pad])
    # the unpadded clip equals its own unmasked run; the feature-map input gives the same
    torch.testing.assert_close(batched[1:], peg(batch_in[1:], (4, 6, 7)), rtol=0, atol=1e-12)
    fmap = peg(torch.cat([padded, big]), mask=mask)
    torch.testing.assert_close(fmap[0, :, :2, :3, :5].flatten(1).mT, alone[0, prefix:], rtol=0, atol=1e-12)


def _conv_inputs(peg):
    seen = []
    for conv in (peg.proj, getattr(peg, "proj_s", None)):
        if conv is not None:
            conv.register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
    return seen


@pytest.mark.parametrize("prefix", [0, 1, 2])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("factorized", [False, True])
def test_conv_input_is_channels_last_3d_behind_prefix_tokens(prefix, masked, factorized):
    """The conv gets a dense channels-last-3d grid (one copy behind prefix tokens), never NCDHW."""
    peg = PEG3d(8, num_prefix_tokens=prefix, factorized=factorized)
    seen = _conv_inputs(peg)
    size = (3, 4, 5)
    x = torch.randn(2, prefix + 60, 8)
    mask = end_padding_mask([(3, 4, 5), (2, 3, 4)], size) if masked else None
    peg(x, size, mask)
    assert len(seen) == (2 if factorized else 1)
    for g in seen:
        assert g.shape == (2, 8, *size)
        assert g.is_contiguous(memory_format=torch.channels_last_3d)
        assert not g.is_contiguous()
        assert g.stride() == (60 * 8, 1, 4 * 5 * 8, 5 * 8, 8)
    if prefix == 0 and not masked:
        # no copy at all: the first conv reads the caller's tokens in place
        assert seen[0].data_ptr() == x.data_ptr()


@pytest.mark.parametrize("prefix", [0, 1])
@pytest.mark.parametrize("masked", [False, True])
def test_residual_is_added_into_the_conv_output(prefix, masked):
    """float32 on CPU: the conv answers channels-last-3d and the residual goes into that buffer."""
    peg = randomize(PEG3d(8, num_prefix_tokens=prefix))
    outs = []
    peg.proj.register_forward_hook(lambda _m, _a, out: outs.append(out))
    size = (2, 3, 4)
    x = torch.randn(2, prefix + 24, 8)
    mask = end_padding_mask([(2, 3, 4), (1, 2, 4)], size) if masked else None
    out = peg(x, size, mask)
    (conv_out,) = outs
    assert conv_out.is_contiguous(memory_format=torch.channels_last_3d)
    # after the call the conv's buffer holds x + delta, i.e. the grid part of the output
    assert torch.equal(conv_out.permute(0, 2, 3, 4, 1).reshape(2, 24, 8), out[:, prefix:])
    if prefix == 0:
        assert out.data_ptr() == conv_out.data_ptr()  # no extra output buffer
    want = reference3d(peg, x, size, mask).float()
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def test_channels_first_conv_output_falls_back_to_out_of_place():
    """CPU float64 conv3d answers NCDHW: the add is then out of place, so the tokens stay dense."""
    peg = randomize(PEG3d(4)).double()
    x = torch.randn(2, 2 * 3 * 4, 4, dtype=F64)
    out = peg(x, (2, 3, 4))
    assert out.is_contiguous()
    torch.testing.assert_close(out, reference3d(peg, x, (2, 3, 4)), rtol=0, atol=1e-12)


@pytest.mark.parametrize("prefix", [0, 1])
@pytest.mark.parametrize("masked", [False, True])
def test_one_frame_with_kt1_equals_peg2d(prefix, masked):
    """The shared implementation: PEG3d with T=1, kT=1 is PEG2d with the same weights (tokens and maps)."""
    peg3 = randomize(PEG3d(6, (1, 5, 3), num_prefix_tokens=prefix))
    peg2 = PEG2d(6, 5, num_prefix_tokens=prefix)
    # PEG2d's kernel is square; a zero outer column pair turns the 5x3 kernel into 5x5
    with torch.no_grad():
        peg2.proj.weight.zero_()
        peg2.proj.weight[:, :, :, 1:4] = peg3.proj.weight[:, :, 0]
        peg2.proj.bias.copy_(peg3.proj.bias)
    x = torch.randn(3, prefix + 4 * 7, 6)
    mask2 = torch.zeros(3, 4, 7, dtype=torch.bool)
    mask2[1, 3:] = True
    mask2[2, :, 5:] = True
    m2, m3 = (mask2, mask2[:, None]) if masked else (None, None)
    torch.testing.assert_close(peg3(x, (1, 4, 7), m3), peg2(x, (4, 7), m2), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(
        peg3.position(x, (1, 4, 7), m3), peg2.position(x, (4, 7), m2), rtol=1e-6, atol=1e-6
    )
    fmap = x[:, prefix:].mT.reshape(3, 6, 4, 7)
    torch.testing.assert_close(
        peg3(fmap[:, :, None], mask=m3)[:, :, 0], peg2(fmap, mask=m2), rtol=1e-6, atol=1e-6
    )
    # one forward for both: the subclasses only fix the rank and the parameter names
    assert PEG3d.forward is PEG2d.forward and PEG3d.conv is PEG2d.conv
    assert isinstance(peg3, PEGNd) and isinstance(peg2, PEGNd)


def test_state_dict_keys_and_attributes_unchanged():
    assert list(PEG3d(4).state_dict()) == ["proj.weight", "proj.bias"]
    fac = PEG3d(4, (3, 5, 7), num_prefix_tokens=1, factorized=True, bias=False)
    assert list(fac.state_dict()) == ["proj_s.weight", "proj.weight"]
    assert fac.proj_s.weight.shape == (4, 1, 1, 5, 7) and fac.proj.weight.shape == (4, 1, 3, 1, 1)
    assert fac.kernel_size == (3, 5, 7) and fac.factorized and fac.num_prefix_tokens == 1 and fac.dim == 4
    assert PEG3d(4, 5).kernel_size == (5, 5, 5)
    assert repr(fac) == "PEG3d(\n  dim=4, kernel_size=(3, 5, 7), num_prefix_tokens=1, factorized=True\n" + (
        "  (proj_s): Conv3d(4, 4, kernel_size=(1, 5, 7), stride=(1, 1, 1), padding=(0, 2, 3), groups=4, bias=False)\n"
        "  (proj): Conv3d(4, 4, kernel_size=(3, 1, 1), stride=(1, 1, 1), padding=(1, 0, 0), groups=4, bias=False)\n)"
    )
    # peg_video re-exports peg_core's class, and its 3-D grid helpers view the tokens without copies
    import peg_core
    import peg_video
    from peg_video.grid3d import grid3d_to_tokens, tokens_to_grid3d

    assert peg_video.PEG3d is peg_core.PEG3d
    x = torch.randn(2, 24, 5)
    grid = tokens_to_grid3d(x, (2, 3, 4))
    assert grid.shape == (2, 5, 2, 3, 4) and grid.data_ptr() == x.data_ptr()
    assert torch.equal(grid, x.mT.reshape(2, 5, 2, 3, 4))
    assert torch.equal(grid3d_to_tokens(grid), x)


@pytest.mark.parametrize("bad", [(0, 5, 1), (2, -1, 3), (2, 2.5, 4), (2, True, 12)])
def test_bad_sizes_are_value_errors(bad):
    peg = PEG3d(4, num_prefix_tokens=1)
    x = torch.randn(2, 1 + 24, 4)
    msg = "size must be positive integers; got " + str(bad).replace("(", r"\(").replace(")", r"\)")
    for call in (peg, peg.position):
        with pytest.raises(ValueError, match=msg):
            call(x, bad)
    with pytest.raises(ValueError, match=msg):
        peg(torch.randn(2, 4, 2, 3, 4), bad)


def test_compile_dynamic_thw_one_graph():
    """Under torch.compile the sizes are SymInts: accepted as they are, one graph for all clip sizes."""
    from torch._dynamo.testing import CompileCounter

    peg = PEG3d(8, num_prefix_tokens=1, factorized=True).eval()
    counter = CompileCounter()
    compiled = torch.compile(peg, backend=counter, dynamic=True, fullgraph=True)
    # no size equal to B=2 or C=8: dynamo's duck sizing would tie those dims together
    for size in ((3, 5, 6), (4, 3, 7)):
        x = torch.randn(2, 1 + size[0] * size[1] * size[2], 8)
        mask = torch.zeros(2, *size, dtype=torch.bool)
        mask[1, -1] = True
        for m in (None, mask):
            torch.testing.assert_close(compiled(x, size, m), peg(x, size, m), rtol=0, atol=0)
    assert counter.frame_count == 2, counter.frame_count
