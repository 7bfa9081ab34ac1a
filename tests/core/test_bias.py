"""Attention biases (peg_core.bias): float64 references from the papers' formulas, shapes, prefix, masks, grads, bf16."""

from __future__ import annotations

import math

import pytest
import torch

from peg_core.bias import (
    LOOKHERE_MASKED,
    ALiBiBias,
    AttentionBias,
    FIREBias,
    LookHereBias,
    alibi_slopes,
    with_key_padding,
)
from peg_core.registry import EncodingContext, get_encoding


def _positions(size: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Integer grid positions, row-major (the token order of every model)."""
    if len(size) == 1:
        return [(i,) for i in range(size[0])]
    return [(i, *rest) for i in range(size[0]) for rest in _positions(size[1:])]


def _alibi_reference(size, slopes, metric="euclidean"):
    """ALiBi on a grid, element by element: ``-m_h * dist(p_i, p_j)``."""
    pos = _positions(size)
    out = torch.zeros(len(slopes), len(pos), len(pos), dtype=torch.float64)
    for h, m in enumerate(slopes):
        for i, a in enumerate(pos):
            for j, b in enumerate(pos):
                if metric == "euclidean":
                    d = math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)))
                else:
                    d = sum(abs(x - y) for x, y in zip(a, b))
                out[h, i, j] = -m * d
    return out


def test_alibi_slopes_follow_the_paper():
    # power of two: 2^(-8 i / H), i = 1..H
    assert alibi_slopes(8) == [2.0**-i for i in range(1, 9)]
    assert alibi_slopes(4) == [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8]
    # otherwise: the 4 slopes of 4 heads, then every other slope of 8 heads (ALiBi's get_slopes)
    assert alibi_slopes(6) == [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3]
    assert alibi_slopes(3) == [2.0**-4, 2.0**-8, 2.0**-2]
    assert alibi_slopes(1) == [2.0**-8]


@pytest.mark.parametrize("metric", ["euclidean", "manhattan"])
@pytest.mark.parametrize(("size", "heads"), [((3, 5), 4), ((5, 2), 3), ((1, 7), 6), ((3, 2, 3), 2)])
def test_alibi_matches_the_reference(size, heads, metric):
    bias = ALiBiBias(heads, len(size), metric=metric)
    got = bias(size, dtype=torch.float64)
    want = _alibi_reference(size, alibi_slopes(heads), metric)
    assert got.shape == (1, heads, math.prod(size), math.prod(size)) and got.dtype == torch.float64
    torch.testing.assert_close(got[0], want, atol=1e-12, rtol=0)
    assert not list(bias.state_dict())  # ALiBi has no state-dict key


def _fire_reference(module: FIREBias, size):
    """FIRE element by element: ``f(psi(r_ij) / psi(max(L, q_i)))``, ``psi(x) = log(|c x| + 1)``, float64."""
    c = module.c.item()
    threshold = abs(module.threshold_scale.item() * module.init_threshold.item())
    w1, b1 = module.mlp[0].weight.double(), module.mlp[0].bias.double()
    w2, b2 = module.mlp[2].weight.double(), module.mlp[2].bias.double()
    pos = _positions(size)

    def psi(x: float) -> float:
        return math.log(abs(c * x) + 1.0)

    out = torch.zeros(module.num_heads, len(pos), len(pos), dtype=torch.float64)
    for i, a in enumerate(pos):
        q = math.sqrt(sum(x * x for x in a))  # the query's distance to the grid origin
        for j, b in enumerate(pos):
            r = math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)))
            u = psi(r) / (psi(max(threshold, q)) + module.eps)
            hidden = torch.relu(w1[:, 0] * u + b1)
            out[:, i, j] = w2 @ hidden + b2
    return out


@pytest.mark.parametrize(("size", "heads"), [((3, 5), 4), ((4, 1), 2), ((2, 3, 2), 3)])
def test_fire_matches_the_reference(size, heads):
    torch.manual_seed(0)
    fire = FIREBias(heads, len(size), hidden=8, init_c=0.7, init_threshold=2.0)
    with torch.no_grad():
        fire.threshold_scale.fill_(-1.1)  # |s * L0| (FIRE takes the absolute value)
    got = fire(size, dtype=torch.float64)
    assert got.shape == (1, heads, math.prod(size), math.prod(size))
    torch.testing.assert_close(got[0], _fire_reference(fire, size), atol=1e-12, rtol=0)
    assert {"c", "threshold_scale", "init_threshold", "mlp.0.weight", "mlp.2.bias"} <= set(fire.state_dict())


@torch.no_grad()
def _fire_per_axis_reference(module: FIREBias, size):
    """Per-axis FIRE element by element: ``sum_a f_a(psi(|x_ia - x_ja|) / psi(max(L, x_ia)))``, float64."""
    c = module.c.item()
    threshold = abs(module.threshold_scale.item() * module.init_threshold.item())
    pos = _positions(size)

    def psi(x: float) -> float:
        return math.log(abs(c * x) + 1.0)

    out = torch.zeros(module.num_heads, len(pos), len(pos), dtype=torch.float64)
    for a, mlp in enumerate(module.axis_mlps):
        w1, b1 = mlp[0].weight.double()[:, 0], mlp[0].bias.double()
        w2, b2 = mlp[2].weight.double(), mlp[2].bias.double()
        for i, p in enumerate(pos):
            for j, q in enumerate(pos):
                u = psi(abs(p[a] - q[a])) / (psi(max(threshold, p[a])) + module.eps)
                out[:, i, j] += w2 @ torch.relu(w1 * u + b1) + b2
    return out


@pytest.mark.parametrize(("size", "heads"), [((3, 5), 4), ((2, 3, 2), 3)])
def test_fire_per_axis_matches_the_reference(size, heads):
    torch.manual_seed(0)
    fire = FIREBias(heads, len(size), hidden=8, init_c=0.7, init_threshold=2.0, per_axis=True)
    got = fire(size, num_prefix_tokens=1, dtype=torch.float64)
    torch.testing.assert_close(got[0, :, 1:, 1:], _fire_per_axis_reference(fire, size), atol=1e-12, rtol=0)
    assert (got[0, :, 0] == 0).all() and (got[0, :, :, 0] == 0).all()
    keys = set(fire.state_dict())
    assert {f"axis_mlps.{a}.0.weight" for a in range(len(size))} <= keys and not any(
        k.startswith("mlp.") for k in keys
    )
    if len(size) != 2:
        return
    # rows and columns apart: a row offset and a column offset of the same length differ in general
    flat = fire((3, 3))[0]
    assert not torch.allclose(flat[:, 4, 1], flat[:, 4, 3])  # key above vs key to the left of the centre
    fire((4, 6)).sum().backward()  # every axis's MLP and c get gradients
    assert all(p.grad is not None for p in fire.parameters())
    built = get_encoding("fire").build(EncodingContext(8, (4, 4), num_heads=2, options={"per_axis": True}))
    assert built.per_axis and len(built.axis_mlps) == 2


def _lookhere_reference(size, heads, fov, global_slope):
    """LookHere element by element: head h looks in direction h mod 4 with slope 2^-(h // 4 + 1)."""
    pos = _positions(size)
    out = torch.zeros(heads, len(pos), len(pos), dtype=torch.float64)
    for h in range(heads):
        d = h % 4
        for i, (qr, qc) in enumerate(pos):
            for j, (kr, kc) in enumerate(pos):
                up, down, left, right = kr <= qr, kr >= qr, kc <= qc, kc >= qc
                seen = (up, down, left, right)[d] if fov == 180 else (
                    (up and left), (up and right), (down and left), (down and right))[d]  # fmt: skip
                slope = global_slope * 2.0 ** -(h // 4 + 1)
                out[h, i, j] = -slope * math.hypot(qr - kr, qc - kc) if seen else LOOKHERE_MASKED
    return out


@pytest.mark.parametrize("fov", [180, 90])
@pytest.mark.parametrize(("size", "heads"), [((3, 5), 8), ((4, 2), 3)])
def test_lookhere_matches_the_reference(size, heads, fov):
    bias = LookHereBias(heads, fov=fov, global_slope=1.5)
    got = bias(size, dtype=torch.float64)
    torch.testing.assert_close(got[0], _lookhere_reference(size, heads, fov, 1.5), atol=1e-12, rtol=0)
    assert not list(bias.state_dict())
    # every query sees itself (no row is all masked), and each direction masks something
    assert (got[0].diagonal(dim1=-2, dim2=-1) == 0).all()
    assert ((got[0] == LOOKHERE_MASKED).flatten(1).any(1)).all()
    with pytest.raises(ValueError, match="2-D"):
        LookHereBias(4, 3)
    with pytest.raises(ValueError, match="fov"):
        LookHereBias(4, fov=45)


def test_lookhere_layer_schedule_matches_the_reference():
    """LookHere's per-layer schedule: block l scales the penalties by linspace(a, b, depth)[l], masks stay."""
    size, heads, depth = (3, 4), 8, 4
    bias = LookHereBias(heads, fov=90, global_slope=0.5, layer_slopes=(1.5, 0.25), depth=depth)
    base = bias(size, num_prefix_tokens=1, dtype=torch.float64)
    ref = _lookhere_reference(size, heads, 90, 0.5)
    for layer, scale in enumerate([1.5, 1.5 - 1.25 / 3, 1.5 - 2.5 / 3, 0.25]):
        got = bias.layer_bias(base, layer)[0]
        want = torch.where(ref == LOOKHERE_MASKED, ref, scale * ref)
        torch.testing.assert_close(got[:, 1:, 1:], want, atol=1e-12, rtol=0)
        assert (got[:, 0] == 0).all() and (got[:, :, 0] == 0).all()  # the class token stays unbiased
    # -inf key padding and bf16's masked value survive the scaling
    padded = with_key_padding(base, torch.tensor([[False] * 12 + [True]]))
    assert bias.layer_bias(padded, 3)[..., -1].isinf().all()
    low = bias.layer_bias(bias(size, dtype=torch.bfloat16), 0)
    assert low.dtype == torch.bfloat16 and (low == LOOKHERE_MASKED).sum() == (ref == LOOKHERE_MASKED).sum()
    # the default schedule hands every block the forward's tensor itself; the registry passes the depth
    flat = LookHereBias(heads, depth=3)
    t = flat(size)
    assert all(flat.layer_bias(t, i) is t for i in range(3))
    built = get_encoding("lookhere").build(EncodingContext(8, (4, 4), num_heads=4, depth=6,
                                                           options={"layer_slopes": (2.0, 1.0)}))  # fmt: skip
    assert built.depth == 6 and built._layer_scale[-1] == 1.0 and built._layer_scale[0] == 2.0
    with pytest.raises(IndexError, match="layer 4 of a 4-block"):
        bias.layer_bias(base, 4)
    with pytest.raises(ValueError, match="layer_slopes"):
        LookHereBias(4, layer_slopes=(1.0, -1.0))


@pytest.mark.parametrize("name", ["alibi-2d", "fire", "lookhere"])
def test_prefix_tokens_are_unbiased_and_sizes_are_free(name):
    torch.manual_seed(0)
    bias = get_encoding(name).build(EncodingContext(8, (4, 4), num_heads=3))
    assert isinstance(bias, AttentionBias) and bias.ndim == 2
    for size in ((4, 4), (3, 7), (9, 2), (1, 1)):  # any size and aspect, odd sides
        plain = bias(size)
        with_prefix = bias(size, num_prefix_tokens=2)
        n = math.prod(size)
        assert with_prefix.shape == (1, 3, n + 2, n + 2)
        assert not with_prefix[:, :, :2].any() and not with_prefix[:, :, :, :2].any()
        torch.testing.assert_close(with_prefix[:, :, 2:, 2:], plain, atol=0, rtol=0)
    if name == "lookhere":  # 2-D only
        return
    video = get_encoding(name).build(EncodingContext(8, (2, 4, 4), num_heads=2))
    assert video.ndim == 3 and video((3, 2, 5), num_prefix_tokens=1).shape == (1, 2, 31, 31)
    with pytest.raises(ValueError, match="has 2 axes; this attention bias is 3-D"):
        video((4, 4))


@pytest.mark.parametrize("name", ["alibi-2d", "fire", "lookhere"])
def test_padding_mask_changes_nothing(name):
    torch.manual_seed(0)
    bias = get_encoding(name).build(EncodingContext(8, (4, 4), num_heads=2))
    mask = torch.zeros(2, 4, 6, dtype=torch.bool)
    mask[1, 3:], mask[1, :, 4:] = True, True  # bottom / right padding
    torch.testing.assert_close(bias((4, 6), mask), bias((4, 6)), atol=0, rtol=0)
    # the real 3x4 region of the padded grid: the same bias as the 3x4 grid alone
    real = torch.arange(24).reshape(4, 6)[:3, :4].flatten()
    torch.testing.assert_close(bias((4, 6))[:, :, real][..., real], bias((3, 4)), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="mask must be bool"):
        bias((4, 6), mask[:, :3])
    folded = with_key_padding(bias((4, 6)), mask.flatten(1))
    assert folded.shape == (2, 2, 24, 24) and torch.isinf(folded[1, :, :, mask[1].flatten()]).all()
    assert torch.equal(folded[0], bias((4, 6))[0])


def test_fire_gradients_reach_every_parameter():
    torch.manual_seed(0)
    fire = FIREBias(2, 2, init_threshold=2.5)  # queries on both sides of L: both branches of max
    out = fire((5, 7), num_prefix_tokens=1)
    (out * torch.randn_like(out)).sum().backward()
    for name, p in fire.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
    assert fire.init_threshold.grad is None  # L0 is fixed; its scale learns


@pytest.mark.parametrize("name", ["alibi-2d", "fire", "lookhere"])
def test_bf16_result_and_bf16_module(name):
    torch.manual_seed(0)
    bias = get_encoding(name).build(EncodingContext(8, (4, 4), num_heads=4))
    ref = bias((5, 3))
    half = bias((5, 3), dtype=torch.bfloat16)
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half.float(), ref, atol=0.05, rtol=0.02)
    bias.to(torch.bfloat16)  # a model cast to bf16 wholesale: computed in float32 still, returned in bf16
    torch.testing.assert_close(bias((5, 3), dtype=torch.bfloat16).float(), ref, atol=0.05, rtol=0.02)


def test_bad_arguments():
    with pytest.raises(ValueError, match="metric"):
        ALiBiBias(2, metric="chebyshev")
    with pytest.raises(ValueError, match="num_heads"):
        alibi_slopes(0)
    with pytest.raises(ValueError, match="init_threshold"):
        FIREBias(2, init_threshold=0.0)
    # the registry's FIRE threshold: half the training grid's diagonal
    fire = get_encoding("fire").build(EncodingContext(8, (9, 13), num_heads=2))
    assert fire.init_threshold.item() == pytest.approx(0.5 * math.hypot(8, 12))
