"""The transformer against a float64 reference written from DETR's equations."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from peg_core import PEG2d, SinePositionEncoding2d
from peg_detr.models import Transformer


def ref_attention(q, k, v, mha, kpm=None):
    """Multi-head attention from its definition (explicit softmax), all float64."""
    c = q.shape[-1]
    h = mha.num_heads
    wq, wk, wv = mha.in_proj_weight.split(c)
    bq, bk, bv = mha.in_proj_bias.split(c)

    def heads(x):
        return x.reshape(x.shape[0], x.shape[1], h, c // h).transpose(1, 2)

    qh, kh, vh = heads(q @ wq.T + bq), heads(k @ wk.T + bk), heads(v @ wv.T + bv)
    scores = qh @ kh.transpose(-1, -2) / math.sqrt(c // h)
    if kpm is not None:
        scores = scores.masked_fill(kpm[:, None, None, :], float("-inf"))
    out = (scores.softmax(-1) @ vh).transpose(1, 2).reshape(q.shape)
    return out @ mha.out_proj.weight.T + mha.out_proj.bias


def ln(x, norm):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias


def ffn(x, layer):
    return (
        torch.relu(x @ layer.linear1.weight.T + layer.linear1.bias) @ layer.linear2.weight.T
        + layer.linear2.bias
    )


def reference(t: Transformer, src, mask, query, key_mode):
    """DETR post-norm transformer with a PEG after encoder layer 0, from the equations."""
    b, c, h, w = src.shape
    x = src.flatten(2).transpose(1, 2)
    kpm = mask.flatten(1)
    keep = (~mask)[:, None].double()
    peg_out = None
    for i, layer in enumerate(t.encoder.layers):
        x = ln(x + ref_attention(x, x, x, layer.self_attn, kpm), layer.norm1)  # no q/k codes with PEG
        x = ln(x + ffn(x, layer), layer.norm2)
        if i == 0:
            conv = t.encoder.pegs["0"].proj
            grid = x.transpose(1, 2).reshape(b, c, h, w) * keep
            delta = F.conv2d(grid, conv.weight, conv.bias, padding=1, groups=c) * keep
            peg_out = delta.flatten(2).transpose(1, 2)
            x = x + peg_out
    memory = x
    if key_mode == "sine":
        key_pos = SinePositionEncoding2d(c).grid(mask, torch.float64).flatten(1, 2)
    else:
        key_pos = peg_out
    qpos = query.expand(b, -1, -1)
    tgt = torch.zeros_like(qpos)
    outs = []
    for layer in t.decoder.layers:
        tgt = ln(tgt + ref_attention(tgt + qpos, tgt + qpos, tgt, layer.self_attn), layer.norm1)
        tgt = ln(
            tgt + ref_attention(tgt + qpos, memory + key_pos, memory, layer.multihead_attn, kpm), layer.norm2
        )
        tgt = ln(tgt + ffn(tgt, layer), layer.norm3)
        outs.append(ln(tgt, t.decoder.norm))
    return torch.stack(outs)


def test_transformer_matches_float64_reference():
    for key_mode in ("sine", "peg-output"):
        t = (
            Transformer(
                d_model=16,
                nhead=2,
                num_encoder_layers=2,
                num_decoder_layers=2,
                dim_feedforward=24,
                dropout=0.0,
                pegs={0: PEG2d(16)},
                decoder_key_pos=key_mode,
            )
            .double()
            .eval()
        )
        torch.nn.init.normal_(t.encoder.pegs["0"].proj.weight, std=0.5)
        src = torch.randn(2, 16, 3, 5, dtype=torch.float64)  # non-square grid
        mask = torch.zeros(2, 3, 5, dtype=torch.bool)
        mask[1, 2:, :] = True
        mask[1, :, 4:] = True
        query = torch.randn(4, 16, dtype=torch.float64)
        with torch.no_grad():
            got = t(src, mask, query)
            want = reference(t, src, mask, query, key_mode)
        assert got.shape == (2, 2, 4, 16)
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


def test_sine_encoder_adds_codes_to_q_and_k_only():
    """With pos_enc sine, layer 0 uses q = k = x + pos, v = x (DETR), checked against the reference."""
    pos = SinePositionEncoding2d(16)
    t = (
        Transformer(
            d_model=16,
            nhead=2,
            num_encoder_layers=1,
            num_decoder_layers=1,
            dim_feedforward=24,
            dropout=0.0,
            pos=pos,
            decoder_key_pos="none",
        )
        .double()
        .eval()
    )
    src = torch.randn(1, 16, 4, 3, dtype=torch.float64)
    mask = torch.zeros(1, 4, 3, dtype=torch.bool)
    x = src.flatten(2).transpose(1, 2)
    p = pos.grid(mask, torch.float64).flatten(1, 2)
    layer = t.encoder.layers[0]
    with torch.no_grad():
        want = ln(x + ref_attention(x + p, x + p, x, layer.self_attn), layer.norm1)
        want = ln(want + ffn(want, layer), layer.norm2)
        got, peg_out = t.encoder(x, (4, 3), mask)
    assert peg_out is None
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
