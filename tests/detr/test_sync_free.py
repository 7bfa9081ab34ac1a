"""The DETR step without host-device synchronisation, and torch.compile without graph breaks.

There is no GPU here, so the "no sync" claim is checked structurally: every
operator that reads a tensor's value on the host (``aten._local_scalar_dense``
behind ``.item()``/``int()``/``bool()``, ``aten.is_nonzero``) is counted by a
``TorchDispatchMode``, and ``Tensor.tolist``/``numpy``/``cpu`` are counted by
wrappers, during the model's forward and the loss.  The one allowed transfer,
inside the matcher, is excluded.  :func:`test_sync_counter_sees_host_reads`
shows the counter catches what the old encoding code did (``.tolist()`` of the
per-image extents, ``bool(mask.any())``).
"""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from peg_core import resize_pos_embed
from peg_core.encodings import LearnedPositionEncoding2d, SinePositionEncoding2d
from peg_detr.models import build_detr
from peg_detr.structures import pad_images
from peg_video.models import build_video_model

HOST_READS = {"aten._local_scalar_dense.default", "aten.is_nonzero.default", "aten.item.default"}


class SyncCounter(TorchDispatchMode):
    """Counts operators and Tensor methods that need a tensor's value on the host."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[str] = []
        self.paused = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.paused and str(func) in HOST_READS:
            self.events.append(str(func))
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def count_syncs(monkeypatch, matcher=None):
    """``SyncCounter`` plus wrapped ``tolist``/``numpy``/``cpu``; ``matcher.match_layers`` is not counted."""
    counter = SyncCounter()
    for name in ("tolist", "numpy", "cpu"):
        original = getattr(torch.Tensor, name)

        def wrapped(self, *a, _original=original, _name=name, **k):
            if not counter.paused:
                counter.events.append(f"Tensor.{_name}")
            return _original(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, wrapped)
    calls = []
    if matcher is not None:
        original_match = matcher.match_layers

        def match_layers(*a, **k):
            calls.append(1)
            counter.paused += 1
            try:
                return original_match(*a, **k)
            finally:
                counter.paused -= 1

        monkeypatch.setattr(matcher, "match_layers", match_layers)
    with counter:
        yield counter, calls
    monkeypatch.undo()


def _tiny(pos_enc: str, layers: int = 2):
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_detr(
            "tiny", pos_enc, num_classes=3, num_queries=5, hidden_dim=32, num_heads=2, enc_layers=layers,
            dec_layers=layers, dim_feedforward=32, learned_grid=(3, 5),
        )  # fmt: skip


def _batch():
    # different real extents per image, odd and non-square, one image with no padding
    g = torch.Generator().manual_seed(1)
    images = [torch.randn(3, 80, 112, generator=g), torch.randn(3, 48, 64, generator=g),
              torch.randn(3, 64, 96, generator=g)]  # fmt: skip
    targets = [
        {"labels": torch.tensor([0, 2]), "boxes": torch.tensor([[0.3, 0.4, 0.2, 0.3], [0.6, 0.5, 0.3, 0.2]])},
        {"labels": torch.tensor([1]), "boxes": torch.tensor([[0.5, 0.5, 0.4, 0.4]])},
        {"labels": torch.zeros(0, dtype=torch.int64), "boxes": torch.zeros(0, 4)},
    ]
    return pad_images(images), targets


@pytest.mark.parametrize("pos_enc", ["peg", "sine", "learned", "rope-mixed", "rope-dinov3"])
def test_forward_and_loss_read_nothing_on_the_host(monkeypatch, pos_enc):
    model, criterion, _ = _tiny(pos_enc)
    batch, targets = _batch()
    with count_syncs(monkeypatch, criterion.matcher) as (counter, calls):
        losses = criterion(model(batch), targets)
        total = criterion.total(losses)
    assert counter.events == []
    assert len(calls) == 1  # all decoder layers matched with one transfer
    assert "loss_giou_0" in losses and torch.isfinite(total)
    assert isinstance(losses["loss_bbox"], torch.Tensor)


def test_sync_counter_sees_host_reads(monkeypatch):
    # The host path (what every mode used before) reads the extents with .tolist(): counted.
    enc = LearnedPositionEncoding2d(8, (3, 4), interpolation="nearest")
    mask = torch.zeros(2, 5, 6, dtype=torch.bool)
    mask[1, 3:] = True
    x = torch.randn(2, 30, 8)
    with count_syncs(monkeypatch) as (counter, _):
        enc.position(x, (5, 6), mask)
        bool(mask.any())
    assert "Tensor.tolist" in counter.events and set(counter.events) & HOST_READS
    enc.interpolation = "bicubic"  # the device path: nothing
    with count_syncs(monkeypatch) as (counter, _):
        enc.position(x, (5, 6), mask)
    assert counter.events == []


def _old_learned(enc: LearnedPositionEncoding2d, size, mask) -> torch.Tensor:
    """The pre-change formula: each image's table resized to its real extent (float64), placed top-left."""
    h, w = size
    p = enc.num_prefix_tokens
    table = enc.pos_embed.detach().double()
    out = torch.zeros(mask.shape[0], p + h * w, enc.dim, dtype=torch.float64)
    for b in range(mask.shape[0]):
        real = ~mask[b]
        hb, wb = max(int(real.any(1).sum()), 1), max(int(real.any(0).sum()), 1)
        tab = resize_pos_embed(table, (hb, wb), enc.grid_size, num_prefix_tokens=p, mode=enc.interpolation)
        out[b, p:].view(h, w, enc.dim)[:hb, :wb] = tab[0, p:].view(hb, wb, enc.dim)
        out[b, :p] = tab[0, :p]
    return out


@pytest.mark.parametrize("mode", ["bicubic", "bilinear", "nearest"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_learned_masked_tables_equal_the_old_formula(mode, dtype):
    torch.manual_seed(0)
    enc = LearnedPositionEncoding2d(12, (5, 7), num_prefix_tokens=1, interpolation=mode).to(dtype)
    h, w = 9, 11  # odd, non-square; up- and down-sizing against (5, 7)
    mask = torch.zeros(4, h, w, dtype=torch.bool)
    mask[0, 6:, :] = True
    mask[0, :, 4:] = True  # 6 x 4
    mask[2] = True  # all padding: a 1 x 1 table, as before
    mask[3, :, 10:] = True  # 9 x 10
    x = torch.randn(4, 1 + h * w, 12, dtype=dtype)
    got = enc.position(x, (h, w), mask)
    want = _old_learned(enc, (h, w), mask)
    assert got.dtype == dtype
    tol = 1e-12 if dtype == torch.float64 else 1e-6
    torch.testing.assert_close(got.double(), want, atol=tol, rtol=0)
    # no mask: the plain resized table; an all-real mask gives the same codes
    full = enc.position(x, (h, w), torch.zeros(4, h, w, dtype=torch.bool))
    torch.testing.assert_close(full, enc.position(x, (h, w)).expand(4, -1, -1), atol=tol, rtol=0)


def test_sine_table_computed_once_and_outputs_unchanged(monkeypatch):
    model, _, _ = _tiny("sine")
    model.eval()
    batch, _ = _batch()
    calls = []
    original = SinePositionEncoding2d.grid

    def grid(self, *a, **k):
        calls.append(1)
        return original(self, *a, **k)

    monkeypatch.setattr(SinePositionEncoding2d, "grid", grid)
    with torch.no_grad():
        shared = model(batch)
        assert len(calls) == 1
        model.transformer._share_sine = False  # the previous path: encoder and decoder each compute it
        separate = model(batch)
    assert len(calls) == 3
    for key in ("pred_logits", "pred_boxes"):
        torch.testing.assert_close(shared[key], separate[key], atol=0, rtol=0)
    assert shared["pred_logits"].dtype == torch.float32


def _explain(model, *inputs) -> int:
    torch._dynamo.reset()
    return torch._dynamo.explain(model)(*inputs).graph_break_count


@pytest.mark.parametrize(
    "pos_enc", ["peg", "sine", "learned", "none", "rope-axial", "rope-mixed", "rope-dinov3", "peg+rope-mixed"]
)
def test_detr_compiles_without_graph_breaks(pos_enc):
    model, _, _ = _tiny(pos_enc, layers=1)
    model.eval()
    batch, _ = _batch()
    assert _explain(model, batch) == 0  # padded batch with a mask


@pytest.mark.parametrize("pos_enc", ["peg", "learned", "rope-mixed"])
def test_detr_one_graph_for_dynamic_sizes(pos_enc):
    """Dynamic H, W: one full graph serves two image sizes and equals eager (PEG / learned: size-dependent code)."""
    from torch._dynamo.testing import CompileCounter

    model, _, _ = _tiny(pos_enc, layers=1)
    model.eval()
    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter, dynamic=True, fullgraph=True)
    with torch.no_grad():
        for h, w in ((64, 96), (80, 48)):
            x = torch.randn(2, 3, h, w)
            torch.testing.assert_close(compiled(x)["pred_boxes"], model(x)["pred_boxes"], atol=1e-5, rtol=0)
    assert counter.frame_count == 1


@pytest.mark.parametrize(
    "pos_enc", ["peg3d", "peg3d-factorized", "learned", "none", "rope-3d", "peg3d+rope-3d"]
)
def test_video_model_compiles_without_graph_breaks(pos_enc):
    from torch._dynamo.testing import CompileCounter

    torch.manual_seed(0)
    model = build_video_model(
        "vit_tiny", pos_enc, num_classes=3, num_frames=4, img_size=16, tubelet=(2, 8, 8), embed_dim=16,
        depth=1, num_heads=2, mlp_ratio=1.0,
    ).eval()  # fmt: skip
    assert _explain(model, torch.randn(2, 3, 4, 16, 16)) == 0
    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter, dynamic=True, fullgraph=True)
    with torch.no_grad():
        for shape in ((2, 3, 4, 16, 24), (3, 3, 6, 32, 16)):
            x = torch.randn(*shape)
            torch.testing.assert_close(compiled(x), model(x), atol=1e-5, rtol=0)
    assert counter.frame_count == 1
