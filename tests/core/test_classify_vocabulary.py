"""The classifier's shared flag names (old spellings as hidden aliases), ``train --init`` and old checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from peg_core import resize_pos_embed
from peg_core.__main__ import main
from peg_core.classify.cli import (
    build_eval_parser,
    build_make_data_parser,
    build_train_parser,
    parse_train_args,
)
from peg_core.classify.model import (
    apply_init_state,
    build_model,
    load_init_weights,
    model_config_from_args,
    stored_args,
)
from peg_core.engine import UserError, read_checkpoint
from tests.core.classify_runs import (
    keep_threads,  # noqa: F401 (autouse: restores torch's threads)
    no_peg,
    one_line_error,
    tiny,
)

#: one epoch of the tiny CPVT on 16 training and 8 validation shapes
TINY = tiny(16, 8, "--epochs", "1")
SMALL = {"arch": "demo", "embed_dim": 16, "depth": 1, "num_heads": 2, "num_classes": 12, "peg_at": [0]}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """The checkpoint of one tiny training run (learned table, so ``--init`` has a table to resize)."""
    out = tmp_path_factory.mktemp("run")
    assert main(["train", *no_peg(TINY), "--pos-enc", "learned", "--output-dir", str(out)]) == 0
    return out / "checkpoint.pth"


# ----------------------------------------------------------------------------------- flag names


def test_old_train_spellings_parse_to_the_same_namespace_and_model():
    # --pos-enc learned: --pos-interpolation (old: --mode) resizes its table (without one it is refused)
    new = ["--data-root", "d", "--num-train", "40", "--num-val", "20", "--pos-interpolation", "nearest",
           "--arch", "demo", "--num-heads", "2", "--pos-enc", "learned"]  # fmt: skip
    old = ["--data", "d", "--n-train", "40", "--n-val", "20", "--mode", "nearest",
           "--arch", "demo", "--num-heads", "2", "--pos-enc", "learned"]  # fmt: skip
    a, b = parse_train_args(new), parse_train_args(old)
    assert vars(a) == vars(b)
    assert (a.data_root, a.num_train, a.num_val, a.pos_interpolation) == (Path("d"), 40, 20, "nearest")
    torch.manual_seed(0)
    ma = build_model(model_config_from_args(a, 12))
    torch.manual_seed(0)
    mb = build_model(model_config_from_args(b, 12))
    sa, sb = ma.state_dict(), mb.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    # the aliases stay out of -h; the new names are in it
    text = build_train_parser().format_help()
    assert "--data-root" in text and "--num-train" in text and "--n-train" not in text
    assert "--mode" not in text and "--data " not in text


def test_old_eval_and_make_data_spellings():
    ev_new = build_eval_parser().parse_args(["--checkpoint", "c", "--data-root", "d", "--num-val", "8",
                                             "--pos-interpolation", "area"])  # fmt: skip
    ev_old = build_eval_parser().parse_args(
        ["--checkpoint", "c", "--data", "d", "--n-val", "8", "--mode", "area"]
    )
    assert vars(ev_new) == vars(ev_old)
    assert (ev_new.data_root, ev_new.num_val, ev_new.pos_interpolation) == (Path("d"), 8, "area")
    md_new = build_make_data_parser().parse_args(["out", "--num-train", "3", "--num-val", "2"])
    md_old = build_make_data_parser().parse_args(["out", "--n-train", "3", "--n-val", "2"])
    assert vars(md_new) == vars(md_old) and (md_new.num_train, md_new.num_val) == (3, 2)
    defaults = build_make_data_parser().parse_args(["out"])
    assert (defaults.num_train, defaults.num_val, defaults.img_size) == (2048, 512, 48)


def test_peg_group_and_recipe_names():
    args = parse_train_args(["--config", "demo_quick"])
    assert (args.num_train, args.num_val, args.epochs, args.pos_enc) == (512, 512, 2, "peg")
    args = parse_train_args(["--peg-at", "all", "--peg-dynamic", "--peg-num-kernels", "2", "--peg-padding",
                             "replicate"])  # fmt: skip
    cfg = model_config_from_args(args, 12)
    assert (cfg["peg_at"], cfg["peg_dynamic"], cfg["peg_num_kernels"], cfg["peg_padding"]) == (
        "all", True, 2, "replicate",
    )  # fmt: skip
    assert build_model(cfg).peg_at == (0, 1, 2, 3)  # "all": after every block of the demo's 4


# --------------------------------------------------------------------------------------- --init


def _same_weights(model: torch.nn.Module, state: dict) -> bool:
    return all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def _learned(img_size: int = 16, **kw) -> torch.nn.Module:
    return build_model({**SMALL, "pos_enc": "learned", "img_size": img_size, **kw})


def test_init_from_a_checkpoint_a_bare_pth_and_safetensors(trained, tmp_path):
    from safetensors.torch import save_file

    state = read_checkpoint(trained, "classify")["model"]
    bare, st = tmp_path / "bare.pth", tmp_path / "w.safetensors"
    torch.save({f"module.{k}": v for k, v in state.items()}, bare)  # a DDP-prefixed bare state dict
    save_file({k: v.contiguous() for k, v in state.items()}, str(st))
    for path in (trained, bare, st):
        model = _learned()
        report = load_init_weights(model, path)
        assert (len(report.copied), report.missing, report.skipped) == (len(state), [], {}), path
        assert _same_weights(model, state), path
    assert (
        report.line() == f"{len(state)} copied, 0 converted, 0 source keys skipped, 0 model keys left at init"
    )


def test_init_in_train_prints_the_report_and_starts_from_the_weights(trained, tmp_path, capsys):
    out = tmp_path / "ft"
    assert main(["train", *no_peg(TINY), "--pos-enc", "learned", "--init", str(trained), "--lr", "1e-9",
                 "--output-dir", str(out)]) == 0  # fmt: skip
    n = len(read_checkpoint(trained, "classify")["model"])
    assert f"--init {trained}: {n} copied, 0 converted, 0 source keys skipped, 0 model keys left at init" in (
        capsys.readouterr().out
    )
    before = read_checkpoint(trained, "classify")["model"]
    after = read_checkpoint(out / "checkpoint.pth", "classify")["model"]
    # lr 1e-9 (times the warm-up): the weights barely move from the starting ones
    assert all(torch.allclose(after[k], before[k], atol=1e-6) for k in before)
    assert read_checkpoint(out / "checkpoint.pth", "classify")["args"]["init"] == str(trained)


def test_init_resizes_a_table_of_another_grid_and_counts_missing_and_unexpected(tmp_path):
    torch.manual_seed(0)
    src = _learned(16)  # 2x2 grid + class token: (1, 5, 16)
    state = {**src.state_dict(), "head_dist.weight": torch.zeros(2)}  # a distilled DeiT's second head
    del state["norm.bias"]
    model = _learned(32)  # 4x4 grid: (1, 17, 16)
    report = apply_init_state(model, state)
    table = state["pos_enc.pos_embed"]
    assert report.converted == {"pos_enc.pos_embed": "resized (1, 5, 16) -> (1, 17, 16)"}
    assert (report.missing, list(report.skipped)) == (["norm.bias"], ["head_dist.weight"])
    expected = resize_pos_embed(table, (4, 4), num_prefix_tokens=1, mode="bicubic")
    torch.testing.assert_close(model.pos_enc.pos_embed.detach(), expected, rtol=0, atol=0)
    assert report.line().endswith(
        "1 converted, 1 source keys skipped, 1 model keys left at init; converted pos_enc.pos_embed: resized "
        "(1, 5, 16) -> (1, 17, 16); skipped head_dist.weight: the model has no such key (another head)"
    )


def test_init_refuses_weights_the_model_has_no_place_for():
    """Layer scale of a converted timm ViT (or another depth) in a plain CPVT: refused, not dropped."""
    state = {**_learned(16).state_dict(), "blocks.0.ls1.gamma": torch.ones(16)}
    with pytest.raises(
        ValueError, match=r"1 tensors of the file have no place in the model \(blocks.0.ls1.gamma\)"
    ):
        apply_init_state(_learned(16), state)


def test_init_leaves_out_a_head_of_another_number_of_classes():
    src = _learned(16, num_classes=1000)
    model = _learned(16)
    head = model.head.weight.detach().clone()
    report = apply_init_state(model, src.state_dict())
    assert sorted(report.missing) == ["head.bias", "head.weight"] == sorted(report.skipped)
    assert (
        report.skipped["head.weight"]
        == "shape (1000, 16), the model's is (12, 16) (another number of classes)"
    )
    assert torch.equal(model.head.weight, head)
    assert torch.equal(model.blocks[0].attn.qkv.weight, src.blocks[0].attn.qkv.weight)


def test_init_shape_mismatch_is_one_line_naming_key_and_shapes(tmp_path, capsys):
    wide = tmp_path / "wide.pth"
    torch.save(build_model({**SMALL, "embed_dim": 32, "img_size": 16}).state_dict(), wide)
    code = main(["train", *TINY, "--init", str(wide), "--output-dir", str(tmp_path / "r")])
    err = one_line_error(capsys, code)
    assert err == (
        "error: --init does not fit the model (cls_token is (1, 1, 32) in the file, (1, 1, 16) in the "
        f"model): {wide}"
    )


def test_init_refuses_missing_files_and_other_tasks(tmp_path, capsys):
    err = one_line_error(capsys, main(["train", *TINY, "--init", str(tmp_path / "nope.pth"),
                                        "--output-dir", str(tmp_path / "r")]))  # fmt: skip
    assert err == f"error: --init weights not found: {tmp_path / 'nope.pth'}"
    assert not (tmp_path / "r").exists()  # refused before the output folder is made
    detr = tmp_path / "detr.pth"
    torch.save({"format": "peg-checkpoint/1", "task": "detect", "model": {"w": torch.zeros(1)}}, detr)
    with pytest.raises(UserError, match="--init needs classifier weights; this is a 'detect' checkpoint"):
        load_init_weights(_learned(), detr)


# ------------------------------------------------------------------------------ old checkpoints


def _with_old_names(ckpt: dict, meta_data: bool) -> dict:
    """``ckpt`` as written before the shared vocabulary: args ``data``/``n_train``/``n_val``, meta ``n_val``."""
    args = dict(ckpt["args"])
    for new, old in (("data_root", "data"), ("num_train", "n_train"), ("num_val", "n_val")):
        args[old] = args.pop(new)
    meta = dict(ckpt["meta"])
    data = {("n_val" if k == "num_val" else k): v for k, v in meta.pop("data").items()}
    if meta_data:
        meta["data"] = data
    return {**ckpt, "args": args, "meta": meta}


def test_stored_args_map_the_old_names():
    old = {"args": {"data": "d", "n_train": 4, "n_val": 2, "seed": 1}}
    assert stored_args(old) == {"data_root": "d", "num_train": 4, "num_val": 2, "seed": 1}
    assert stored_args({"args": {"n_val": 2, "num_val": 3}}) == {"num_val": 3}
    assert stored_args({}) == {}


@pytest.mark.parametrize("meta_data", [True, False], ids=["meta-n_val", "args-only"])
def test_old_args_checkpoints_still_evaluate(trained, tmp_path, meta_data):
    ckpt = read_checkpoint(trained, "classify")
    assert ckpt["meta"]["data"]["num_val"] == 8 and ckpt["args"]["num_val"] == 8
    old = tmp_path / "old.pth"
    torch.save(_with_old_names(ckpt, meta_data), old)
    assert main(["eval", "--checkpoint", str(old), "--eval-sizes", "16", "--no-progress", "--device", "cpu",
                 "--output-dir", str(tmp_path / "ev")]) == 0  # fmt: skip
    ev = json.loads((tmp_path / "ev" / "report.json").read_text())["eval"]
    # the training run's 8 validation scenes (not the default 512), the same number as the run's
    assert ev["samples"] == 8 and ev["top1"] == ckpt["metrics"]["top1"]


def test_init_keeps_the_head_rows_of_classes_shared_by_name():
    """A classify checkpoint's classes and the run's known: shared names keep their head rows, others start fresh."""
    torch.manual_seed(0)
    src = _learned(16, num_classes=4)
    torch.manual_seed(1)
    model = _learned(16, num_classes=3)
    fresh = model.head.weight.detach().clone()
    report = apply_init_state(
        model, src.state_dict(), classes=["Cat", "zebra", "auto"], start_classes=["dog", "cat", "car", "bird"],
        class_map={"auto": "car"},
    )  # fmt: skip
    assert report.classes.kept == [(0, 1), (2, 2)] and report.classes.fresh == [1]
    assert torch.equal(model.head.weight[0], src.head.weight[1]) and torch.equal(
        model.head.bias[2], src.head.bias[2]
    )
    assert torch.equal(model.head.weight[1], fresh[1])  # zebra: the model's own initialisation
    assert "head.weight" in report.converted and "head.weight" not in report.missing
    assert "kept 2 of 3 classes by name (Cat, auto <- car); 1 start fresh (zebra)" in report.line()
