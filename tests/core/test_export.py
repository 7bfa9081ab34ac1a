"""PEG2d under torch.compile (dynamic H, W), torch.export and ONNX (run with onnxruntime).

``torch.compile`` uses dynamo's counting ``eager`` backend: it traces the
module with symbolic H and W exactly as inductor would receive it (graph
breaks, guards and recompiles all show up), without the tens of seconds
inductor's C++ code generation costs on a 2-core CPU.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import Tensor, nn

from peg_core import PEG2d

C = 8


class PegPair(nn.Module):
    """Both call styles from one ``(B, C, H, W)`` input.

    ``map``: a PEG on the feature map (DETR style); ``tokens``: class token +
    flattened patches through a PEG on the token path (ViT style), returning
    ``(B, 1 + H*W, C)``.  One module keeps the export tests to one trace each.
    """

    def __init__(self) -> None:
        super().__init__()
        self.map_peg = PEG2d(C, kernel_size=3)
        self.token_peg = PEG2d(C, kernel_size=5, num_prefix_tokens=1)
        self.cls = nn.Parameter(torch.randn(1, 1, C))

    def forward(self, fmap: Tensor) -> tuple[Tensor, Tensor]:
        b, _, h, w = fmap.shape
        tokens = torch.cat([self.cls.expand(b, -1, -1), fmap.flatten(2).transpose(1, 2)], dim=1)
        return self.map_peg(fmap), self.token_peg(tokens, (h, w))


SIZES = [(5, 7), (9, 4)]


def _dims() -> dict[int, torch.export.Dim]:
    """Dynamic batch, H and W."""
    return {
        0: torch.export.Dim("B", min=1, max=64),
        2: torch.export.Dim("H", min=2, max=64),
        3: torch.export.Dim("W", min=2, max=64),
    }


@pytest.fixture
def pair() -> PegPair:
    mod = PegPair().eval()
    with torch.no_grad():
        mod.map_peg.proj.bias.normal_()
        mod.token_peg.proj.bias.normal_()
    return mod


def test_compile_dynamic_hw_one_graph():
    from torch._dynamo.testing import CompileCounter

    peg = PEG2d(C, num_prefix_tokens=1).eval()
    counter = CompileCounter()
    compiled = torch.compile(peg, backend=counter, dynamic=True, fullgraph=True)
    for h, w in SIZES:
        x = torch.randn(2, 1 + h * w, C)
        mask = torch.zeros(2, h, w, dtype=torch.bool)
        mask[0, h - 2 :, :] = True
        for m in (None, mask):
            torch.testing.assert_close(compiled(x, (h, w), m), peg(x, (h, w), m), atol=0, rtol=0)
    # one graph with and one without the mask, each reused for the second (H, W)
    assert counter.frame_count == 2, counter.frame_count


def test_torch_export_dynamic_hw(pair):
    ep = torch.export.export(pair, (torch.randn(2, C, 5, 6),), dynamic_shapes=(_dims(),))
    symbols = {str(s) for s in ep.range_constraints}
    assert len(symbols) == 3, symbols  # B, H and W stayed symbolic
    for h, w in SIZES:
        x = torch.randn(3, C, h, w)
        for got, want in zip(ep.module()(x), pair(x)):
            torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def test_onnx_dynamic_hw_onnxruntime(pair, tmp_path):
    import onnxruntime as ort

    path = tmp_path / "peg.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            pair,
            (torch.randn(2, C, 5, 6),),
            dynamo=True,
            dynamic_shapes=(_dims(),),
            input_names=["fmap"],
            output_names=["map", "tokens"],
            verbose=False,
        )
    program.save(str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for h, w in SIZES:
        x = torch.randn(3, C, h, w)
        outs = session.run(None, {"fmap": x.numpy()})
        with torch.no_grad():
            want = pair(x)
        assert outs[1].shape == (3, 1 + h * w, C)
        for got, ref in zip(outs, want):
            torch.testing.assert_close(torch.from_numpy(got), ref, atol=1e-5, rtol=0)
