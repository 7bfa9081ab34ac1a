"""The shared engine on a toy task: exact resume, fall-back, NaN stop, broken samples, CLI policy."""

from __future__ import annotations

import argparse
import io
import json
import os
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from peg_core.engine import (
    CHECKPOINT_KEYS,
    EXIT_DIVERGED,
    EXIT_ERROR,
    EXIT_USAGE,
    BrokenSample,
    EvalParts,
    Progress,
    SkipBroken,
    StepOutput,
    TrainParts,
    UserError,
    add_eval_args,
    add_train_args,
    evaluate_checkpoint,
    fit,
    new_parser,
    read_checkpoint,
    run_command,
    skipping_collate,
)


class Points(Dataset):
    """y = 3x - 1 + noise; index ``i`` in ``broken`` raises BrokenSample."""

    def __init__(self, n: int = 64, broken: tuple[int, ...] = ()) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 1, generator=g)
        self.y = 3 * self.x - 1 + 0.1 * torch.randn(n, 1, generator=g)
        self.broken = set(broken)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        if i in self.broken:
            raise BrokenSample(f"point{i}.txt", "unreadable")
        # Dropout-like randomness in the data path: makes RNG restore matter for exact resume.
        return self.x[i] + 0.01 * torch.randn(1), self.y[i]


def _collate(items):
    return torch.stack([a for a, _ in items]), torch.stack([b for _, b in items])


class ToyTask:
    name = "toy"

    def __init__(self, broken=(), nan_at_epoch=None):
        self.broken, self.nan_at_epoch = broken, nan_at_epoch

    def _loader(self, ds, ctx, shuffle, seed):
        sampler = DistributedSampler(
            ds, num_replicas=ctx.dist.world_size, rank=ctx.dist.rank, shuffle=shuffle, seed=seed
        )
        return DataLoader(SkipBroken(ds), 8, sampler=sampler, collate_fn=skipping_collate(_collate)), sampler

    def _evaluate(self, ds):
        def evaluate(model, ctx):
            loader, _ = self._loader(ds, ctx, False, 0)
            err = n = 0.0
            with torch.no_grad():
                for x, y in ctx.batches(loader, "val", len(ds)):
                    err += float(((model(x) - y) ** 2).sum())
                    n += len(x)
            return {"mse": err / n}

        return evaluate

    def setup_train(self, args, ctx, ckpt):
        model = nn.Sequential(nn.Linear(1, 8), nn.Dropout(0.1), nn.Linear(8, 1))
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
        ds = Points(64, self.broken)
        loader, sampler = self._loader(ds, ctx, True, args.seed)
        sched = torch.optim.lr_scheduler.StepLR(opt, 2)

        def step(net, batch, ctx):
            x, y = batch
            with ctx.autocast():
                pred = net(x)
            loss = ((pred - y) ** 2).mean()
            if self.nan_at_epoch is not None and sched.last_epoch >= self.nan_at_epoch:
                loss = loss * float("nan")
            return StepOutput(loss, {"mae": (pred - y).abs().mean()})

        return TrainParts(
            model, opt, loader, len(ds), step, evaluate=self._evaluate(Points(16)), scheduler=sched,
            model_config={"hidden": 8}, meta={"note": "toy"}, on_epoch_start=sampler.set_epoch,
            summary=lambda m: f"mse {m['mse']:.4f}",
        )  # fmt: skip

    def setup_eval(self, args, ctx, ckpt):
        model = nn.Sequential(nn.Linear(1, 8), nn.Dropout(0.1), nn.Linear(8, 1))
        model.load_state_dict(ckpt["model"])
        return EvalParts(model, self._evaluate(Points(16)))


def _parser():
    p = new_parser("toy train")
    add_train_args(p, output_dir="runs/toy")
    p.set_defaults(epochs=4, batch_size=8, lr=1e-2, clip_max_norm=1.0, workers=0, progress=False)
    return p


def _args(out, *extra):
    return _parser().parse_args(["--output-dir", str(out), *extra])


def _train(task, out, *extra):
    return fit(task, _args(out, *extra))


def test_fit_writes_checkpoint_report_and_logs(tmp_path):
    report = _train(ToyTask(), tmp_path)
    ckpt = read_checkpoint(tmp_path / "checkpoint.pth", "toy")
    assert set(CHECKPOINT_KEYS) <= set(ckpt) and ckpt["epoch"] == 3 and ckpt["step"] == 4 * 8
    assert (tmp_path / "checkpoint_prev.pth").is_file()
    assert read_checkpoint(tmp_path / "checkpoint_prev.pth", "toy")["epoch"] == 2
    on_disk = json.loads((tmp_path / "report.json").read_text())
    assert on_disk["task"] == "toy" and on_disk["status"] == "finished" and on_disk["steps"] == 32
    assert on_disk["eval"]["mse"] == pytest.approx(report["eval"]["mse"]) and report["eval"]["mse"] < 3.0
    assert on_disk["broken"]["train"] == {"count": 0, "total": 64, "samples": []}
    tags = {json.loads(line)["tag"] for line in (tmp_path / "log.jsonl").read_text().splitlines()}
    assert {"train", "val", "train_step"} <= tags


def _weights(path):
    return read_checkpoint(path, "toy")["model"]


def test_resume_is_exact_and_auto_falls_back(tmp_path, capsys):
    full, part = tmp_path / "full", tmp_path / "part"
    _train(ToyTask(), full)
    _train(ToyTask(), part, "--stop-after-epoch", "2")
    assert json.loads((part / "report.json").read_text())["status"] == "stopped"
    _train(ToyTask(), part, "--resume", "auto")
    for k, v in _weights(full / "checkpoint.pth").items():
        assert torch.equal(v, _weights(part / "checkpoint.pth")[k]), k

    # The newest checkpoint is corrupt: --resume auto says so and continues from the previous one.
    again = tmp_path / "again"
    _train(ToyTask(), again, "--stop-after-epoch", "3")
    (again / "checkpoint.pth").write_bytes(b"\x00garbage")
    (again / ".checkpoint.pth.abc123.tmp").write_bytes(b"half")  # a kill during a save
    capsys.readouterr()
    _train(ToyTask(), again, "--resume", "auto")
    out = capsys.readouterr().out
    assert "checkpoint.pth" in out and "previous" in out and "removed .checkpoint.pth.abc123.tmp" in out
    assert not list(again.glob(".checkpoint*.tmp"))
    for k, v in _weights(full / "checkpoint.pth").items():
        assert torch.equal(v, _weights(again / "checkpoint.pth")[k]), k


def test_resume_auto_without_checkpoint_starts_fresh(tmp_path, capsys):
    _train(ToyTask(), tmp_path, "--resume", "auto", "--epochs", "1")
    assert "starting from scratch" in capsys.readouterr().out


def test_nan_stops_keeps_last_good_checkpoint_exit_3(tmp_path, capsys):
    args = ["--output-dir", str(tmp_path)]
    code = run_command(lambda a: fit(ToyTask(nan_at_epoch=2), _parser().parse_args(a)), args)
    assert code == EXIT_DIVERGED
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: loss is nan at step 17")
    assert "last good checkpoint" in err[0]
    assert read_checkpoint(tmp_path / "checkpoint.pth", "toy")["epoch"] == 1


def test_broken_samples_counted_and_limit(tmp_path, capsys):
    report = _train(ToyTask(broken=(3,)), tmp_path, "--max-broken", "5%", "--epochs", "1")
    assert report["broken"]["train"]["count"] == 1
    assert report["broken"]["train"]["samples"] == [{"path": "point3.txt", "reason": "unreadable"}]
    args = ["--output-dir", str(tmp_path / "b"), "--epochs", "1"]  # default 1%: 1 of 64 is too many
    code = run_command(lambda a: fit(ToyTask(broken=(3,)), _parser().parse_args(a)), args)
    assert code == EXIT_ERROR
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "error: too many broken samples in split 'train': 1 of 64 (more than --max-broken 1.0%); "
        "first: point3.txt: unreadable"
    ]
    code = run_command(lambda a: fit(ToyTask(broken=tuple(range(64))), _parser().parse_args(a)), args)
    assert code == EXIT_ERROR and "nothing could be read in split 'train'" in capsys.readouterr().err


def test_eval_checkpoint_report_and_wrong_task(tmp_path, capsys):
    _train(ToyTask(), tmp_path, "--epochs", "1")
    p = new_parser("toy eval")
    add_eval_args(p)
    report = evaluate_checkpoint(ToyTask(), p.parse_args(["--checkpoint", str(tmp_path / "checkpoint.pth")]))
    assert report["command"] == "eval" and report["eval"]["mse"] > 0
    # eval/ beside the checkpoint: the training run's report.json stays
    assert json.loads((tmp_path / "eval" / "report.json").read_text())["command"] == "eval"
    assert json.loads((tmp_path / "report.json").read_text())["command"] == "train"

    class Other(ToyTask):
        name = "video"

    argv = ["--checkpoint", str(tmp_path / "checkpoint.pth"), "--no-progress"]
    code = run_command(lambda a: evaluate_checkpoint(Other(), p.parse_args(a)), argv)
    err = capsys.readouterr().err
    assert code == EXIT_ERROR and err.count("\n") == 1
    assert "wrong model: checkpoint is for task 'toy', this command needs 'video'" in err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", r"checkpoint is empty \(0 bytes\)"),
        (b"PK\x03\x04trunc", "truncated"),
        (b"just text", "truncated or not a torch file"),
    ],
)
def test_unreadable_checkpoints_are_one_line_errors(tmp_path, content, message):
    path = tmp_path / "c.pth"
    path.write_bytes(content)
    with pytest.raises(UserError, match=message) as e:
        read_checkpoint(path, "toy")
    assert e.value.line().count("\n") == 0 and str(path) in e.value.line()


def test_truncated_real_checkpoint_and_foreign_and_malicious(tmp_path):
    good = tmp_path / "good.pth"
    torch.save({"task": "toy", "model": {"w": torch.ones(1000)}}, good)
    data = good.read_bytes()
    cut = tmp_path / "cut.pth"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match="truncated"):
        read_checkpoint(cut)
    foreign = tmp_path / "timm.pth"
    torch.save({"pos_embed": torch.zeros(1, 5, 3)}, foreign)
    with pytest.raises(UserError, match="not a peg training checkpoint"):
        read_checkpoint(foreign)

    class Evil:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    bad = tmp_path / "evil.pth"
    torch.save({"task": "toy", "model": Evil()}, bad)
    with pytest.raises(UserError, match="refused") as e:
        read_checkpoint(bad)
    assert "weights_only=False" not in str(e.value) and not (tmp_path / "pwned").exists()


def test_missing_and_unwritable_paths(tmp_path, capsys):
    p = new_parser("toy eval")
    add_eval_args(p)
    code = run_command(
        lambda a: evaluate_checkpoint(ToyTask(), p.parse_args(a)), ["--checkpoint", "/nonexistent/c.pth"]
    )
    assert (
        code == EXIT_ERROR and capsys.readouterr().err == "error: checkpoint not found: /nonexistent/c.pth\n"
    )
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code = run_command(
        lambda a: fit(ToyTask(), _parser().parse_args(a)), ["--output-dir", str(blocker / "sub")]
    )
    err = capsys.readouterr().err
    assert (
        code == EXIT_ERROR and err.startswith("error: output folder is not writable") and err.count("\n") == 1
    )


@pytest.mark.parametrize(
    "flags",
    [["--epochs", "0"], ["--batch-size", "-1"], ["--lr", "abc"], ["--amp", "int4"], ["--device", "tpu"],
     ["--max-broken", "150%"], ["--workers", "-2"]],
)  # fmt: skip
def test_bad_option_values_are_usage_lines(flags, capsys):
    with pytest.raises(SystemExit) as e:
        _parser().parse_args(flags)
    err = capsys.readouterr().err
    assert (
        e.value.code == EXIT_USAGE and err.count("\n") == 1 and err.startswith("error: toy train: argument")
    )


def test_cuda_without_gpu_is_a_user_error(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    code = run_command(
        lambda a: fit(ToyTask(), _parser().parse_args(a)), ["--output-dir", str(tmp_path), "--device", "cuda"]
    )
    assert code == EXIT_ERROR and "CUDA is not available" in capsys.readouterr().err


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(UserError):
        run_command(
            lambda a: evaluate_checkpoint(ToyTask(), argparse.Namespace(checkpoint=Path("/no"), debug=True)),
            ["--debug"],
        )


def test_progress_plain_lines_when_not_a_terminal():
    stream = io.StringIO()
    bar = Progress(range(5), desc="epoch 1/2", stream=stream, interval=0.0)
    for _ in bar:
        bar.set_postfix(loss="0.5")
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("epoch 1/2: 1/5 (20%)") and lines[-1].startswith("epoch 1/2: 5/5 (100%)")
    assert "loss=0.5" in lines[-1] and "\r" not in stream.getvalue()
