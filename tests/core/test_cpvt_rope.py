"""CPVT with rotary encodings: the new pos_enc values, '+' combinations, keys, weight decay, the command line."""

from __future__ import annotations

import json
import re

import pytest
import torch

from peg_core.__main__ import main as classify_main
from peg_core.classify.cli import build_train_parser
from peg_core.models import CPVT
from peg_core.models.cpvt import CPVT_ENCODINGS
from peg_core.registry import parse_pos_enc
from tests.core.classify_runs import keep_threads, no_peg, tiny  # noqa: F401 (autouse: restores torch's threads)

SMALL = {"embed_dim": 64, "depth": 2, "num_heads": 4, "num_classes": 5, "img_size": 32, "patch_size": 8}
ROPE_VALUES = [
    *(r for r in ("rope-axial", "rope-mixed", "rope-dinov3")),
    *(f"{a}+{r}" for a in ("peg", "learned") for r in ("rope-axial", "rope-mixed", "rope-dinov3")),
]


def test_pos_encodings_list_the_rotary_variants():
    assert {"rope-axial", "rope-mixed", "rope-dinov3"} <= set(CPVT_ENCODINGS.names())
    for v in ROPE_VALUES:
        CPVT_ENCODINGS.check(parse_pos_enc(v))
    spec = parse_pos_enc("peg+learned+rope-mixed", CPVT_ENCODINGS)
    assert (spec.table.name, spec.conditional.name, spec.rotary.name) == ("learned", "peg", "rope-mixed")
    for bad in (
        "rope-foo",
        "learned+sincos",
        "rope-axial+rope-mixed",
        "none+peg",
        "peg+peg",
        "peg3d",
        "rope-3d",
    ):
        with pytest.raises(ValueError, match=re.escape(bad)):
            CPVT(**SMALL, pos_enc=bad)


def test_cli_offers_the_rotary_variants():
    parser = build_train_parser()
    action = next(a for a in parser._actions if a.dest == "pos_enc")
    assert all(v in action.help for v in ("rope-axial", "rope-mixed", "rope-dinov3"))
    for v in ROPE_VALUES:
        assert action.type(v) == v
    with pytest.raises(SystemExit):
        parser.parse_args(["--data-root", "x", "--pos-enc", "rope-axial+rope-mixed"])


@pytest.mark.parametrize("pos_enc", ROPE_VALUES)
def test_rope_cpvt_runs_at_several_sizes(pos_enc):
    torch.manual_seed(0)
    model = CPVT(**SMALL, pos_enc=pos_enc, global_pool="token").eval()
    for h, w in ((32, 32), (40, 24), (17, 33)):
        assert model(torch.randn(2, 3, h, w)).shape == (2, 5)
    keys = set(model.state_dict())
    assert ("rope.freqs" in keys) == ("mixed" in pos_enc)
    assert ("pos_enc.pos_embed" in keys) == ("learned" in pos_enc)
    assert any(k.startswith("pos_blocks.0.") for k in keys) == pos_enc.startswith("peg")


def test_rope_changes_the_output_and_plain_keys_stay():
    torch.manual_seed(0)
    plain = CPVT(**SMALL, pos_enc="none")
    rope = CPVT(**SMALL, pos_enc="rope-axial")
    assert set(plain.state_dict()) == set(rope.state_dict())  # fixed frequencies: no new keys
    rope.load_state_dict(plain.state_dict())
    x = torch.randn(2, 3, 32, 32)
    assert not torch.allclose(plain.eval()(x), rope.eval()(x))


def test_mixed_frequencies_are_exempt_from_weight_decay_and_train():
    from peg_core.engine.optim import param_groups

    model = CPVT(**SMALL, pos_enc="peg+rope-mixed", num_reg_tokens=2, global_pool="token")
    assert {"rope.freqs", "reg_token", "cls_token"} <= model.no_weight_decay()
    assert model.rope.freqs.shape == (2, 2, 4, 8)
    groups = param_groups(model, weight_decay=0.05)
    no_decay = next(g for g in groups if g["weight_decay"] == 0.0)["params"]
    assert any(p is model.rope.freqs for p in no_decay)
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    assert model.rope.freqs.grad.abs().sum() > 0


def test_registers_layer_scale_and_fc_norm_keys():
    model = CPVT(**SMALL, pos_enc="rope-dinov3", num_reg_tokens=4, init_values=1e-5, qkv_bias=False,
                 norm_eps=1e-5, fc_norm=True, global_pool="token")  # fmt: skip
    keys = set(model.state_dict())
    assert {"reg_token", "blocks.0.ls1.gamma", "blocks.1.ls2.gamma", "fc_norm.weight"} <= keys
    assert "blocks.0.attn.qkv.bias" not in keys and "norm.weight" not in keys
    assert model.num_prefix_tokens == 5 and model.rope.half
    assert model(torch.randn(1, 3, 24, 40)).shape == (1, 5)


def test_compile_fullgraph_cpvt_rope_mixed():
    torch._dynamo.reset()
    model = CPVT(**SMALL, pos_enc="peg+rope-mixed").eval()
    x = torch.randn(1, 3, 32, 24)
    explain = torch._dynamo.explain(model)(x)
    assert explain.graph_break_count == 0, explain.break_reasons


def test_export_cpvt_rope_at_a_second_size():
    model = CPVT(**SMALL, pos_enc="learned+rope-axial", global_pool="token").eval()
    h, w = torch.export.Dim("h", min=2, max=16), torch.export.Dim("w", min=2, max=16)
    ep = torch.export.export(model, (torch.randn(1, 3, 32, 32),), dynamic_shapes={"x": {2: 8 * h, 3: 8 * w}})
    x = torch.randn(1, 3, 48, 24)
    torch.testing.assert_close(ep.module()(x), model(x), atol=1e-5, rtol=1e-5)


def _tiny_for(pos_enc: str) -> list[str]:
    """The tiny model's flags; its ``--peg-at 0`` only where there is a PEG (train refuses it otherwise)."""
    return tiny(24, 12) if pos_enc.startswith("peg") else no_peg(tiny(24, 12))


@pytest.mark.parametrize(
    "pos_enc",
    ["rope-axial", "rope-mixed", "rope-dinov3", "peg+rope-mixed", "learned+rope-mixed", "peg+rope-axial"],
)
def test_cli_train_and_eval_at_several_sizes(tmp_path, pos_enc):
    run = tmp_path / "run"
    code = classify_main(
        ["train", *_tiny_for(pos_enc), "--epochs", "1", "--pos-enc", pos_enc, "--output-dir", str(run)]
    )
    assert code == 0
    code = classify_main(["eval", "--checkpoint", str(run / "checkpoint.pth"), "--eval-sizes", "16,24,32",
                          "--output-dir", str(tmp_path / "ev"), "--no-progress", "--device", "cpu"])  # fmt: skip
    assert code == 0
    ev = json.loads((tmp_path / "ev" / "report.json").read_text())
    assert list(ev["eval"]["top1_by_size"]) == ["16", "24", "32"]
