"""Training entry point on synthetic data: loss falls, exact resume, NaN stop, eval sizes, configs."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

import peg_detr.engine
from peg_detr.__main__ import main as cli
from peg_detr.configs import CONFIGS, PUBLISHED_AP
from peg_detr.data import SyntheticSpec, make_synthetic_coco
from peg_detr.evaluation import STAT_NAMES
from peg_detr.train import _per_process_batch, main, parse_args
from peg_detr.train import main as train_main

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # Tiny models: one intra-op thread is faster. Module scope: the module fixtures below must train
    # with the same thread count as the tests (a different count changes float summation order).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    spec = SyntheticSpec(size=64, num_classes=3, min_objects=0, max_objects=2, min_frac=0.3, max_frac=0.5)
    return make_synthetic_coco(tmp_path_factory.mktemp("data"), num_train=16, num_val=4, seed=1, spec=spec)


def _argv(data, out, epochs, *extra):
    return [
        "--coco-path", str(data), "--output-dir", str(out), "--epochs", str(epochs),
        "--backbone", "tiny", "--pos-enc", "peg", "--hidden-dim", "32", "--nheads", "2",
        "--enc-layers", "1", "--dec-layers", "2", "--dim-feedforward", "64", "--dropout", "0.1",
        "--num-queries", "6", "--train-scales", "56,64", "--max-size", "96", "--crop-resize", "64",
        "--crop-size", "40,64", "--val-size", "64", "--total-batch-size", "4", "--num-workers", "0",
        "--lr", "1e-3", "--lr-backbone", "5e-4", "--lr-drop", "1", "--seed", "7", "--no-progress",
        *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def one_epoch(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("one")
    result = train_main(_argv(data, out, 1, "--save-every", "1"))
    return out, result


def _state(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def test_outputs_written(one_epoch):
    out, result = one_epoch
    assert set(result["eval"]) == {64} and list(result["eval"][64]) == list(STAT_NAMES)
    ckpt = _state(out / "checkpoint.pth")
    assert ckpt["epoch"] == 0 and (out / "checkpoint0000.pth").is_file()
    assert ckpt["model_kwargs"]["backbone"] == "tiny" and ckpt["model_kwargs"]["num_classes"] == 4
    assert [c["name"] for c in ckpt["categories"]] == ["square", "disc", "triangle"]
    assert json.loads((out / "args.json").read_text())["lr"] == 1e-3
    assert json.loads((out / "label_map.json").read_text())["num_classes"] == 4
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert {r["tag"] for r in records} >= {"train", "val_64"}
    assert any((out / "tb").iterdir())


def test_loss_falls(data, tmp_path):
    main(_argv(data, tmp_path, 8, "--crop-resize", "", "--lr-drop", "100", "--eval-every", "0"))
    losses = [
        json.loads(line)["loss"]
        for line in (tmp_path / "log.jsonl").read_text().splitlines()
        if json.loads(line)["tag"] == "train"
    ]
    assert len(losses) == 8
    assert sum(losses[-2:]) / 2 < 0.85 * losses[0], losses


def test_resume_is_exact(data, one_epoch, tmp_path):
    straight = tmp_path / "straight"
    # No evaluation after epoch 0 here, one in the resumed path: evaluating must not shift the RNG.
    main(_argv(data, straight, 2, "--eval-every", "0"))
    resumed = tmp_path / "resumed"
    shutil.copytree(one_epoch[0], resumed)
    main(_argv(data, resumed, 2, "--resume", "auto", "--eval-every", "1"))
    a, b = _state(straight / "checkpoint.pth"), _state(resumed / "checkpoint.pth")
    assert a["epoch"] == b["epoch"] == 1
    assert a["lr_scheduler"] == b["lr_scheduler"]
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k
    for k, st in a["optimizer"]["state"].items():
        for name, v in st.items():
            assert torch.equal(v, b["optimizer"]["state"][k][name]), (k, name)
    # The second epoch changed the weights (the comparison is not trivially between two copies).
    first = _state(one_epoch[0] / "checkpoint.pth")["model"]
    assert any(not torch.equal(v, first[k]) for k, v in a["model"].items())


def test_nan_loss_stops_and_keeps_last_checkpoint(data, one_epoch, tmp_path, monkeypatch, capsys):
    out = tmp_path / "nan"
    shutil.copytree(one_epoch[0], out)
    before = (out / "checkpoint.pth").read_bytes()
    real = peg_detr.engine.weighted_loss
    calls = []

    def poisoned(loss_dict, weight_dict):
        calls.append(1)
        loss = real(loss_dict, weight_dict)
        return loss * float("nan") if len(calls) == 2 else loss

    monkeypatch.setattr(peg_detr.engine, "weighted_loss", poisoned)
    rc = cli(["train", *_argv(data, out, 3, "--resume", "auto")])
    assert rc == 1 and len(calls) == 2
    err = capsys.readouterr().err
    assert "DETR loss is nan at step 5" in err and f"last good checkpoint is {out / 'checkpoint.pth'}" in err
    assert (out / "checkpoint.pth").read_bytes() == before


def test_eval_command_multi_size(data, one_epoch, capsys):
    out = one_epoch[0]
    argv = _argv(data, out / "ev", 1, "--resume", str(out / "checkpoint.pth"), "--eval-sizes", "48,64")
    result = train_main([*argv, "--eval-only"])
    assert set(result["eval"]) == {48, 64}
    assert "short side |   AP" in capsys.readouterr().out
    # Evaluating the saved model at the training run's size reproduces its numbers.
    assert result["eval"][64] == pytest.approx(one_epoch[1]["eval"][64], abs=1e-9)
    assert cli(["eval", *argv]) == 0


def test_named_configs():
    a = parse_args(["--config", "cpvt_peg_50ep", "--coco-path", "x"])
    assert (a.pos_enc, a.lr, a.lr_backbone, a.epochs, a.lr_drop, a.total_batch_size) == (
        "peg",
        1e-4,
        2e-5,
        50,
        40,
        32,
    )
    b = parse_args(["--config", "detr_r50_500ep", "--lr-drop", "300"])
    assert (b.pos_enc, b.lr_backbone, b.epochs, b.lr_drop, b.total_batch_size) == ("sine", 1e-5, 500, 300, 64)
    assert parse_args(["--config", "cpvt_none_50ep"]).pos_enc == "none"
    assert PUBLISHED_AP == {
        "detr_r50_500ep": 42.0,
        "cpvt_sine_50ep": 33.7,
        "cpvt_none_50ep": 32.8,
        "cpvt_peg_50ep": 33.9,
    }
    assert set(PUBLISHED_AP) < set(CONFIGS) and "demo_tiny" in CONFIGS
    assert _per_process_batch(b, 8) == 8
    with pytest.raises(SystemExit, match="not divisible"):
        _per_process_batch(b, 3)
    with pytest.raises(SystemExit, match="coco-path"):
        main(["--epochs", "1"])


def test_demo_quick(tmp_path):
    from peg_detr.demo import run_demo

    summary = run_demo(tmp_path, quick=True)
    assert set(summary) >= {"ap", "ap50", "ap_by_size", "ap50_by_size", "seconds"}
    assert set(summary["ap_by_size"]) == {"36", "48", "60"}
    assert all(-1.0 <= v <= 1.0 for v in summary["ap_by_size"].values())
    assert summary["ap50"] == summary["ap50_by_size"]["48"]
    assert (tmp_path / "train" / "checkpoint.pth").is_file()


def test_learned_grid_flag_reaches_the_model():
    from peg_detr.train import build_model_from_args, model_kwargs_from_args

    args = parse_args(
        ["--config", "demo_tiny", "--coco-path", "x", "--pos-enc", "learned", "--learned-grid", "5x7"]
    )
    kw = model_kwargs_from_args(args, num_classes=4)
    assert kw["learned_grid"] == [5, 7]
    model, _, _ = build_model_from_args(kw)
    table = dict(model.named_parameters())
    (name,) = [k for k in table if k.endswith("pos_embed")]
    assert table[name].shape == (1, 5 * 7, args.hidden_dim)
    with pytest.raises(ValueError, match="HxW"):
        model_kwargs_from_args(parse_args(["--coco-path", "x", "--learned-grid", "5"]), num_classes=4)
