"""The engine's newcomer conventions: closing lines, ``--json``, the eval folder, ``configs``, predictors."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch

from peg_core.engine import (
    BrokenSample,
    Summary,
    UserError,
    add_train_args,
    configs_command,
    eval_output_dir,
    new_parser,
    run_reported,
    summary_line,
)
from peg_core.engine.predictor import ClassPrediction, FilePredictor

TRAIN = {
    "command": "train", "status": "finished", "epochs": 6, "epochs_done": 6, "output_dir": "runs/detr",
    "eval": {"ap": 0.3184, "ap50": 0.7161, "size": 80}, "broken": {"train": {"count": 1}, "val": {"count": 0}},
}  # fmt: skip


def test_summary_lines_share_one_shape_and_vocabulary():
    detr = Summary(("ap", "ap50"), size_key="size")
    assert (
        summary_line("train", TRAIN, detr)
        == "train done: ap 0.318 ap50 0.716 at 80 px, 6 epochs, 1 skipped (runs/detr)"
    )
    stopped = {**TRAIN, "status": "stopped", "epochs_done": 2}
    assert summary_line("train", stopped, detr).startswith(
        "train stopped: ap 0.318 ap50 0.716 at 80 px, 2 of 6 epochs"
    )
    classify = Summary(("top1", "top5"), size_key="train_size")
    ev = {"command": "eval", "report": "runs/classify/eval/report.json", "broken": {},
          "eval": {"train_size": 48, "top1": 0.9961, "top5_by_size": {"36": 0.9, "48": 1.0}}}  # fmt: skip
    assert (
        summary_line("eval", ev, classify)
        == "eval done: top1 0.996 top5 1.000 at 48 px (runs/classify/eval/report.json)"
    )
    # older spellings in a report are read with today's names
    old = {**ev, "eval": {"top-1": 0.5, "top-5": 0.75, "train_size": 48}}
    assert summary_line("eval", old, classify).startswith("eval done: top1 0.500 top5 0.750 at 48 px")
    video = Summary(("top1", "top5"), at="{num_frames} frames")
    split_all = {**ev, "eval": {"mean": {"top1": 0.25, "top5": 1.0}, "num_frames": 8}}
    assert summary_line("eval", split_all, video).startswith("eval done: top1 0.250 top5 1.000 at 8 frames (")


def test_run_reported_json_and_print_config(capsys):
    spec = Summary(("ap",))

    def work() -> dict:
        print("epoch 1/1: loss 1.0")  # a command's own output
        return dict(TRAIN)

    args = argparse.Namespace(json=True, print_config=False)
    assert run_reported("train", args, work, spec) == TRAIN
    captured = capsys.readouterr()
    assert json.loads(captured.out) == TRAIN and captured.out.count("\n") == 1
    assert "epoch 1/1" in captured.err
    args = argparse.Namespace(json=False, print_config=True, epochs=3, output_dir=Path("o"))
    result = run_reported("train", args, lambda: pytest.fail("print-config must not train"), spec)
    assert json.loads(capsys.readouterr().out) == {"epochs": 3, "output_dir": "o"} == result["settings"]


def test_eval_output_dir_beside_the_checkpoint_and_never_over_a_training_report(tmp_path):
    ckpt = tmp_path / "run" / "checkpoint.pth"
    assert eval_output_dir(ckpt, None) == tmp_path / "run" / "eval"
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "report.json").write_text(json.dumps({"command": "train"}))
    with pytest.raises(
        UserError, match=r"^output folder holds a training report \(report\.json\); pass --overwrite"
    ) as e:
        eval_output_dir(ckpt, tmp_path / "run")
    assert e.value.where == str(tmp_path / "run")
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "report.json").write_text("not json")
    with pytest.raises(UserError, match=r"holds a JSON file \(report\.json\)"):
        eval_output_dir(ckpt, tmp_path / "odd")
    assert eval_output_dir(ckpt, tmp_path / "odd", overwrite=True) == tmp_path / "odd"
    (tmp_path / "ev").mkdir()
    (tmp_path / "ev" / "report.json").write_text(json.dumps({"command": "eval"}))
    assert eval_output_dir(ckpt, tmp_path / "ev") == tmp_path / "ev"  # an earlier eval: replaced


def _parser() -> argparse.ArgumentParser:
    p = new_parser("toy train")
    add_train_args(p, output_dir="runs/toy", configs={"small": {}})
    p.add_argument("--train-sizes", dest="train_scales")
    p.add_argument("--old", dest="train_scales", help=argparse.SUPPRESS)  # a hidden alias
    p.set_defaults(epochs=10, lr=0.1)
    return p


def test_configs_command_lists_recipes_and_prints_one(capsys):
    configs = {"small": {"epochs": 2, "train_scales": [32, 48], "progress": False}}
    kw = dict(prog="toy", configs=configs, train_parser=_parser, descriptions={"small": "two quick epochs"})
    assert configs_command([], **kw) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:2] == ["small: two quick epochs", "    --epochs 2 --train-sizes 32,48 --no-progress"]
    assert configs_command(["small"], **kw) == 0
    full = json.loads(capsys.readouterr().out)
    assert (full["epochs"], full["lr"], full["train_scales"], full["output_dir"]) == (
        2,
        0.1,
        [32, 48],
        "runs/toy",
    )


class _Toy(FilePredictor):
    batch_size = 2

    def read(self, path: str) -> torch.Tensor:
        if path.endswith(".bad"):
            raise BrokenSample(path, "unreadable")
        return torch.tensor([float(len(path))])

    def run(self, paths, items):
        return [ClassPrediction(p, top=[("len", float(x))]) for p, x in zip(paths, items)]

    def skipped(self, path, reason):
        return ClassPrediction(path, skipped=reason)


def test_file_predictor_keeps_order_and_skips():
    preds = _Toy()(["ab", "x.bad", torch.tensor([7.0]), "abcd"])
    assert [p.path for p in preds] == ["ab", "x.bad", None, "abcd"]
    assert [p.top for p in preds] == [[("len", 2.0)], [], [("len", 7.0)], [("len", 4.0)]]
    assert preds[1].line() == "x.bad: skipped (unreadable)" and preds[2].line() == "<input>: len 7.000"
    assert _Toy().predict_files([Path("abc")])[0].to_json() == {
        "path": "abc",
        "top": [{"class": "len", "p": 3.0}],
        "skipped": None,
    }
