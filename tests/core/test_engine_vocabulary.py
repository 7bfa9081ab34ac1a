"""The shared knob vocabulary (peg_core.engine.cli), resolve_peg_at and the shared optimiser pieces."""

from __future__ import annotations

import argparse
import math

import pytest
import torch
from torch import nn

from peg_core.engine import (
    add_make_data_counts,
    add_num_heads_arg,
    add_pos_args,
    param_groups,
    peg_kwargs,
    warmup_cosine,
)
from peg_core.peg import resolve_peg_at
from peg_core.registry import EncodingSupport


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_pos_args(p, EncodingSupport("a test family", 2, slots=("table", "conditional"), combos=()))
    add_num_heads_arg(p, aliases=["--nheads"])
    add_make_data_counts(p, num_train=5, num_val=3, aliases=[("--n-train", "--n-val")])
    return p


def test_pos_group_parses_and_forwards_only_set_values():
    a = _parser().parse_args(
        ["--pos-enc", "peg", "--peg-at=-1,2", "--peg-kernel-size", "5", "--no-peg-separable"]
    )
    assert a.peg_at == [-1, 2]
    assert peg_kwargs(a) == {"peg_at": [-1, 2], "peg_kernel_size": 5, "peg_separable": False}
    assert _parser().parse_args(["--peg-at", "all"]).peg_at == "all"


@pytest.mark.parametrize(
    "bad",
    [
        ["--peg-kernel-size", "4"],
        ["--peg-at", "x"],
        ["--peg-padding", "reflect"],
        ["--pos-enc", "rope-axial"],
        ["--pos-enc", "peg+sine"],
    ],
)
def test_pos_group_rejects_bad_values(bad, capsys):
    with pytest.raises(SystemExit):
        _parser().parse_args(bad)


def test_hidden_aliases_keep_the_default_and_stay_out_of_help():
    p = _parser()
    a = p.parse_args([])
    assert (a.num_train, a.num_val, a.num_heads) == (5, 3, None)  # an alias does not overwrite defaults
    a = p.parse_args(["--n-train", "7", "--nheads", "2"])
    assert (a.num_train, a.num_val, a.num_heads) == (7, 3, 2)
    text = p.format_help()
    assert "--num-train" in text and "--n-train" not in text and "--nheads" not in text


def test_resolve_peg_at_one_meaning():
    assert resolve_peg_at("all", 4) == (0, 1, 2, 3)
    assert resolve_peg_at([2, -1, 2], 4) == (-1, 2)
    with pytest.raises(ValueError, match=r"outside -1 \(before block 0\) \.\. 3"):
        resolve_peg_at([4], 4)
    with pytest.raises(ValueError, match="at least one"):
        resolve_peg_at([], 4)
    with pytest.raises(ValueError, match="'all' or block indices"):
        resolve_peg_at("every", 4)


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Linear(3, 3)
        self.head = nn.Linear(3, 2)
        self.norm = nn.LayerNorm(2)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, 2))
        self.frozen = nn.Linear(2, 2).requires_grad_(False)

    def no_weight_decay(self) -> set[str]:
        return {"cls_token"}


def test_param_groups_exempt_norms_biases_and_named():
    net = _Net()
    groups = param_groups(net, 0.05)
    assert [g["name"] for g in groups] == ["main", "main_no_decay"]
    decayed = {id(p) for p in groups[0]["params"]}
    assert decayed == {id(net.backbone.weight), id(net.head.weight)}
    assert groups[1]["weight_decay"] == 0.0 and len(groups[1]["params"]) == 5  # 2 biases, norm w+b, cls
    assert all(id(p) not in decayed | {id(q) for q in groups[1]["params"]} for p in net.frozen.parameters())


def test_param_groups_backbone_lr_and_decay_all():
    net = _Net()
    groups = param_groups(net, 1e-4, decay_1d=True, lr_by_prefix={"backbone.": 1e-5})
    assert [(g["name"], g.get("lr"), g["weight_decay"]) for g in groups] == [
        ("main", None, 1e-4),
        ("main_no_decay", None, 0.0),  # no_weight_decay() names stay undecayed even so
        ("backbone", 1e-5, 1e-4),
    ]
    assert groups[1]["params"] == [net.cls_token]
    assert len(groups[0]["params"]) == 4 and len(groups[2]["params"]) == 2  # biases and norms decayed


def test_warmup_cosine_closed_form():
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = warmup_cosine(opt, warmup_steps=2, total_steps=6, min_ratio=0.1)
    lrs = []
    for _ in range(7):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    expected = [0.5, 1.0] + [0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * k / 4)) for k in range(4)] + [0.1]
    assert lrs == pytest.approx(expected)
