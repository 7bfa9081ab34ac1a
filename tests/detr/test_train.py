"""``python -m peg_detr train`` / ``eval`` on synthetic data: outputs, loss falls, exact resume, NaN stop, configs."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

import peg_detr.task
from peg_core.engine import CHECKPOINT_KEYS, EXIT_DIVERGED, UserError, read_checkpoint
from peg_detr.__main__ import main as cli
from peg_detr.cli import evaluate as eval_main
from peg_detr.cli import parse_train_args
from peg_detr.cli import train as train_main
from peg_detr.configs import CONFIGS, PUBLISHED_AP
from peg_detr.evaluation import STAT_NAMES
from peg_detr.model import build_model, model_config_from_args
from peg_detr.task import per_process_batch

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread_module")]


COCO_SET = dict(min_objects=0, num_train=16)  # the module's ``data`` (tests/conftest.py)


def _argv(data, out, epochs, *extra):
    return [
        "--data-root", str(data), "--output-dir", str(out), "--epochs", str(epochs),
        "--backbone", "tiny", "--pos-enc", "peg", "--hidden-dim", "32", "--num-heads", "2",
        "--enc-layers", "1", "--dec-layers", "2", "--dim-feedforward", "64", "--dropout", "0.1",
        "--num-queries", "6", "--train-sizes", "56,64", "--max-size", "96", "--crop-resize", "64",
        "--crop-size", "40,64", "--val-size", "64", "--total-batch-size", "4", "--workers", "0",
        "--lr", "1e-3", "--lr-backbone", "5e-4", "--lr-drop", "1", "--seed", "7", "--no-progress",
        *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def one_epoch(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("one")
    return out, train_main(_argv(data, out, 1, "--save-every", "1"))


def _model(path):
    return read_checkpoint(path, "detect")["model"]


def test_train_closing_line(data, tmp_path, capsys):
    capsys.readouterr()
    assert cli(["train", *_argv(data, tmp_path, 1, "--eval-every", "0")]) == 0
    m = json.loads((tmp_path / "report.json").read_text())["eval"]
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"train done: ap {m['ap']:.3f} ap50 {m['ap50']:.3f} at 64 px, 1 epoch, 0 skipped ({tmp_path})"
    )


def test_outputs_written(one_epoch):
    out, report = one_epoch
    assert report["status"] == "finished" and report["task"] == "detect" and report["steps"] == 4
    metrics = report["eval"]
    assert (metrics["size"], metrics["images"], metrics["excluded"]) == (64, 4, 0)
    assert set(metrics["sizes"]) == {"64"} and list(metrics["sizes"]["64"]) == [*STAT_NAMES, "images"]
    assert metrics["ap50"] == metrics["sizes"]["64"]["ap50"]
    ckpt = read_checkpoint(out / "checkpoint.pth", "detect")
    assert set(CHECKPOINT_KEYS) <= set(ckpt) and ckpt["epoch"] == 0 and (out / "checkpoint0000.pth").is_file()
    assert ckpt["model_config"]["backbone"] == "tiny" and ckpt["model_config"]["num_classes"] == 4
    assert [c["name"] for c in ckpt["meta"]["categories"]] == ["square", "disc", "triangle"]
    assert (ckpt["meta"]["val_size"], ckpt["meta"]["batch_size"]) == (64, 4)
    assert json.loads((out / "args.json").read_text())["lr"] == 1e-3
    assert json.loads((out / "report.json").read_text())["eval"]["sizes"]["64"]["ap"] == metrics["ap"]
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert {r["tag"] for r in records} >= {"train", "val", "val_sizes_64"}
    train = next(r for r in records if r["tag"] == "train")
    assert {"loss", "loss_ce", "loss_bbox", "loss_giou", "loss_ce_0"} <= set(train)


def test_loss_falls(data, tmp_path):
    train_main(_argv(data, tmp_path, 8, "--crop-resize", "", "--lr-drop", "100", "--eval-every", "0"))
    losses = [
        json.loads(line)["loss"]
        for line in (tmp_path / "log.jsonl").read_text().splitlines()
        if json.loads(line)["tag"] == "train"
    ]
    assert len(losses) == 8
    assert sum(losses[-2:]) / 2 < 0.85 * losses[0], losses


def test_resume_is_exact_and_auto_falls_back(data, tmp_path, capsys):
    straight, part = tmp_path / "straight", tmp_path / "part"
    train_main(_argv(data, straight, 3, "--eval-every", "0"))
    # Stopped after 2 of 3 epochs (evaluating each epoch: evaluation must not shift the RNG) ...
    report = train_main(_argv(data, part, 3, "--stop-after-epoch", "2"))
    assert report["status"] == "stopped"
    fallback = tmp_path / "fallback"
    shutil.copytree(part, fallback)
    # ... then continued: the weights equal the uninterrupted run's bit for bit.
    train_main(_argv(data, part, 3, "--resume", "auto"))
    a = read_checkpoint(straight / "checkpoint.pth", "detect")
    b = read_checkpoint(part / "checkpoint.pth", "detect")
    assert a["epoch"] == b["epoch"] == 2 and a["scheduler"] == b["scheduler"]
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k
    for k, st in a["optimizer"]["state"].items():
        for name, v in st.items():
            assert torch.equal(v, b["optimizer"]["state"][k][name]), (k, name)
    first = _model(fallback / "checkpoint_prev.pth")
    assert any(not torch.equal(v, first[k]) for k, v in a["model"].items())  # training changed the weights

    # A corrupt newest checkpoint: --resume auto says so and continues from checkpoint_prev.pth (epoch 0).
    (fallback / "checkpoint.pth").write_bytes(b"PK\x03\x04 cut short")
    capsys.readouterr()
    train_main(_argv(data, fallback, 3, "--resume", "auto"))
    assert "trying the previous checkpoint" in capsys.readouterr().out
    for k, v in a["model"].items():
        assert torch.equal(v, _model(fallback / "checkpoint.pth")[k]), k


def test_nan_loss_stops_and_keeps_last_checkpoint(data, one_epoch, tmp_path, monkeypatch, capsys):
    out = tmp_path / "nan"
    shutil.copytree(one_epoch[0], out)
    before = (out / "checkpoint.pth").read_bytes()
    real = peg_detr.task.weighted_loss
    calls = []

    def poisoned(loss_dict, weight_dict):
        calls.append(1)
        loss = real(loss_dict, weight_dict)
        return loss * float("nan") if len(calls) == 2 else loss

    monkeypatch.setattr(peg_detr.task, "weighted_loss", poisoned)
    capsys.readouterr()
    assert cli(["train", *_argv(data, out, 3, "--resume", "auto")]) == EXIT_DIVERGED and len(calls) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: loss is nan at step 6 (epoch 2)")
    assert f"the last good checkpoint is {out / 'checkpoint.pth'}" in err[0]
    assert (out / "checkpoint.pth").read_bytes() == before


def test_eval_command_multi_size(data, one_epoch, capsys):
    out, trained = one_epoch
    argv = ["--checkpoint", str(out / "checkpoint.pth"), "--output-dir", str(out / "ev"), "--eval-sizes", "48,64",
            "--val-size", "64", "--workers", "0", "--no-progress"]  # fmt: skip
    capsys.readouterr()
    report = eval_main(argv)
    assert report["command"] == "eval" and set(report["eval"]["sizes"]) == {"48", "64"}
    printed = capsys.readouterr().out
    assert "short side |   AP" in printed
    m = report["eval"]
    assert printed.splitlines()[-1] == (
        f"eval done: ap {m['ap']:.3f} ap50 {m['ap50']:.3f} at 64 px ({out / 'ev' / 'report.json'})"
    )
    # The saved model at the training run's size and batch reproduces the run's numbers (data from the checkpoint).
    for k in STAT_NAMES:
        assert report["eval"][k] == pytest.approx(trained["eval"][k], abs=1e-9), k
    assert json.loads((out / "ev" / "report.json").read_text())["eval"]["size"] == 64
    assert cli(["eval", *argv, "--data-root", str(data)]) == 0
    # without --output-dir: eval/ beside the checkpoint; the training report stays; --json: one line
    capsys.readouterr()
    assert (
        cli(
            ["eval", "--checkpoint", str(out / "checkpoint.pth"), "--workers", "0", "--no-progress", "--json"]
        )
        == 0
    )
    (line,) = capsys.readouterr().out.splitlines()
    assert json.loads(line) == json.loads((out / "eval" / "report.json").read_text())
    assert json.loads((out / "report.json").read_text())["command"] == "train"


def test_named_configs():
    a = parse_train_args(["--config", "cpvt_peg_50ep", "--data-root", "x"])
    assert (a.pos_enc, a.lr, a.lr_backbone, a.epochs, a.lr_drop, a.total_batch_size) == (
        "peg", 1e-4, 2e-5, 50, 40, 32,
    )  # fmt: skip
    assert (
        a.train_scales == list(range(480, 801, 32))
        and a.crop_resize == [400, 500, 600]
        and a.crop_size == [384, 600]
    )
    b = parse_train_args(["--config", "detr_r50_500ep", "--lr-drop", "300", "--data-root", "x"])
    assert (b.pos_enc, b.lr_backbone, b.epochs, b.lr_drop, b.total_batch_size) == ("sine", 1e-5, 500, 300, 64)
    assert parse_train_args(["--config", "cpvt_none_50ep", "--data-root", "x"]).pos_enc == "none"
    assert parse_train_args(["--config", "demo_tiny", "--data-root", "x"]).crop_resize == []
    assert PUBLISHED_AP == {
        "detr_r50_500ep": 42.0, "cpvt_sine_50ep": 33.7, "cpvt_none_50ep": 32.8, "cpvt_peg_50ep": 33.9,
        "rtdetr_r18vd_6x": 46.5, "rtdetr_r50vd_6x": 53.1,
        # the READMEs of Peterande/D-FINE, ShihuaHuang95/DEIM and Intellindust-AI-Lab/DEIMv2
        "dfine_n": 42.8, "dfine_s": 48.5, "dfine_m": 52.3, "dfine_l": 54.0, "dfine_x": 55.8,
        "deim_dfine_n": 43.0, "deim_dfine_s": 49.0, "deim_dfine_m": 52.7, "deim_dfine_l": 54.7, "deim_dfine_x": 56.5,
        "deimv2_s": 50.9, "deimv2_atto": 23.8, "deimv2_femto": 31.0, "deimv2_pico": 38.5, "deimv2_n": 43.0,
        "deimv2_m": 53.0, "deimv2_l": 56.0,
        # roboflow/rf-detr's README (N / S / M / base) and rfdetr.roboflow.com's model table (L)
        "rfdetr_n_coco": 48.4, "rfdetr_s_coco": 53.0, "rfdetr_m_coco": 54.7, "rfdetr_l_coco": 56.5,
        "rfdetr_base_coco": 53.3,
    }  # fmt: skip
    assert set(PUBLISHED_AP) < set(CONFIGS) and "demo_tiny" in CONFIGS
    assert per_process_batch(b, 8) == 8
    with pytest.raises(UserError, match="not divisible by the 3 processes") as e:
        per_process_batch(b, 3)
    assert e.value.line().endswith(": --total-batch-size 64")
    b.grad_accum_steps = 4  # the total is the optimizer step's batch: 64 = 2 processes x 4 steps x 8
    assert per_process_batch(b, 2) == 8
    with pytest.raises(UserError, match="not divisible by the 3 processes x 4 accumulation steps"):
        per_process_batch(b, 3)
    b.batch_size = 3
    assert per_process_batch(b, 8) == 3  # --batch-size (per process) wins


def test_common_flags_accepted():
    a = parse_train_args(
        ["--data-root", "x", "--config", "demo_tiny", "--output-dir", "o", "--resume", "auto", "--epochs", "2",
         "--batch-size", "3", "--lr", "0.01", "--workers", "1", "--amp", "bf16", "--clip-max-norm", "0",
         "--device", "cpu", "--seed", "5", "--eval-every", "2", "--save-every", "1", "--stop-after-epoch", "1",
         "--max-broken", "5%", "--threads", "1", "--find-unused-parameters", "--no-progress", "--debug",
         "--eval-sizes", "60,80,100", "--peg-at", "0,1"]
    )  # fmt: skip
    # (--learned-grid needs --pos-enc learned: test_learned_grid_flag_reaches_the_model)
    expected = dict(
        resume="auto", epochs=2, batch_size=3, lr=0.01, workers=1, amp="bf16", clip_max_norm=0.0, device="cpu",
        seed=5, eval_every=2, save_every=1, stop_after_epoch=1, max_broken=0.05, threads=1,
        find_unused_parameters=True, progress=False, debug=True, eval_sizes=[60, 80, 100], peg_at=[0, 1],
    )  # fmt: skip
    assert {k: getattr(a, k) for k in expected} == expected


def test_learned_grid_flag_reaches_the_model():
    args = parse_train_args(
        ["--config", "demo_tiny", "--data-root", "x", "--pos-enc", "learned", "--learned-grid", "5x7"]
    )
    kw = model_config_from_args(args, num_classes=4)
    assert kw["learned_grid"] == [5, 7]
    model, _, _ = build_model(kw)
    table = dict(model.named_parameters())
    (name,) = [k for k in table if k.endswith("pos_embed")]
    assert table[name].shape == (1, 5 * 7, args.hidden_dim)


def test_configs_verb_and_print_config(tmp_path, capsys):
    capsys.readouterr()
    assert cli(["configs"]) == 0
    out = capsys.readouterr().out.splitlines()
    names = [line.split(":")[0] for line in out if line and not line.startswith(" ") and ": " in line]
    assert names[: len(CONFIGS)] == list(CONFIGS)
    tiny = out[out.index(next(x for x in out if x.startswith("demo_tiny: "))) + 1]
    assert "--backbone tiny" in tiny and "--train-sizes 64,80,96" in tiny and "--crop-resize ''" in tiny
    assert cli(["configs", "cpvt_peg_50ep"]) == 0
    full = json.loads(capsys.readouterr().out)
    assert (full["pos_enc"], full["epochs"], full["lr_backbone"], full["arch"]) == ("peg", 50, 2e-5, "detr")
    never = tmp_path / "never"
    argv = [
        "train",
        "--config",
        "demo_tiny",
        "--data-root",
        str(tmp_path),
        "--epochs",
        "2",
        "--output-dir",
        str(never),
    ]
    assert cli([*argv, "--print-config"]) == 0
    resolved = json.loads(capsys.readouterr().out)
    assert (resolved["epochs"], resolved["train_scales"], resolved["crop_resize"]) == (2, [64, 80, 96], [])
    assert not never.exists()
