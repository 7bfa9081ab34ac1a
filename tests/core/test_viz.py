"""Similarity maps of position codes: values on hand cases, PEG codes on a constant input, PNG output."""

from __future__ import annotations

import math

import pytest
import torch

from peg_core import PEG2d
from peg_core.viz import (
    cosine_similarity_map,
    peg_position_codes,
    plot_peg_similarity,
    plot_table_similarity,
    similarity_mosaic,
)


def test_cosine_similarity_hand_case():
    # prefix row, then a 2x2 grid a b / c d (row-major)
    table = torch.tensor([[[9.0, 9.0], [1, 0], [0, 1], [1, 1], [-2, 0]]])
    sim = cosine_similarity_map(table, (2, 2), num_prefix_tokens=1)
    r = 1 / math.sqrt(2)
    expected = torch.tensor(
        [  # rows: a, b, c, d; columns: a, b, c, d
            [1, 0, r, -1],
            [0, 1, r, 0],
            [r, r, 1, -r],
            [-1, 0, -r, 1],
        ]
    )
    assert sim.shape == (2, 2, 2, 2)
    torch.testing.assert_close(sim.reshape(4, 4), expected, rtol=0, atol=1e-6)
    # a zero code is similar to nothing (0), not NaN
    sim0 = cosine_similarity_map(torch.tensor([[0.0, 0.0], [1.0, 2.0]]), (1, 2))
    torch.testing.assert_close(sim0.reshape(2, 2), torch.tensor([[0.0, 0.0], [0.0, 1.0]]))
    with pytest.raises(ValueError, match=r"do not hold 0 prefix rows \+ 2x2 grid"):
        cosine_similarity_map(torch.zeros(5, 2), (2, 2))


def test_peg_codes_on_constant_input():
    peg = PEG2d(2, kernel_size=3, num_prefix_tokens=1)
    with torch.no_grad():
        peg.proj.weight.zero_()
        peg.proj.weight[0, 0, 0, 0] = 1.0  # channel 0 copies the up-left neighbour
        peg.proj.weight[1, 0, 1, 1] = 2.0  # channel 1 doubles the token itself
        peg.proj.bias.zero_()
    codes = peg_position_codes(peg, (3, 4), value=1.0)  # (H*W, C)
    assert codes.shape == (12, 2)
    ch0 = torch.tensor([[0, 0, 0, 0], [0, 1, 1, 1], [0, 1, 1, 1.0]])  # zero padding above / left
    torch.testing.assert_close(codes[:, 0].reshape(3, 4), ch0)
    torch.testing.assert_close(codes[:, 1], torch.full((12,), 2.0))
    sim = cosine_similarity_map(codes, (3, 4))
    r = 2 / math.sqrt(5)  # cos((0, 2), (1, 2)): border code vs interior code
    assert sim[0, 0, 0, 3].item() == pytest.approx(1.0)  # two border positions
    assert sim[0, 0, 1, 1].item() == pytest.approx(r)  # border vs interior
    assert sim[2, 3, 1, 1].item() == pytest.approx(1.0)  # two interior positions


def test_mosaic_layout():
    sim = torch.arange(2 * 3 * 2 * 3, dtype=torch.float32).reshape(2, 3, 2, 3)
    m = similarity_mosaic(sim)
    assert m.shape == (2 * 3 - 1, 3 * 4 - 1)
    torch.testing.assert_close(m[3:5, 8:11], sim[1, 2])
    assert torch.isnan(m[2]).all() and torch.isnan(m[:, 3]).all()


def _png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_writes_pngs(tmp_path):
    table = torch.randn(1, 1 + 14 * 14, 16)
    w, h = _png_size(plot_table_similarity(table, (14, 14), tmp_path / "table.png", num_prefix_tokens=1))
    assert 400 <= w <= 1500 and 400 <= h <= 1500
    peg = PEG2d(16, num_prefix_tokens=1)
    w, h = _png_size(plot_peg_similarity(peg, (4, 6), tmp_path / "sub" / "peg.png"))
    assert 150 <= w <= 800 and 150 <= h <= 800 and w > h
