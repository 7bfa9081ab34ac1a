"""Layer-wise lr decay in ``peg_core.engine.param_groups``: the groups, the schedule, resume, the flag."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch import nn

from peg_core.engine import (
    LayerDecayModel,
    UserError,
    layer_lr_scale,
    param_groups,
    param_groups_for_run,
    read_checkpoint,
    warmup_cosine,
)
from peg_core.engine.recipes import apply_position_recipe
from peg_core.models import CPVT
from peg_core.models.layers import vit_lr_layer_id
from peg_video.models.vit import VideoTransformer
from tests.core.classify_runs import (
    keep_threads,  # noqa: F401 (autouse: restores torch's threads)
    one_line_error,
    tiny,
)


class _TwoBlocks(nn.Module):
    """The smallest ViT-shaped model: embed, two blocks, norm, head (names as CPVT's)."""

    def __init__(self) -> None:
        super().__init__()
        self.patch_embed = nn.Linear(4, 3)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, 3))
        self.blocks = nn.ModuleList(nn.Linear(3, 3) for _ in range(2))
        self.norm = nn.LayerNorm(3)
        self.head = nn.Linear(3, 2)

    def no_weight_decay(self) -> set[str]:
        return {"cls_token"}

    def num_lr_layers(self) -> int:
        return len(self.blocks)

    def lr_layer_id(self, name: str) -> int:
        return vit_lr_layer_id(name, len(self.blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 4) -> (B, 2)
        x = self.patch_embed(x) + self.cls_token[0]
        for blk in self.blocks:
            x = x + blk(x)
        return self.head(self.norm(x))


def _named(groups):
    """``[(name, lr, lr_scale, weight_decay, [param names])]`` of ``groups`` of a :class:`_TwoBlocks`."""
    return [(g["name"], g.get("lr"), g.get("lr_scale"), g["weight_decay"], [_NAMES[id(p)] for p in g["params"]])
            for g in groups]  # fmt: skip


_MODEL = _TwoBlocks()
_NAMES = {id(p): n for n, p in _MODEL.named_parameters()}


def test_two_block_model_groups_by_hand():
    """lr 1, decay 0.5: head 1, block 1 (layer 2) 0.5, block 0 (layer 1) 0.25, embeddings 0.125."""
    assert isinstance(_MODEL, LayerDecayModel)
    groups = param_groups(_MODEL, 0.05, layer_decay=0.5, lr=1.0)
    assert _named(groups) == [
        ("layer_3", 1.0, 1.0, 0.05, ["head.weight"]),
        ("layer_3_no_decay", 1.0, 1.0, 0.0, ["norm.weight", "norm.bias", "head.bias"]),
        ("layer_2", 0.5, 0.5, 0.05, ["blocks.1.weight"]),
        ("layer_2_no_decay", 0.5, 0.5, 0.0, ["blocks.1.bias"]),
        ("layer_1", 0.25, 0.25, 0.05, ["blocks.0.weight"]),
        ("layer_1_no_decay", 0.25, 0.25, 0.0, ["blocks.0.bias"]),
        ("layer_0", 0.125, 0.125, 0.05, ["patch_embed.weight"]),
        ("layer_0_no_decay", 0.125, 0.125, 0.0, ["cls_token", "patch_embed.bias"]),
    ]
    # VideoMAE's SSv2 ViT-S value at lr 1e-3: 0.7 ** (L + 1 - layer id)
    lrs = [g["lr"] for g in param_groups(_MODEL, 0.05, layer_decay=0.7, lr=1e-3)[::2]]
    assert lrs == pytest.approx([1e-3, 7e-4, 4.9e-4, 3.43e-4], rel=1e-12)
    assert layer_lr_scale(0, 2, 0.7) == pytest.approx(0.343, rel=1e-12)


def test_layer_decay_off_keeps_the_old_groups_exactly():
    """No layer decay: the pre-layer-decay layout (names, order, members in named_parameters order, no lr keys)."""
    expected = [
        ("main", None, None, 0.05, ["patch_embed.weight", "blocks.0.weight", "blocks.1.weight", "head.weight"]),
        ("main_no_decay", None, None, 0.0,
         ["cls_token", "patch_embed.bias", "blocks.0.bias", "blocks.1.bias", "norm.weight", "norm.bias", "head.bias"]),
    ]  # fmt: skip
    assert _named(param_groups(_MODEL, 0.05)) == expected
    assert _named(param_groups(_MODEL, 0.05, layer_decay=None, lr=1e-3)) == expected
    assert all(set(g) == {"name", "params", "weight_decay"} for g in param_groups(_MODEL, 0.05, lr=1e-3))


def test_layer_decay_with_a_prefix_lr():
    """A prefix's groups decay from the prefix's lr, after the main ones."""
    groups = param_groups(_MODEL, 0.05, layer_decay=0.5, lr=1.0, lr_by_prefix={"blocks.": 0.1})
    names = [(n, lr) for n, lr, *_ in _named(groups)]
    assert names == [("layer_3", 1.0), ("layer_3_no_decay", 1.0), ("layer_0", 0.125), ("layer_0_no_decay", 0.125),
                     ("blocks_layer_2", 0.05), ("blocks_layer_2_no_decay", 0.05), ("blocks_layer_1", 0.025),
                     ("blocks_layer_1_no_decay", 0.025)]  # fmt: skip


def test_schedule_keeps_the_layer_ratios():
    """warmup_cosine multiplies every group's own lr by one factor: the ratios stay lr_scale."""
    model = copy.deepcopy(_MODEL)
    opt = torch.optim.AdamW(param_groups(model, 0.05, layer_decay=0.7, lr=1e-3), lr=1e-3)
    sched = warmup_cosine(opt, warmup_steps=2, total_steps=8, min_ratio=0.01)
    x = torch.randn(5, 4)
    for step in range(5):
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        sched.step()
        head = opt.param_groups[0]["lr"]
        assert head == pytest.approx(1e-3 * sched.lr_lambdas[0](step + 1), rel=1e-12)
        for g in opt.param_groups:
            assert g["lr"] == pytest.approx(head * g["lr_scale"], rel=1e-12), (step, g["name"])
            assert g["initial_lr"] == pytest.approx(1e-3 * g["lr_scale"], rel=1e-12)


def test_resume_of_a_layer_decay_run_is_exact():
    """3 steps, save, rebuild, load, 2 more steps == 5 steps straight (parameters bit-identical)."""
    torch.manual_seed(0)
    start = _TwoBlocks()
    x = torch.randn(5, 4)

    def build(model):
        opt = torch.optim.AdamW(param_groups(model, 0.05, layer_decay=0.75, lr=1e-2), lr=1e-2)
        return opt, warmup_cosine(opt, 2, 5)

    def run(model, opt, sched, steps):
        for _ in range(steps):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
            sched.step()

    straight = copy.deepcopy(start)
    run(straight, *build(straight), 5)
    first = copy.deepcopy(start)
    opt, sched = build(first)
    run(first, opt, sched, 3)
    saved = copy.deepcopy((first.state_dict(), opt.state_dict(), sched.state_dict()))
    resumed = _TwoBlocks()
    resumed.load_state_dict(saved[0])
    opt2, sched2 = build(resumed)
    opt2.load_state_dict(saved[1])
    sched2.load_state_dict(saved[2])
    assert [g["lr"] for g in opt2.param_groups] == [g["lr"] for g in opt.param_groups]
    run(resumed, opt2, sched2, 2)
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name


def test_position_recipe_scales_within_each_layer():
    """--pos-lr-scale on top of layer decay: a PEG's lr = its layer's lr x the scale."""
    model = CPVT(img_size=16, patch_size=8, embed_dim=16, depth=2, num_heads=2, num_classes=3, pos_enc="peg",
                 peg_at=[-1, 1])  # fmt: skip
    opt = torch.optim.AdamW(param_groups(model, 0.05, layer_decay=0.5, lr=1.0), lr=1.0)
    apply_position_recipe(opt, model, lr_scale=0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    pos = {names[id(p)]: g["lr"] for g in opt.param_groups if g.get("position") for p in g["params"]}
    # pos_blocks.-1 is before block 0 (layer 0: 0.125); pos_blocks.1 follows block 1 (layer 2: 0.5)
    assert pos == pytest.approx({"pos_blocks.-1.proj.weight": 0.0125, "pos_blocks.-1.proj.bias": 0.0125,
                                 "pos_blocks.1.proj.weight": 0.05, "pos_blocks.1.proj.bias": 0.05})  # fmt: skip


def test_cpvt_and_video_transformer_layer_ids():
    cpvt = CPVT(img_size=16, patch_size=8, embed_dim=16, depth=2, num_heads=2, num_classes=3,
                pos_enc="peg+rope-mixed", num_reg_tokens=1, global_pool="token")  # fmt: skip
    ids = {n: cpvt.lr_layer_id(n) for n, _ in cpvt.named_parameters()}
    assert cpvt.num_lr_layers() == 2
    assert {n: i for n, i in ids.items() if not n.startswith("blocks.")} == {
        "cls_token": 0, "reg_token": 0, "patch_embed.proj.weight": 0, "patch_embed.proj.bias": 0,
        "pos_blocks.0.proj.weight": 1, "pos_blocks.0.proj.bias": 1, "rope.freqs": 0,
        "norm.weight": 3, "norm.bias": 3, "head.weight": 3, "head.bias": 3,
    }  # fmt: skip
    assert {i for n, i in ids.items() if n.startswith("blocks.1.")} == {2}
    video = VideoTransformer(num_classes=3, num_frames=4, img_size=16, tubelet=(2, 8, 8), embed_dim=16, depth=2,
                             num_heads=2, pos_enc="peg3d", peg_at=[-1, 0], global_pool="attentive",
                             pool_depth=1)  # fmt: skip
    vids = {n: video.lr_layer_id(n) for n, _ in video.named_parameters()}
    assert vids["pos_blocks.-1.proj.weight"] == 0 and vids["pos_blocks.0.proj.weight"] == 1
    assert vids["blocks.1.attn.qkv.weight"] == 2 and vids["pool.query"] == 3 and vids["head.weight"] == 3
    assert min(vids.values()) == 0 and max(vids.values()) == 3


def test_bad_values_and_models_without_layer_ids():
    for bad in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError, match=r"layer_decay must be in \(0, 1\]"):
            param_groups(_MODEL, 0.05, layer_decay=bad, lr=1e-3)
    with pytest.raises(ValueError, match="needs the base lr"):
        param_groups(_MODEL, 0.05, layer_decay=0.7)
    with pytest.raises(
        TypeError, match=r"Linear has no layer ids: it needs num_lr_layers\(\) and lr_layer_id\(name\)"
    ):
        param_groups(nn.Linear(2, 2), 0.05, layer_decay=0.7, lr=1e-3)
    args = type("Args", (), {"weight_decay": 0.05, "lr": 1e-3, "layer_decay": 0.7})()
    with pytest.raises(UserError) as e:
        param_groups_for_run(nn.Linear(2, 2), args)
    assert (
        e.value.line().startswith("error: cannot apply layer-wise lr decay (")
        and "--layer-decay 0.7" in e.value.line()
    )
    with pytest.raises(ValueError, match=r"no layer-wise lr decay layer for parameter 'extra\.weight'"):
        vit_lr_layer_id("extra.weight", 2)


# ------------------------------------------------------------------- python -m peg_core train (classify)


def _classify(out, *extra: str) -> int:
    from peg_core.__main__ import main

    return main(["train", *tiny(16, 8), "--depth", "2", "--output-dir", str(out), *extra])


def test_classify_train_with_layer_decay(tmp_path, capsys):
    """One CLI epoch with --layer-decay 0.7: the checkpoint's groups decay by layer; resuming without
    the flag or with another value is a one-line error naming both, with it the run continues."""
    run = tmp_path / "run"
    assert _classify(run, "--epochs", "2", "--layer-decay", "0.7", "--stop-after-epoch", "1") == 0
    ckpt = read_checkpoint(run / "checkpoint.pth", "classify")
    groups = ckpt["optimizer"]["param_groups"]
    # depth 2, a PEG after block 0: layers 3 (head) .. 0, each with decayed and undecayed parameters
    assert [g["name"] for g in groups] == [f"layer_{i}{s}" for i in (3, 2, 1, 0) for s in ("", "_no_decay")]
    lr = json.loads((run / "args.json").read_text())["lr"]
    assert [g["initial_lr"] for g in groups[::2]] == pytest.approx(
        [lr, lr * 0.7, lr * 0.49, lr * 0.343], rel=1e-12
    )
    assert [g["lr"] / g["initial_lr"] for g in groups] == pytest.approx([groups[0]["lr"] / lr] * 8, rel=1e-12)
    capsys.readouterr()
    refused = (
        "error: --resume continues a run trained with --layer-decay 0.7; another value would change its "
        "recipe (give the run's value, or start a new run)"
    )
    err = one_line_error(capsys, _classify(run, "--epochs", "2", "--resume", "auto"))
    assert err == f"{refused}: no --layer-decay"
    err = one_line_error(capsys, _classify(run, "--epochs", "2", "--layer-decay", "0.5", "--resume", "auto"))
    assert err == f"{refused}: --layer-decay 0.5"
    assert read_checkpoint(run / "checkpoint.pth", "classify")["epoch"] == 0  # nothing trained
    assert _classify(run, "--epochs", "2", "--layer-decay", "0.7", "--resume", "auto") == 0
    assert read_checkpoint(run / "checkpoint.pth", "classify")["epoch"] == 1


@pytest.mark.parametrize("value", ["0", "-0.1", "1.01", "x"])
def test_classify_bad_layer_decay_is_a_one_line_error(tmp_path, capsys, value):
    err = one_line_error(capsys, _classify(tmp_path / "bad", "--layer-decay", value), 2)
    assert err.startswith(f"error: python -m peg_core train: argument --layer-decay: expected a layer decay in "
                          f"(0, 1], got '{value}'")  # fmt: skip
