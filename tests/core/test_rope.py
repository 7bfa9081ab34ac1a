"""Rotary encodings (peg_core.rope): float64 rotation-matrix references, layouts, masks, dtypes, compile, export."""

from __future__ import annotations

import math

import pytest
import torch

from peg_core import RoPEAxial, RoPEDinoV3, RoPEMixed, apply_rope, build_rope, rope_coords
from peg_core.models.layers import Attention


def _pairs(d: int, half: bool) -> list[tuple[int, int]]:
    return [(j, j + d // 2) for j in range(d // 2)] if half else [(2 * j, 2 * j + 1) for j in range(d // 2)]


def reference_rotation(x: torch.Tensor, angles: torch.Tensor, p: int, half: bool) -> torch.Tensor:
    """Explicit float64 loop: token ``n`` (after ``p`` prefix tokens), pair ``j`` times a 2x2 rotation matrix.

    ``x`` ``(heads, P + N, D)``, ``angles`` ``(heads or 1, N, D/2)``.
    """
    x = x.double()
    out = x.clone()
    heads, _, d = x.shape
    for h in range(heads):
        for n in range(angles.shape[1]):
            for j, (a, b) in enumerate(_pairs(d, half)):
                t = float(angles[h % angles.shape[0], n, j])
                rot = torch.tensor(
                    [[math.cos(t), -math.sin(t)], [math.sin(t), math.cos(t)]], dtype=torch.float64
                )
                out[h, p + n, [a, b]] = rot @ x[h, p + n, [a, b]]
    return out


def axial_angles(coords: torch.Tensor, d: int, temperature: float, ndim: int) -> torch.Tensor:
    """Angles ``(1, N, D/2)`` from the formula: section ``a`` of ``n`` pairs on coordinate ``a``."""
    n = (d // 2) // ndim
    ang = torch.zeros(1, coords.shape[0], d // 2, dtype=torch.float64)
    for a in range(ndim):
        for i in range(n):
            ang[0, :, a * n + i] = coords[:, a].double() * temperature ** (-i / n)
    return ang


@pytest.mark.parametrize("size", [(3, 5), (4, 4), (5, 2)])
@pytest.mark.parametrize("indexing", ["ij", "xy"])
def test_axial_matches_rotation_matrices_float64(size, indexing):
    d, p = 16, 1
    rope = RoPEAxial(d, temperature=100.0, indexing=indexing).double()
    sin, cos = rope(size, num_prefix_tokens=p)
    assert sin.dtype == torch.float64 and sin.shape == (p + size[0] * size[1], d)
    x = torch.randn(2, p + size[0] * size[1], d, dtype=torch.float64)
    coords = rope_coords(size, indexing=indexing, dtype=torch.float64)
    rows, cols = torch.meshgrid(torch.arange(size[0]), torch.arange(size[1]), indexing="ij")
    first = cols.flatten() if indexing == "xy" else rows.flatten()
    assert torch.equal(coords[:, 0], first.double())  # xy: the first section rotates with the column index
    want = reference_rotation(x, axial_angles(coords, d, 100.0, 2), p, half=False)
    torch.testing.assert_close(apply_rope(x, sin, cos), want, atol=1e-12, rtol=0)
    # prefix tokens untouched, and a table without prefix rows gives the same
    assert torch.equal(apply_rope(x, sin, cos)[:, :p], x[:, :p])
    s0, c0 = rope(size)
    torch.testing.assert_close(apply_rope(x, s0, c0, num_prefix_tokens=p), want, atol=1e-12, rtol=0)


@pytest.mark.parametrize("size", [(2, 3, 5), (1, 4, 3)])
def test_rope_3d_vjepa_split_float64(size):
    d = 22  # 11 pairs: sections of (22 // 3) // 2 = 3 pairs on T, H, W, two pairs left unrotated
    rope = build_rope("rope-3d", d).double()
    assert (d // 3) // 2 == 3
    sin, cos = rope(size)
    n = math.prod(size)
    assert sin.shape == (n, d)
    coords = rope_coords(size, dtype=torch.float64)
    want_ang = axial_angles(coords, d, 10000.0, 3)
    assert torch.all(want_ang[..., 9:] == 0)
    x = torch.randn(3, n, d, dtype=torch.float64)
    torch.testing.assert_close(
        apply_rope(x, sin, cos), reference_rotation(x, want_ang, 0, False), atol=1e-12, rtol=0
    )
    assert torch.equal(apply_rope(x, sin, cos)[..., 18:], x[..., 18:])  # the remainder pairs are not rotated


def test_rope_1d():
    rope = RoPEAxial(8, ndim=1, temperature=10.0).double()
    sin, cos = rope((7,))
    x = torch.randn(1, 7, 8, dtype=torch.float64)
    ang = axial_angles(rope_coords((7,), dtype=torch.float64), 8, 10.0, 1)
    torch.testing.assert_close(
        apply_rope(x, sin, cos), reference_rotation(x, ang, 0, False), atol=1e-12, rtol=0
    )


@pytest.mark.parametrize("size", [(3, 5), (6, 4)])
def test_mixed_matches_rotation_matrices_float64(size):
    d, heads, depth, p = 16, 2, 3, 1
    rope = RoPEMixed(d, heads, depth).double()
    sin, cos = rope(size, num_prefix_tokens=p)
    n = size[0] * size[1]
    assert sin.shape == (depth, heads, p + n, d)
    coords = rope_coords(size, indexing="xy", dtype=torch.float64)
    x = torch.randn(heads, p + n, d, dtype=torch.float64)
    for layer in range(depth):
        f = rope.freqs[:, layer].detach()  # (2, heads, J)
        ang = coords[None, :, 0, None] * f[0][:, None] + coords[None, :, 1, None] * f[1][:, None]
        want = reference_rotation(x, ang, p, half=False)
        torch.testing.assert_close(apply_rope(x, sin[layer], cos[layer]), want, atol=1e-12, rtol=0)
    assert rope.no_weight_decay() == {"freqs"}


def test_mixed_init_is_naver():
    torch.manual_seed(0)
    rope = RoPEMixed(16, 4, 2, temperature=10.0)
    mag = torch.linalg.vector_norm(rope.freqs.detach(), dim=0)  # (depth, heads, J)
    want = 10.0 ** (-torch.arange(0, 16, 4) / 16)
    torch.testing.assert_close(mag, want.repeat(2).expand_as(mag), atol=1e-6, rtol=1e-6)
    # the second half of the pairs is orthogonal to the first
    f = rope.freqs.detach()
    dot = (f[:, :, :, :4] * f[:, :, :, 4:]).sum(0)
    torch.testing.assert_close(dot, torch.zeros_like(dot), atol=1e-6, rtol=0)


@pytest.mark.parametrize("size", [(4, 6), (5, 3)])
def test_dinov3_matches_rotation_matrices_float64(size):
    d, p = 16, 5
    rope = RoPEDinoV3(d, temperature=100.0).double()
    sin, cos = rope(size, num_prefix_tokens=p)
    h, w = size
    ys = (torch.arange(h, dtype=torch.float64) + 0.5) / h * 2 - 1
    xs = (torch.arange(w, dtype=torch.float64) + 0.5) / w * 2 - 1
    coords = torch.stack(torch.meshgrid(ys, xs, indexing="ij"), -1).reshape(-1, 2)
    torch.testing.assert_close(rope_coords(size, normalize="separate", dtype=torch.float64), coords)
    assert coords.min() > -1 and coords.max() < 1
    n4 = d // 4
    ang = torch.zeros(1, h * w, d // 2, dtype=torch.float64)
    for a in range(2):
        for i in range(n4):
            ang[0, :, a * n4 + i] = 2 * math.pi * coords[:, a] / 100.0 ** (i / n4)
    x = torch.randn(2, p + h * w, d, dtype=torch.float64)
    want = reference_rotation(x, ang, p, half=True)
    torch.testing.assert_close(apply_rope(x, sin, cos, half=True), want, atol=1e-12, rtol=0)


def test_dinov3_periods_and_augmentation_train_only():
    rope = RoPEDinoV3(16, temperature=None, min_period=0.5, max_period=8.0, shift_coords=0.5, jitter_coords=1.5,
                      rescale_coords=2.0)  # fmt: skip
    rope.eval()
    a = rope((4, 4))[0]
    torch.testing.assert_close(a, rope((4, 4))[0])  # eval: deterministic
    rope.train()
    torch.manual_seed(0)
    b = rope((4, 4))[0]
    assert not torch.allclose(a, b)
    with pytest.raises(ValueError, match="jitter_coords"):
        RoPEDinoV3(16, jitter_coords=0.5)
    with pytest.raises(ValueError, match="min_period and max_period"):
        RoPEDinoV3(16, min_period=1.0)


@pytest.mark.parametrize("kind", ["rope-axial", "rope-dinov3", "rope-mixed"])
def test_padding_does_not_move_real_tokens(kind):
    """Under a mask a token's rotation equals that of the same token in an unpadded image of the real size."""
    rope = build_rope(kind, 16, num_heads=2, depth=2)
    mask = torch.zeros(3, 5, 7, dtype=torch.bool)
    mask[1, 3:] = True  # image 1 is 3 x 7
    mask[2, :, 4:] = True  # image 2 is 5 x 4
    mask[2, 4:] = True  # ... and 4 x 4
    sin, cos = rope((5, 7), mask, num_prefix_tokens=1)
    real = {0: (5, 7), 1: (3, 7), 2: (4, 4)}
    for b, (h, w) in real.items():
        s_ref, c_ref = rope((h, w), num_prefix_tokens=1)
        s_b = sin[:, b] if rope.learned else sin[b, 0]
        c_b = cos[:, b] if rope.learned else cos[b, 0]
        keep = torch.cat([torch.tensor([True]), ~mask[b].flatten()])
        torch.testing.assert_close(s_b[..., keep, :], s_ref, atol=1e-6, rtol=0)
        torch.testing.assert_close(c_b[..., keep, :], c_ref, atol=1e-6, rtol=0)


def test_padding_top_left_counts_from_first_real_cell():
    mask = torch.zeros(1, 4, 4, dtype=torch.bool)
    mask[0, :1] = True
    mask[0, :, :2] = True
    coords = rope_coords((4, 4), mask)
    assert coords.shape == (1, 16, 2)
    assert coords[0, 1 * 4 + 2].tolist() == [0.0, 0.0]  # first real cell is the origin


def test_shapes_and_errors():
    x = torch.randn(2, 3, 1 + 12, 8)
    rope = RoPEAxial(8)
    sin, cos = rope((3, 4))
    assert apply_rope(x, sin, cos, num_prefix_tokens=1).shape == x.shape
    with pytest.raises(ValueError, match="rows"):
        apply_rope(x, sin, cos)
    with pytest.raises(ValueError, match="even width"):
        apply_rope(torch.randn(1, 13, 6), sin, cos, 1)
    with pytest.raises(ValueError, match="3 axes"):
        rope((2, 3, 4))
    with pytest.raises(ValueError, match="even head_dim"):
        RoPEAxial(7)
    with pytest.raises(ValueError, match="num_heads and depth"):
        build_rope("rope-mixed", 8)
    with pytest.raises(ValueError, match="unknown rotary"):
        build_rope("rope-foo", 8)
    with pytest.raises(ValueError, match="mask must be bool"):
        rope((3, 4), torch.zeros(2, 4, 3, dtype=torch.bool))


def test_rotation_preserves_norms_and_relative_positions():
    """RoPE's point: q.k after rotation depends on the offset between tokens only (axial)."""
    rope = RoPEAxial(16).double()
    sin, cos = rope((6, 6))
    q = torch.randn(16, dtype=torch.float64).expand(36, 16)
    k = torch.randn(16, dtype=torch.float64).expand(36, 16)
    qr, kr = apply_rope(q, sin, cos), apply_rope(k, sin, cos)
    torch.testing.assert_close(qr.norm(dim=-1), q.norm(dim=-1))
    idx = lambda r, c: r * 6 + c  # noqa: E731
    torch.testing.assert_close(qr[idx(1, 2)] @ kr[idx(3, 3)], qr[idx(2, 1)] @ kr[idx(4, 2)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["rope-axial", "rope-dinov3", "rope-mixed"])
def test_dtypes_against_float64(dtype, kind):
    torch.manual_seed(0)
    rope = build_rope(kind, 16, num_heads=2, depth=1)
    half = rope.half
    sin, cos = rope((5, 3), num_prefix_tokens=1)
    assert sin.dtype == torch.float32
    if rope.learned:
        sin, cos = sin[0], cos[0]
    x = torch.randn(2, 2, 16, 16)
    want = apply_rope(x.double(), sin.double(), cos.double(), half=half)
    got = apply_rope(x.to(dtype), sin, cos, half=half)
    assert got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol)
    rope.to(dtype)  # fixed frequencies stay float32 after .bfloat16()
    if not rope.learned:
        assert rope.inv_freq.dtype == torch.float32


@pytest.mark.parametrize("kind", ["rope-axial", "rope-mixed"])
def test_gradients_reach_inputs_and_frequencies(kind):
    rope = build_rope(kind, 8, num_heads=1, depth=1).double()
    x = torch.randn(1, 1, 1 + 6, 8, dtype=torch.float64, requires_grad=True)

    def f(x, *params):
        sin, cos = rope((2, 3), num_prefix_tokens=1)
        return apply_rope(x, sin[0] if rope.learned else sin, cos[0] if rope.learned else cos)

    assert torch.autograd.gradcheck(f, (x,))
    if rope.learned:
        f(x).pow(2).sum().backward()
        assert rope.freqs.grad is not None and rope.freqs.grad.abs().sum() > 0


class _RopeAttention(torch.nn.Module):
    def __init__(self, kind: str = "rope-mixed") -> None:
        super().__init__()
        self.rope = build_rope(kind, 16, num_heads=2, depth=1)
        self.attn = Attention(32, 2, rope_half=self.rope.half)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[1], x.shape[2]
        tokens = x.flatten(1, 2)
        tokens = torch.cat([tokens[:, :1] * 0, tokens], 1)  # a class-token slot
        sin, cos = self.rope((h, w), num_prefix_tokens=1)
        if self.rope.learned:
            sin, cos = sin[0], cos[0]
        return self.attn(tokens, (sin, cos))


@pytest.mark.parametrize("kind", ["rope-axial", "rope-mixed", "rope-dinov3"])
def test_compile_fullgraph_no_graph_breaks(kind):
    torch._dynamo.reset()
    m = _RopeAttention(kind).eval()
    x = torch.randn(2, 3, 4, 32)
    explain = torch._dynamo.explain(m)(x)
    assert explain.graph_break_count == 0, explain.break_reasons
    compiled = torch.compile(m, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x), m(x))


def test_export_runs_at_a_second_size():
    m = _RopeAttention("rope-mixed").eval()
    h, w = torch.export.Dim("h", min=2, max=32), torch.export.Dim("w", min=2, max=32)
    ep = torch.export.export(m, (torch.randn(2, 3, 4, 32),), dynamic_shapes={"x": {1: h, 2: w}})
    x2 = torch.randn(2, 5, 7, 32)
    torch.testing.assert_close(ep.module()(x2), m(x2), atol=1e-5, rtol=1e-5)


def test_attention_without_rope_is_unchanged():
    torch.manual_seed(0)
    attn = Attention(32, 2)
    assert set(attn.state_dict()) == {"qkv.weight", "qkv.bias", "proj.weight", "proj.bias"}
    x = torch.randn(2, 5, 32)
    q, k, v = attn.qkv(x).reshape(2, 5, 3, 2, 16).permute(2, 0, 3, 1, 4)
    ref = attn.proj(
        torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(2, 5, 32)
    )
    torch.testing.assert_close(attn(x), ref)
