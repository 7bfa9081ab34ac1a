"""``--compile``: compiled training equals eager over a multi-scale epoch, with its recompiles counted.

Inductor specialises the image side (:mod:`peg_core.engine.compile`), so a run compiles one graph per
side: two sides and an evaluation give two training graphs and one evaluation graph (2 recompiles),
counted by the engine's backend and by dynamo's own ``unique_graphs`` counter.
"""

from __future__ import annotations

import json
from typing import NamedTuple

import pytest
import torch
from torch import nn

from peg_core.engine.compile import compile_regions, input_key, pad_to_bucket


class ImageBatch(NamedTuple):
    """peg_detr's padded batch (``peg_detr.structures.ImageBatch``): images and a mask True at padding."""

    tensors: torch.Tensor
    mask: torch.Tensor


def test_regions_of_each_family():
    """The whole model; the RT-DETR family's backbone and encoder (the decoder takes the targets); an EMA's both."""

    class RTLike(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.backbone, self.encoder, self.decoder = nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 2)

        def denoising_group(self, targets):  # pragma: no cover - a marker of the family
            return None

    class Ema(nn.Module):
        def __init__(self, model: nn.Module) -> None:
            super().__init__()
            self.model, self.copy = model, RTLike()

        @property
        def averaged(self) -> nn.Module:
            return self.copy

    plain = nn.Linear(2, 2)
    assert compile_regions(plain) == [("", plain)]
    rt = RTLike()
    assert [n for n, _ in compile_regions(rt)] == ["backbone", "encoder"]
    ema = Ema(rt)
    names = [n for n, _ in compile_regions(ema)]
    assert names == ["model.backbone", "model.encoder", "averaged.backbone", "averaged.encoder"]


def test_detr_batches_padded_to_buckets_and_keys():
    images = torch.ones(2, 3, 100, 130)
    batch = ImageBatch(images, torch.zeros(2, 100, 130, dtype=torch.bool))
    padded = pad_to_bucket(batch, 64)
    assert isinstance(padded, ImageBatch) and padded.tensors.shape == (2, 3, 128, 192)
    assert (
        torch.equal(padded.tensors[..., :100, :130], images) and padded.tensors[..., 100:, :].abs().sum() == 0
    )
    assert (
        padded.mask[:, 100:, :].all()
        and padded.mask[:, :, 130:].all()
        and not padded.mask[:, :100, :130].any()
    )
    assert pad_to_bucket(padded, 64) is padded
    # the key of a batch's graph: its images' shape (rounded up to the bucket)
    assert input_key((batch, [{"labels": torch.zeros(3)}]), 64) == (2, 3, 128, 192)
    assert input_key({"video": torch.zeros(1, 3, 4, 8, 8), "label": torch.zeros(1)}) == (1, 3, 4, 8, 8)


def test_detr_eager_steps_see_the_bucket_too():
    """The timed eager steps of a DETR run are steps of the padded run (no compilation needed to check)."""
    from peg_core.engine.compile import CompiledModel

    class DetrLike(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.backbone, self.transformer, self.input_proj = nn.Identity(), nn.Identity(), nn.Identity()

        def forward(self, batch: ImageBatch) -> torch.Size:
            return batch.tensors.shape

    model = DetrLike()
    compiled = CompiledModel(model)
    assert compiled.bucket == 128 and [n for n, _ in compiled.regions] == [""]
    with compiled.eager():
        shape = model(ImageBatch(torch.zeros(1, 3, 100, 130), torch.zeros(1, 100, 130, dtype=torch.bool)))
    assert shape == (1, 3, 128, 256)


def _losses(out):
    rows = map(json.loads, (out / "log.jsonl").read_text().splitlines())
    return [r["loss"] for r in rows if r["tag"] == "train"]


@pytest.mark.slow
def test_compiled_multiscale_training_equals_eager_with_two_recompiles(tmp_path):
    """Two epochs of 6 steps at sides 16 and 24: the losses, the weights and the evaluation equal eager's;
    2 training graphs (one per side) and 1 evaluation graph, i.e. 2 recompiles, and no other graph."""
    from torch._dynamo.utils import counters

    from peg_core.__main__ import main
    from tests.core.classify_runs import tiny

    def run(out, *extra):
        argv = tiny(
            48, 8, "--epochs", "2", "--lr", "1e-3", "--train-sizes", "16,24", "--output-dir", str(out)
        )
        assert main(["train", *argv, *extra]) == 0
        return json.loads((out / "report.json").read_text())

    eager = run(tmp_path / "eager")
    before = counters["stats"]["unique_graphs"]
    compiled = run(tmp_path / "compiled", "--compile")
    c = compiled["compile"]
    assert (c["train_graphs"], c["eval_graphs"], c["recompiles"]) == (2, 1, 2), c
    assert counters["stats"]["unique_graphs"] - before == c["graphs"] == 3  # dynamo's count agrees
    assert c["shapes"] == 2 and c["compile_seconds"] > 0 and c["speedup"] > 0  # both sides ran compiled
    assert _losses(tmp_path / "compiled") == pytest.approx(_losses(tmp_path / "eager"), rel=1e-5, abs=1e-6)
    assert compiled["eval"]["top1"] == eager["eval"]["top1"]
    assert compiled["eval"]["loss"] == pytest.approx(eager["eval"]["loss"], rel=1e-5)
    wa = torch.load(tmp_path / "eager" / "checkpoint.pth", weights_only=True)["model"]
    wb = torch.load(tmp_path / "compiled" / "checkpoint.pth", weights_only=True)["model"]
    assert wa.keys() == wb.keys()  # compiled in place: the checkpoint's keys are the plain model's
    for k in wa:
        assert torch.allclose(wa[k], wb[k], rtol=1e-4, atol=1e-5), k


@pytest.mark.slow
def test_compiled_dropout_draws_what_eager_draws():
    """Inductor's own dropout draws other numbers (and moves the generator elsewhere); the engine's doesn't."""
    import copy

    from peg_core.engine.compile import CompiledModel

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.Linear(8, 2))
    eager = copy.deepcopy(model)
    compiled = CompiledModel(model)
    x = torch.randn(4, 8)

    def step(m):
        torch.manual_seed(1)
        out = m(x)
        out.square().sum().backward()
        return out, torch.rand(3)  # the generator's state after the step

    out_c, next_c = step(model)
    out_e, next_e = step(eager)
    assert compiled.report()["graphs"] == 1
    assert torch.equal(out_c, out_e) and torch.equal(next_c, next_e)
    for p, q in zip(model.parameters(), eager.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6)
