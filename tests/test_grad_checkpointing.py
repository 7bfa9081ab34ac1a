"""``--grad-checkpointing``: the same losses for every family, and a lower peak of memory (measured here)."""

from __future__ import annotations

import json

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from peg_core.grad_checkpoint import checkpointed_blocks, enable_grad_checkpointing, transformer_blocks


def peak_cpu_bytes(fn) -> int:
    """The peak of live CPU tensor memory while ``fn()`` runs, from torch's memory profiler: every
    allocation and free it records (its ``[memory]`` events, signed byte counts) summed in time order."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    current = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        current += e.nbytes()
        peak = max(peak, current)
    return peak


def _losses(out):
    return [
        r["loss"]
        for r in map(json.loads, (out / "log.jsonl").read_text().splitlines())
        if r["tag"] == "train"
    ]


def _same_losses(run, tmp_path):
    run(tmp_path / "plain")
    run(tmp_path / "ckpt", "--grad-checkpointing")
    plain, ckpt = _losses(tmp_path / "plain"), _losses(tmp_path / "ckpt")
    assert plain and ckpt == pytest.approx(plain, rel=1e-6, abs=1e-7), (plain, ckpt)


def test_classifier_same_losses_with_drop_path(tmp_path, capsys):
    from peg_core.__main__ import main
    from tests.core.classify_runs import tiny

    def run(out, *extra):
        argv = tiny(16, 4, "--epochs", "1", "--depth", "2", "--peg-at", "0", "--drop-path-rate", "0.3",
                    "--output-dir", str(out), *extra)  # fmt: skip
        assert main(["train", *argv]) == 0

    _same_losses(run, tmp_path)
    assert "--grad-checkpointing: 2 transformer blocks" in capsys.readouterr().out


def test_video_same_losses(tmp_path):
    from peg_video.__main__ import main
    from tests.video.runs import TINY, synthetic_set

    data = synthetic_set(tmp_path / "data", 4, 2)

    def run(out, *extra):
        argv = ["train", "--train-ann", str(data / "train.csv"), "--val-ann", str(data / "val.csv"),
                "--output-dir", str(out), *TINY, "--epochs", "1", "--device", "cpu", "--threads", "1",
                "--model-opt", "drop_path_rate=0.2", *extra]  # fmt: skip
        assert main(argv) == 0

    _same_losses(run, tmp_path)


COCO_SET = dict(size=96, num_train=4, num_val=2)  # the module's ``coco`` (tests/conftest.py)


DETR_TINY = ["--backbone", "tiny", "--hidden-dim", "32", "--num-heads", "2", "--enc-layers", "1", "--dec-layers", "1",
             "--dim-feedforward", "64", "--num-queries", "5", "--crop-resize", "", "--val-size", "64"]  # fmt: skip
#: the blocks each family checkpoints: DETR's encoder and decoder layers; RT-DETR / D-FINE: AIFI and the
#: decoder layers; DEIMv2 and RF-DETR: their ViT blocks too
FAMILIES = {
    "detr": (DETR_TINY, ["transformer.encoder.layers.0", "transformer.decoder.layers.0"]),
    "rtdetr": (["--config", "rtdetr_demo_tiny"], ["encoder.aifi.0.layers.0", "decoder.layers.1"]),
    "dfine": (["--config", "dfine_demo_tiny"], ["decoder.layers.1"]),
    "deimv2": (["--config", "deimv2_demo_tiny"], ["backbone.vit.blocks.3", "decoder.layers.1"]),
    "rfdetr": (["--config", "rfdetr_demo_tiny"], ["backbone.vit.blocks.3", "decoder.layers.1"]),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_detectors_same_losses(family, coco, tmp_path, monkeypatch):
    import peg_core.engine.trainer as trainer
    from peg_detr.__main__ import main

    flags, expected = FAMILIES[family]
    found = []
    enable = trainer.enable_grad_checkpointing
    monkeypatch.setattr(trainer, "enable_grad_checkpointing", lambda m: found.extend(enable(m)) or found)

    def run(out, *extra):
        argv = ["train", *flags, "--data-root", str(coco), "--output-dir", str(out), "--epochs", "1",
                "--batch-size", "2", "--train-sizes", "64", "--eval-sizes", "64", "--workers", "0",
                "--device", "cpu", "--no-progress", "--threads", "1", *extra]  # fmt: skip
        assert main(argv) == 0

    _same_losses(run, tmp_path)
    assert all(any(e in name for name in found) for e in expected), found
    assert not any(name.startswith("ema.") for name in found), found  # the EMA copy trains nothing


def test_every_family_has_its_blocks_found():
    from peg_core.classify import build_model
    from peg_detr.models.dfine.build import build_dfine

    cpvt = build_model({"arch": "demo", "img_size": 32})
    assert [n for n, _ in transformer_blocks(cpvt)] == [f"blocks.{i}" for i in range(4)]
    model, _, _ = build_dfine("tiny", "sincos", num_classes=3, hidden_dim=32, num_heads=2, dec_layers=2,
                              dim_feedforward=64, num_queries=10, num_points=[2, 2, 2], depth_mult=0.34,
                              encoder_expansion=0.5, max_num_bins=8, num_denoising=6, lqe_hidden_dim=16)  # fmt: skip
    names = enable_grad_checkpointing(model)
    assert any(n.startswith("encoder.") for n in names) and any(n.startswith("decoder.") for n in names), (
        names
    )
    assert checkpointed_blocks(model) == names
    state = model.state_dict()
    copy = __import__("copy").deepcopy(model)
    assert copy.state_dict().keys() == state.keys()


def test_video_vit_peak_memory_is_lower(tmp_path):
    """A 4-block video ViT-Ti on 16-frame clips: the same loss and gradients, a lower measured peak."""
    from peg_video.model import build_model

    torch.manual_seed(0)
    config = {"name": "vit_tiny", "num_classes": 3, "num_frames": 16, "img_size": 128, "depth": 4,
              "pos_enc": "peg3d", "drop_path_rate": 0.1}  # fmt: skip
    model = build_model(config).train()
    clips = torch.randn(4, 3, 16, 128, 128)  # 4 x 512 tubelets: activations outweigh the gradients

    def step():
        torch.manual_seed(1)
        loss = model(clips).logsumexp(-1).mean()
        loss.backward()
        return loss

    plain_peak = peak_cpu_bytes(step)
    model.zero_grad()
    plain_loss = step().item()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    enable_grad_checkpointing(model)
    ckpt_peak = peak_cpu_bytes(step)
    model.zero_grad()
    assert step().item() == pytest.approx(plain_loss, rel=1e-6)
    for p, g in zip(model.parameters(), grads):
        torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-6)
    print(f"peak {plain_peak / 2**20:.1f} MiB -> {ckpt_peak / 2**20:.1f} MiB with --grad-checkpointing")
    assert ckpt_peak < 0.8 * plain_peak, (plain_peak, ckpt_peak)
