"""The property the suite builds on: attention alone is permutation-equivariant; position codes break it."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from peg_core import PEG2d, build_position_encoding

DIM, SIZE = 32, (4, 5)


def encoder(layers: int = 2) -> nn.TransformerEncoder:
    layer = nn.TransformerEncoderLayer(DIM, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).eval()


def permutation_gap(f, x: Tensor, perm: Tensor) -> float:
    """max |f(x[:, perm]) - f(x)[:, perm]|: zero for a permutation-equivariant ``f``."""
    with torch.no_grad():
        return (f(x[:, perm]) - f(x)[:, perm]).abs().max().item()


@pytest.fixture
def inputs() -> tuple[Tensor, Tensor]:
    n = SIZE[0] * SIZE[1]
    perm = torch.randperm(n)
    assert not torch.equal(perm, torch.arange(n))
    return torch.randn(2, n, DIM), perm


def test_no_position_encoding_is_equivariant(inputs):
    x, perm = inputs
    enc = encoder()
    assert permutation_gap(enc, x, perm) < 1e-5
    none = build_position_encoding("none", DIM)
    assert permutation_gap(lambda t: enc(none(t, SIZE)), x, perm) < 1e-5


def test_peg_at_input_breaks_equivariance(inputs):
    x, perm = inputs
    enc, peg = encoder(), PEG2d(DIM).eval()
    assert permutation_gap(lambda t: enc(peg(t, SIZE)), x, perm) > 1e-2


def test_peg_after_block_0_breaks_equivariance(inputs):
    """CPVT's placement: block 0, then the PEG, then the remaining blocks."""
    x, perm = inputs
    enc, peg = encoder(3), PEG2d(DIM).eval()

    def cpvt(t: Tensor) -> Tensor:
        t = peg(enc.layers[0](t), SIZE)
        for layer in enc.layers[1:]:
            t = layer(t)
        return t

    assert permutation_gap(cpvt, x, perm) > 1e-2
    # and block 0 alone stays equivariant, so the PEG is what breaks it
    assert permutation_gap(enc.layers[0], x, perm) < 1e-5


@pytest.mark.parametrize("kind", ["learned", "sincos"])
def test_position_table_breaks_equivariance(inputs, kind):
    x, perm = inputs
    enc = encoder()
    pos = build_position_encoding(kind, DIM, **({"grid_size": SIZE} if kind == "learned" else {}))
    assert permutation_gap(lambda t: enc(pos(t, SIZE)), x, perm) > 1e-2
