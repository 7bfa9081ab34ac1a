"""FIRE's bias computed in row chunks equals the whole computation (values and gradients)."""

from __future__ import annotations

import torch

import peg_core.bias as bias_module
from peg_core.bias import FIREBias


def test_chunked_fire_equals_unchunked(monkeypatch):
    for per_axis in (False, True):
        torch.manual_seed(0)
        fire = FIREBias(3, 2, hidden=8, per_axis=per_axis)
        whole = fire((6, 7), num_prefix_tokens=1)
        whole.square().sum().backward()
        grads = [p.grad.clone() for p in fire.parameters()]
        fire.zero_grad()
        # 42 tokens: the (42, 42, 8) hidden layer is 56 KiB; chunks of 5 rows (6.6 KiB) at this limit
        monkeypatch.setattr(bias_module, "FIRE_CHUNK_BYTES", 5 * 42 * 8 * 4)
        chunked = fire((6, 7), num_prefix_tokens=1)
        chunked.square().sum().backward()
        torch.testing.assert_close(chunked, whole, rtol=0, atol=0)
        for p, g in zip(fire.parameters(), grads):
            torch.testing.assert_close(p.grad, g, rtol=1e-5, atol=1e-4)  # summation order
        with torch.no_grad():
            torch.testing.assert_close(fire((6, 7), num_prefix_tokens=1), whole.detach(), rtol=0, atol=0)
        monkeypatch.undo()
