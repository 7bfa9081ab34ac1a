"""Dynamic-kernel PEG (``dynamic=True``) and the padding modes of :class:`peg_core.PEGNd`.

The references are written per sample with plain ``F.conv2d`` / ``F.conv3d``
in float64: each sample is cropped to its real extent (so padding cannot leak
in), its mean token routes a softmax over the kernel bank, and the mixed
kernel runs as an ordinary depthwise conv.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from peg_core import PEG2d, PEG3d, PEGNd

CONV = {2: F.conv2d, 3: F.conv3d}


def extents_mask(extents: list[tuple[int, ...]], size: tuple[int, ...]) -> torch.Tensor:
    """``(B, *size)`` bool, True outside sample ``b``'s real block ``[:e1, :e2, ...]`` (padding at the end)."""
    mask = torch.ones(len(extents), *size, dtype=torch.bool)
    for b, ext in enumerate(extents):
        mask[(b, *(slice(0, e) for e in ext))] = False
    return mask


def reference(
    peg: PEGNd, x: torch.Tensor, size: tuple[int, ...], extents: list[tuple[int, ...]] | None = None
) -> torch.Tensor:
    """Per-sample loop: crop to the real block, route on its mean, conv with the mixed kernel, add."""
    p, n = peg.num_prefix_tokens, len(size)
    extents = extents or [size] * x.shape[0]
    out = x.clone()
    for b, ext in enumerate(extents):
        grid = x[b, p:].T.reshape(-1, *size)  # (C, *size)
        real = grid[(slice(None), *(slice(0, e) for e in ext))]  # (C, *ext)
        mix = torch.softmax(peg.route(real.flatten(1).mean(1)), -1)  # (K,)
        weight = torch.einsum("k,k...->...", mix, peg.weight)  # (C, 1, *k)
        bias = None if peg.bias is None else mix @ peg.bias
        pads = [k // 2 for k in peg.kernel_tuple]
        if peg.padding_mode == "zeros":
            y = CONV[n](real[None], weight, bias, padding=pads, groups=real.shape[0])[0]
        else:
            padded = F.pad(real[None], [q for s in reversed(pads) for q in (s, s)], mode=peg.padding_mode)
            y = CONV[n](padded, weight, bias, groups=real.shape[0])[0]
        full = torch.zeros_like(grid)
        full[(slice(None), *(slice(0, e) for e in ext))] = y
        out[b, p:] += full.flatten(1).T
    return out


@pytest.mark.parametrize("prefix", [0, 1])
@pytest.mark.parametrize("kernel", [3, 5])
def test_2d_matches_per_sample_reference(prefix: int, kernel: int) -> None:
    torch.manual_seed(0)
    size = (5, 7)
    peg = PEG2d(6, kernel, num_prefix_tokens=prefix, dynamic=True, num_kernels=3).double()
    x = torch.randn(3, prefix + 35, 6, dtype=torch.float64)
    extents = [(5, 7), (3, 6), (4, 2)]
    mask = extents_mask(extents, size)
    with torch.no_grad():
        torch.testing.assert_close(peg(x, size), reference(peg, x, size), rtol=1e-12, atol=1e-12)
        got = peg(x, size, mask)
        torch.testing.assert_close(got, reference(peg, x, size, extents), rtol=1e-12, atol=1e-12)
        # padding stays as it was; position() is forward minus x
        assert torch.equal(got[:, prefix:][mask.flatten(1)], x[:, prefix:][mask.flatten(1)])
        torch.testing.assert_close(peg.position(x, size, mask), got - x, rtol=0, atol=1e-12)
    # samples really get different kernels
    w, _ = peg.kernels(x[:, prefix:].transpose(1, 2).reshape(3, 6, *size))
    assert not torch.allclose(w[0], w[1])


def test_3d_matches_per_sample_reference() -> None:
    torch.manual_seed(1)
    size = (3, 4, 5)
    peg = PEG3d(4, (3, 5, 3), num_prefix_tokens=1, dynamic=True, num_kernels=2).double()
    x = torch.randn(2, 1 + 60, 4, dtype=torch.float64)
    extents = [(3, 4, 5), (2, 3, 4)]
    with torch.no_grad():
        got = peg(x, size, extents_mask(extents, size))
        torch.testing.assert_close(got, reference(peg, x, size, extents), rtol=1e-12, atol=1e-12)
        # a feature map (B, C, T, H, W) gives the same as its tokens
        grid = x[:, 1:].transpose(1, 2).reshape(2, 4, *size)
        expect = reference(peg, x, size)[:, 1:].transpose(1, 2).reshape(2, 4, *size)
        # the same weights on a feature map (no prefix token: state dicts load across P)
        map_peg = PEG3d(4, (3, 5, 3), dynamic=True, num_kernels=2).double()
        map_peg.load_state_dict(peg.state_dict())
        torch.testing.assert_close(map_peg(grid), expect, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("padding_mode", ["zeros", "circular"])
def test_constant_router_equals_static_peg(padding_mode: str) -> None:
    """Router weights zeroed: every sample gets the fixed mixture softmax(route.bias) of the bank."""
    torch.manual_seed(2)
    dyn = PEG2d(5, num_prefix_tokens=1, dynamic=True, num_kernels=4, padding_mode=padding_mode).double()
    static = PEG2d(5, num_prefix_tokens=1, padding_mode=padding_mode).double()
    with torch.no_grad():
        dyn.route.weight.zero_()
        dyn.route.bias.copy_(torch.tensor([0.5, -1.0, 2.0, 0.0]))
        mix = torch.softmax(dyn.route.bias, 0)
        static.proj.weight.copy_(torch.einsum("k,k...->...", mix, dyn.weight))
        static.proj.bias.copy_(mix @ dyn.bias)
        x = torch.randn(3, 1 + 4 * 6, 5, dtype=torch.float64)
        torch.testing.assert_close(dyn(x, (4, 6)), static(x, (4, 6)), rtol=1e-12, atol=1e-12)
        # one-hot (up to exp(-60)): exactly bank entry 2
        dyn.route.bias.copy_(torch.tensor([-30.0, -30.0, 30.0, -30.0]))
        static.proj.weight.copy_(dyn.weight[2])
        static.proj.bias.copy_(dyn.bias[2])
        torch.testing.assert_close(dyn(x, (4, 6)), static(x, (4, 6)), rtol=1e-12, atol=1e-12)


def test_zero_init_is_identity_and_state_dict_keys() -> None:
    peg = PEG3d(8, num_prefix_tokens=1, dynamic=True, num_kernels=3, zero_init=True)
    x = torch.randn(2, 1 + 2 * 3 * 4, 8)
    assert torch.equal(peg(x, (2, 3, 4)), x)
    shapes = {k: tuple(v.shape) for k, v in peg.state_dict().items()}
    assert shapes == {
        "weight": (3, 8, 1, 3, 3, 3),
        "bias": (3, 8),
        "route.weight": (3, 8),
        "route.bias": (3,),
    }
    assert "bias" not in PEG2d(8, dynamic=True, bias=False).state_dict()


def test_gradients_reach_the_router_and_bank() -> None:
    torch.manual_seed(3)
    peg = PEG2d(6, num_prefix_tokens=1, dynamic=True)
    x = torch.randn(2, 1 + 3 * 5, 6, requires_grad=True)
    mask = extents_mask([(3, 5), (2, 4)], (3, 5))
    (peg(x, (3, 5), mask) ** 2).sum().backward()
    for name, param in peg.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name
    # padded tokens only pass through: their gradient is exactly the residual's 2 * x
    pad = torch.cat([torch.zeros(2, 1, dtype=torch.bool), mask.flatten(1)], 1)
    torch.testing.assert_close(x.grad[pad], 2 * x.detach()[pad])


def test_padding_invariance() -> None:
    """A sample's real positions get the same output alone as inside a padded batch."""
    torch.manual_seed(4)
    peg = PEG2d(8, num_prefix_tokens=1, dynamic=True, num_kernels=4)
    size, small = (6, 9), (4, 5)
    alone = torch.randn(1, 1 + 20, 8)
    batch = torch.randn(2, 1 + 54, 8) * 10  # junk at the padding must not matter
    grid = batch[1, 1:].reshape(*size, 8)
    grid[: small[0], : small[1]] = alone[0, 1:].reshape(*small, 8)
    batch[1, 0] = alone[0, 0]
    mask = extents_mask([size, small], size)
    with torch.no_grad():
        want = peg(alone, small)
        got = peg(batch, size, mask)[1]
    torch.testing.assert_close(got[0], want[0, 0])
    torch.testing.assert_close(
        got[1:].reshape(*size, 8)[: small[0], : small[1]],
        want[0, 1:].reshape(*small, 8),
        rtol=1e-5,
        atol=1e-6,
    )


def test_dtypes() -> None:
    torch.manual_seed(5)
    peg = PEG2d(16, num_prefix_tokens=1, dynamic=True).double()
    x = torch.randn(2, 1 + 5 * 3, 16, dtype=torch.float64)
    with torch.no_grad():
        want = reference(peg, x, (5, 3))
        out32 = peg.float()(x.float(), (5, 3))
        assert out32.dtype == torch.float32
        torch.testing.assert_close(out32, want.float(), rtol=1e-5, atol=1e-5)
        out16 = peg.bfloat16()(x.bfloat16(), (5, 3))
        assert out16.dtype == torch.bfloat16
        torch.testing.assert_close(out16.float(), want.float(), rtol=0.05, atol=0.1)


# -------------------------------------------------------------------------------------- padding modes


@pytest.mark.parametrize(("dynamic", "factorized"), [(False, False), (False, True), (True, False)])
def test_circular_padding_is_shift_equivariant(dynamic: bool, factorized: bool) -> None:
    torch.manual_seed(6)
    size, shift = (5, 7), (2, -3)
    circ = PEG2d(4, 3, separable=factorized, dynamic=dynamic, padding_mode="circular").double()
    zeros = PEG2d(4, 3, separable=factorized, dynamic=dynamic).double()
    zeros.load_state_dict(circ.state_dict())
    x = torch.randn(2, 35, 4, dtype=torch.float64)

    def roll(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(2, *size, 4).roll(shift, dims=(1, 2)).reshape(2, 35, 4)

    with torch.no_grad():
        torch.testing.assert_close(circ(roll(x), size), roll(circ(x, size)), rtol=1e-12, atol=1e-12)
        # zero padding tells the border: the shifted input gives a different (not shifted) output
        assert not torch.allclose(zeros(roll(x), size), roll(zeros(x, size)))
        # interior tokens (away from any border, in both) agree between the modes
        inner = (slice(None), slice(1, -1), slice(1, -1))
        a, b = circ(x, size).reshape(2, *size, 4), zeros(x, size).reshape(2, *size, 4)
        torch.testing.assert_close(a[inner], b[inner], rtol=1e-12, atol=1e-12)
        assert not torch.allclose(a[:, 0], b[:, 0])


def test_replicate_padding_matches_f_pad_reference() -> None:
    torch.manual_seed(7)
    peg = PEG3d(3, (3, 3, 5), padding_mode="replicate").double()
    x = torch.randn(2, 3, 2, 4, 6, dtype=torch.float64)
    padded = F.pad(x, (2, 2, 1, 1, 1, 1), mode="replicate")
    want = x + F.conv3d(padded, peg.proj.weight, peg.proj.bias, groups=3)
    with torch.no_grad():
        torch.testing.assert_close(peg(x), want, rtol=1e-12, atol=1e-12)
    assert "padding_mode='replicate'" in repr(peg)


def test_refusals() -> None:
    with pytest.raises(ValueError, match="factorized"):
        PEG3d(8, factorized=True, dynamic=True)
    with pytest.raises(ValueError, match="padding_mode"):
        PEG2d(8, padding_mode="reflect-ish")
    with pytest.raises(ValueError, match="num_kernels"):
        PEG2d(8, dynamic=True, num_kernels=0)
    peg = PEG2d(8, padding_mode="circular")
    mask = torch.zeros(1, 2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="padding masks need padding_mode='zeros'"):
        peg(torch.randn(1, 6, 8), (2, 3), mask)


def test_dynamic_generator_cost_is_small() -> None:
    """Parameters: K kernels + K biases + the router (C*K + K); CPVT-Ti width, K = 4."""
    peg = PEG2d(192, dynamic=True, num_kernels=4)
    n = sum(p.numel() for p in peg.parameters())
    assert n == 4 * (192 * 9 + 192) + 192 * 4 + 4 == 4 * 1920 + 772
    assert math.isclose(n / 1920, 4.4, rel_tol=0.01)
