"""Resolution-change recipes of the engine: multi-scale and progressive sizes, position freeze / lr scale."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from peg_core.__main__ import main
from peg_core.classify.model import build_model
from peg_core.classify.task import resize_images
from peg_core.encodings import LearnedPositionEncoding2d
from peg_core.engine import (
    StepOutput,
    TrainParts,
    add_train_args,
    fit,
    new_parser,
    param_groups,
    read_checkpoint,
    warmup_cosine,
)
from peg_core.engine.recipes import (
    add_recipe_args,
    apply_position_recipe,
    draw_train_size,
    position_parameter_names,
    progressive_epochs,
    stage_of_epoch,
)
from tests.core.classify_runs import (
    keep_threads,  # noqa: F401 (autouse: restores torch's threads)
    one_line_error,
    tiny,
)

SIZES = [8, 12, 16]


def _tiny(pos_enc: str = "learned"):
    """A 1-block CPVT on 16 px inputs, patch 4 (a 4x4 grid at 16 px, 2x2 at 8 px)."""
    return build_model({"arch": "demo", "pos_enc": pos_enc, "img_size": 16, "num_classes": 3, "embed_dim": 16,
                        "depth": 1, "num_heads": 2, "patch_size": 4, "peg_at": [0]})  # fmt: skip


def _adamw(model: torch.nn.Module, lr: float) -> torch.optim.AdamW:
    """The classifier's optimiser: AdamW over the engine's [decayed, not decayed] groups."""
    return torch.optim.AdamW(param_groups(model, 0.05), lr=lr, weight_decay=0.05)


class SizeTask:
    """Toy classification on random 16 px images; records the (epoch, step, size) of every batch."""

    name = "toy-sizes"

    def __init__(self, pos_enc: str = "learned", hook: bool = True) -> None:
        self.pos_enc, self.hook = pos_enc, hook
        self.seen: list[tuple[int, int]] = []  # (height, width) given to step, in order

    def setup_train(self, args, ctx, ckpt):
        torch.manual_seed(args.seed)
        model = _tiny(self.pos_enc)
        self.model = model
        opt = _adamw(model, args.lr)
        apply_position_recipe(opt, model, freeze=args.freeze_pos, lr_scale=args.pos_lr_scale)
        g = torch.Generator().manual_seed(0)
        data = TensorDataset(torch.randn(32, 3, 16, 16, generator=g), torch.randint(0, 3, (32,), generator=g))
        loader = DataLoader(data, batch_size=8, shuffle=False)
        self.optimizer = opt
        sched = warmup_cosine(opt, 2, args.epochs * len(loader))

        def step(net, batch, ctx):
            x, y = batch
            self.seen.append(tuple(x.shape[-2:]))
            return StepOutput(F.cross_entropy(net(x), y))

        return TrainParts(model, opt, loader, len(data), step, scheduler=sched, scheduler_interval="step",
                          resize_batch=resize_images if self.hook else None)  # fmt: skip

    def setup_eval(self, args, ctx, ckpt):  # pragma: no cover - not used
        raise NotImplementedError


def _args(out: Path, *extra: str):
    p = new_parser("toy train")
    add_train_args(p, output_dir=str(out))
    add_recipe_args(p)
    p.set_defaults(
        epochs=3, batch_size=8, lr=1e-2, clip_max_norm=0.0, workers=0, progress=False, device="cpu", threads=1
    )
    return p.parse_args(["--output-dir", str(out), *extra])


def _train_log(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    return [r for r in rows if r["tag"] == "train"]


# ------------------------------------------------------------------------------------------- sizes


def test_drawn_sizes_are_a_function_of_seed_epoch_step_and_cover_the_list():
    draws = [draw_train_size(SIZES, 0, 0, s) for s in range(300)]
    assert draws == [draw_train_size(SIZES, 0, 0, s) for s in range(300)]
    assert set(draws) == set(SIZES)
    # roughly uniform: each size between 20 % and 47 % of 300 draws
    assert all(60 < draws.count(s) < 140 for s in SIZES)
    assert draws != [draw_train_size(SIZES, 1, 0, s) for s in range(300)]
    assert draws != [draw_train_size(SIZES, 0, 1, s) for s in range(300)]


def test_multiscale_run_draws_the_listed_sizes_and_a_resume_draws_the_same(tmp_path):
    full = SizeTask()
    fit(full, _args(tmp_path / "full", "--train-sizes", "8,12,16"))
    # 3 epochs x 4 steps; step is the global step, the epoch of step s is s // 4
    expected = [draw_train_size(SIZES, 0, s // 4, s) for s in range(12)]
    assert [h for h, _ in full.seen] == expected and all(h == w for h, w in full.seen)
    assert set(expected) == set(SIZES)

    part = SizeTask()
    fit(part, _args(tmp_path / "part", "--train-sizes", "8,12,16", "--stop-after-epoch", "1"))
    fit(part, _args(tmp_path / "part", "--train-sizes", "8,12,16", "--resume", "auto"))
    assert part.seen == full.seen
    a = read_checkpoint(tmp_path / "full" / "checkpoint.pth", "toy-sizes")["model"]
    b = read_checkpoint(tmp_path / "part" / "checkpoint.pth", "toy-sizes")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    means = [r["size"] for r in _train_log(tmp_path / "full")]
    assert means == pytest.approx([sum(expected[e * 4 : e * 4 + 4]) / 4 for e in range(3)])


def test_progressive_epochs_split_and_stages():
    assert progressive_epochs(7, 3) == [2, 2, 3]
    assert progressive_epochs(6, 3, [1, 2, 3]) == [1, 2, 3]
    assert [stage_of_epoch(e, [1, 2, 3]) for e in range(7)] == [0, 1, 1, 2, 2, 2, 2]


def test_progressive_run_logs_the_size_per_epoch_and_resumes_in_its_stage(tmp_path):
    extra = ["--epochs", "4", "--progressive-sizes", "8,12,16", "--progressive-epochs", "1,1,2"]
    full = SizeTask()
    fit(full, _args(tmp_path / "full", *extra))
    assert [h for h, _ in full.seen] == [8] * 4 + [12] * 4 + [16] * 8
    assert [r["size"] for r in _train_log(tmp_path / "full")] == [8, 12, 16, 16]

    part = SizeTask()
    fit(part, _args(tmp_path / "part", *extra, "--stop-after-epoch", "2"))
    resumed = SizeTask()
    fit(resumed, _args(tmp_path / "part", *extra, "--resume", "auto"))
    assert [h for h, _ in resumed.seen] == [16] * 8  # epochs 3-4: the last stage

    even = SizeTask()
    fit(even, _args(tmp_path / "even", "--epochs", "4", "--progressive-sizes", "8,16"))
    assert [h for h, _ in even.seen] == [8] * 8 + [16] * 8


def test_a_task_without_the_hook_refuses_the_size_flags(tmp_path):
    from peg_core.engine import UserError

    with pytest.raises(UserError, match="does not resize batches"):
        fit(SizeTask(hook=False), _args(tmp_path / "r", "--train-sizes", "8,16"))


# ---------------------------------------------------------------------------------- position params


def test_position_parameters_are_found_by_module_type():
    assert position_parameter_names(_tiny("learned")) == ["pos_enc.pos_embed"]
    assert position_parameter_names(_tiny("peg")) == ["pos_blocks.0.proj.weight", "pos_blocks.0.proj.bias"]
    assert position_parameter_names(_tiny("sincos")) == []
    assert position_parameter_names(_tiny("none")) == []
    from peg_video.models import build_video_model

    video = build_video_model("vit_tiny", pos_enc="learned", num_classes=3, num_frames=4, img_size=16,
                              tubelet=[2, 8, 8], embed_dim=16, depth=1, num_heads=2)  # fmt: skip
    assert sorted(position_parameter_names(video)) == ["pos_enc.spatial", "pos_enc.temporal"]


@pytest.mark.parametrize("pos_enc", ["learned", "peg"])
def test_freeze_pos_keeps_position_parameters_while_the_rest_trains(tmp_path, pos_enc):
    task = SizeTask(pos_enc)
    fit(task, _args(tmp_path / "r", "--epochs", "1", "--freeze-pos"))
    torch.manual_seed(0)
    start = _tiny(pos_enc).state_dict()  # setup_train seeds the same init
    end = task.model.state_dict()
    names = position_parameter_names(task.model)
    assert names and all(torch.equal(start[n], end[n]) for n in names)
    assert not any(p.requires_grad for n, p in task.model.named_parameters() if n in names)
    others = [n for n, p in task.model.named_parameters() if n not in names]
    assert all(not torch.equal(start[n], end[n]) for n in others if n.endswith("weight") and "norm" not in n)
    in_opt = {id(p) for g in task.optimizer.param_groups for p in g["params"]}
    assert not any(id(p) in in_opt for n, p in task.model.named_parameters() if n in names)


def test_pos_lr_scale_follows_the_scheduler():
    model = _tiny("learned")
    opt = _adamw(model, 1e-3)
    apply_position_recipe(opt, model, lr_scale=0.1)
    pos = [g for g in opt.param_groups if g.get("position")]
    assert len(pos) == 1 and pos[0]["params"] == [model.pos_enc.pos_embed] and pos[0]["weight_decay"] == 0.0
    sched = warmup_cosine(opt, 3, 10)
    for _ in range(6):
        base = opt.param_groups[0]["lr"]
        assert base > 0 and pos[0]["lr"] == pytest.approx(0.1 * base, rel=1e-12)
        opt.step()
        sched.step()


def test_pos_lr_scale_in_a_run_and_its_resume(tmp_path):
    fit(SizeTask("peg"), _args(tmp_path / "r", "--pos-lr-scale", "0.25", "--stop-after-epoch", "1"))
    fit(SizeTask("peg"), _args(tmp_path / "r", "--pos-lr-scale", "0.25", "--resume", "auto"))
    groups = read_checkpoint(tmp_path / "r" / "checkpoint.pth", "toy-sizes")["optimizer"]["param_groups"]
    pos = [g for g in groups if g.get("position")]
    assert len(pos) == 2  # one per original group: PEG weights decay, their biases do not
    assert all(g["lr"] == pytest.approx(0.25 * groups[0]["lr"]) for g in pos)
    assert {g["weight_decay"] for g in pos} == {0.0, 0.05}


def test_learned_tables_start_as_trunc_normal_std_002():
    # trunc_normal_(std=.02) keeps timm's default absolute bounds +-2: effectively untruncated
    torch.manual_seed(0)
    table = LearnedPositionEncoding2d(256, (32, 32)).pos_embed.detach().double()
    assert table.std().item() == pytest.approx(0.02, rel=0.01) and abs(table.mean().item()) < 5e-4
    assert table.abs().max().item() <= 2.0 and table.abs().max().item() > 4 * 0.02  # tails not cut at 2 sigma
    from peg_core.encodings import LearnedPositionEncoding3d

    torch.manual_seed(0)
    enc = LearnedPositionEncoding3d(256, (8, 32, 32))
    assert enc.spatial.std().item() == pytest.approx(0.02, rel=0.01)
    assert enc.temporal.std().item() == pytest.approx(0.02, rel=0.2)


# ------------------------------------------------------------------------------------------- CLI

TINY = tiny(32, 16, "--patch-size", "4")


def test_classify_cli_runs_the_recipes_and_refuses_bad_values(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", *TINY, "--epochs", "2", "--output-dir", str(out)]
    assert main([*argv, "--train-sizes", "12,16,20", "--pos-lr-scale", "0.5"]) == 0
    assert all(isinstance(r["size"], float | int) for r in _train_log(out))
    assert (
        main([*argv, "--progressive-sizes", "12,16", "--freeze-pos", "--output-dir", str(tmp_path / "p")])
        == 0
    )
    assert [r["size"] for r in _train_log(tmp_path / "p")] == [12, 16]
    bad = [*argv, "--output-dir", str(tmp_path / "bad")]  # a fresh folder: the run above finished in out
    capsys.readouterr()
    err = one_line_error(capsys, main([*bad, "--progressive-sizes", "12,16", "--progressive-epochs", "1,2"]))
    assert err == "error: stages sum to 3, not --epochs 2: --progressive-epochs 1,2"
    err = one_line_error(capsys, main([*bad, "--train-sizes", "12", "--progressive-sizes", "12,16"]))
    assert err == "error: choose one of --train-sizes and --progressive-sizes: --train-sizes"
    err = one_line_error(capsys, main([*bad, "--train-sizes", "12,x"]), 2)
    assert "argument --train-sizes: expected comma-separated image sides in 1..4096, got '12,x'" in err
    err = one_line_error(capsys, main([*bad, "--pos-lr-scale", "0"]), 2)
    assert "argument --pos-lr-scale: expected a number > 0" in err


def test_detr_train_has_no_size_recipe_flags():
    from peg_detr.cli import build_train_parser

    # DETR's --train-sizes is its per-image multi-scale resize (dest train_scales), not the engine's recipe
    dests = {a.dest for a in build_train_parser()._actions}
    assert not dests & {"train_sizes", "progressive_sizes", "freeze_pos", "pos_lr_scale"}


def test_video_cli_multiscale_and_freeze(tmp_path, capsys):
    from peg_video.__main__ import main as video_main
    from tests.video.runs import TINY as VIDEO_TINY
    from tests.video.runs import synthetic_set

    data = synthetic_set(tmp_path / "syn", num_train=4, num_val=2)
    argv = ["train", "--train-ann", str(data / "train.csv"), "--val-ann", str(data / "val.csv"), *VIDEO_TINY,
            "--epochs", "1", "--eval-every", "0"]  # fmt: skip
    out = tmp_path / "v"
    assert video_main([*argv, "--output-dir", str(out), "--train-sizes", "16,24", "--freeze-pos",
                       "--model-opt", "depth=1", "--pos-enc", "learned"]) == 0  # fmt: skip
    ckpt = read_checkpoint(out / "checkpoint.pth", "video")
    assert _train_log(out)[0]["size"] in (16, 20, 24)
    from peg_video.model import build_model as build_video

    names = [n for n, _ in build_video(ckpt["model_config"]).named_parameters()]
    in_optimizer = sum(len(g["params"]) for g in ckpt["optimizer"]["param_groups"])
    assert in_optimizer == len(names) - 2  # all but the frozen spatial and temporal tables
    capsys.readouterr()
    err = one_line_error(
        capsys, video_main([*argv, "--output-dir", str(tmp_path / "bad"), "--train-sizes", "20"])
    )
    assert err == "error: sizes must be multiples of the tubelet (2, 8, 8): --train-sizes 20"
