"""Checkpoint surgery: finding and resizing position tables, learned -> CPVT, file formats, the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from peg_core.__main__ import main as cli
from peg_core.interop import (
    WeightsError,
    learned_to_cpvt,
    read_state_file,
    resize_checkpoint,
    torchvision_vit_to_deit,
    write_state_file,
)
from peg_core.models import CPVT

ROOT = Path(__file__).resolve().parents[2]


def deit_like(grid: int = 14, dim: int = 8, distilled: bool = False) -> dict[str, torch.Tensor]:
    """timm DeiT layout: ``pos_embed (1, P + grid², C)``, ``cls_token`` (+ ``dist_token``), one block."""
    p = 2 if distilled else 1
    sd = {
        "cls_token": torch.randn(1, 1, dim),
        "pos_embed": torch.randn(1, p + grid * grid, dim),
        "patch_embed.proj.weight": torch.randn(dim, 3, 16, 16),
        "blocks.0.attn.qkv.weight": torch.randn(3 * dim, dim),
        "head.weight": torch.randn(10, dim),
    }
    if distilled:
        sd["dist_token"] = torch.randn(1, 1, dim)
        sd["head_dist.weight"] = torch.randn(10, dim)
    return sd


def small_cpvt(**kw) -> CPVT:
    cfg = {"embed_dim": 16, "depth": 2, "num_heads": 2, "patch_size": 8, "img_size": 32, "num_classes": 3}
    return CPVT(**{**cfg, **kw}).eval()


def test_deit_worked_example_nearest():
    sd = deit_like()
    new, change = resize_checkpoint(sd, (24, 24), mode="nearest")
    table = new["pos_embed"]
    assert table.shape == (1, 1 + 24 * 24, 8)
    torch.testing.assert_close(table[:, 0], sd["pos_embed"][:, 0])  # class token row untouched
    # 224 px / 16 -> 14x14, 384 px -> 24x24: the new patch (12, 12) takes the old (7, 7).
    torch.testing.assert_close(table[0, 1 + 12 * 24 + 12], sd["pos_embed"][0, 1 + 7 * 14 + 7])
    assert (change.key, change.old_grid, change.new_grid, change.num_prefix_tokens) == (
        "pos_embed",
        (14, 14),
        (24, 24),
        1,
    )
    assert change.old_shape == (1, 197, 8) and change.new_shape == (1, 577, 8)
    assert str(change) == (
        "pos_embed: (1, 197, 8) -> (1, 577, 8), grid 14x14 -> 24x24 (nearest), "
        "1 prefix token(s) kept (from cls_token)"
    )
    assert new["head.weight"] is sd["head.weight"] and sd["pos_embed"].shape == (1, 197, 8)  # input intact


def test_distilled_deit_two_prefix_tokens_non_square_target():
    sd = deit_like(grid=4, distilled=True)
    new, change = resize_checkpoint(sd, (6, 3), mode="bilinear")
    assert change.num_prefix_tokens == 2 and change.prefix_source == "from cls_token, dist_token"
    torch.testing.assert_close(new["pos_embed"][:, :2], sd["pos_embed"][:, :2])
    grid = sd["pos_embed"][:, 2:].reshape(1, 4, 4, 8).permute(0, 3, 1, 2)
    ref = torch.nn.functional.interpolate(grid, size=(6, 3), mode="bilinear", align_corners=False)
    torch.testing.assert_close(new["pos_embed"][:, 2:], ref.flatten(2).transpose(1, 2))


def test_torchvision_layout_nested_with_module_prefix():
    pos = torch.randn(1, 1 + 9, 8)
    ckpt = {
        "epoch": 7,
        "model": {"module.class_token": torch.randn(1, 1, 8), "module.encoder.pos_embedding": pos,
                  "module.conv_proj.weight": torch.randn(8, 3, 4, 4)},
    }  # fmt: skip
    new, change = resize_checkpoint(ckpt, 6, mode="bicubic")
    assert new["epoch"] == 7 and ckpt["model"]["module.encoder.pos_embedding"] is pos
    assert change.key == "module.encoder.pos_embedding" and change.num_prefix_tokens == 1
    assert new["model"]["module.encoder.pos_embedding"].shape == (1, 37, 8)
    assert new["model"]["module.conv_proj.weight"] is ckpt["model"]["module.conv_proj.weight"]


def test_own_classifier_checkpoint_resizes_and_loads():
    src = small_cpvt(pos_enc="learned", global_pool="token")
    new, change = resize_checkpoint({"state_dict": src.state_dict()}, (6, 5), mode="bicubic")
    assert change.key == "pos_enc.pos_embed" and change.num_prefix_tokens == 1
    dst = small_cpvt(pos_enc="learned", global_pool="token", img_size=(48, 40))
    dst.load_state_dict(new["state_dict"])
    torch.testing.assert_close(dst.pos_enc.pos_embed, src.pos_enc.table((6, 5), mode="bicubic"))
    # GAP model: no class token, so no prefix row; counted from the rows (16 = 4x4).
    gap = small_cpvt(pos_enc="learned")
    _, change = resize_checkpoint(gap.state_dict(), 2)
    assert change.num_prefix_tokens == 0 and change.prefix_source.startswith("inferred from the 16 rows")


def test_non_square_table_needs_old_grid():
    sd = {"cls_token": torch.zeros(1, 1, 4), "pos_embed": torch.randn(1, 1 + 2 * 9, 4)}
    with pytest.raises(ValueError, match=r"'pos_embed' of shape \(1, 19, 4\) has 18 grid rows") as e:
        resize_checkpoint(sd, 4)
    assert "--old-grid" in str(e.value)
    new, change = resize_checkpoint(sd, (4, 4), old_size=(2, 9), mode="nearest")
    assert change.old_grid == (2, 9) and new["pos_embed"].shape == (1, 17, 4)
    # nearest: new (3, 3) <- old (3 * 2 // 4, 3 * 9 // 4) = (1, 6)
    torch.testing.assert_close(new["pos_embed"][0, 1 + 3 * 4 + 3], sd["pos_embed"][0, 1 + 1 * 9 + 6])


def test_unchanged_grid_is_reported():
    sd = deit_like(grid=4)
    new, change = resize_checkpoint(sd, 4)
    assert not change.changed and new["pos_embed"] is sd["pos_embed"]
    assert str(change).endswith("grid already 4x4, shape (1, 17, 8); unchanged")


def test_errors_name_the_keys():
    with pytest.raises(ValueError, match=r"no position table found .*'patch_embed.proj.weight'"):
        resize_checkpoint({"patch_embed.proj.weight": torch.zeros(2, 3, 4, 4)}, 4)
    two = {"pos_embed": torch.zeros(1, 17, 4), "decoder.pos_embed": torch.zeros(1, 10, 4)}
    with pytest.raises(
        ValueError, match=r"several position tables found: .*'decoder.pos_embed': \(1, 10, 4\)"
    ):
        resize_checkpoint(two, 4)
    assert resize_checkpoint(two, 3, key="decoder.pos_embed")[1].old_grid == (3, 3)
    with pytest.raises(
        WeightsError, match=r"key 'pos_emb' is not in the checkpoint; tables found: \['pos_embed'"
    ):
        resize_checkpoint(two, 3, key="pos_emb")
    with pytest.raises(ValueError, match="no tensors found in the weights; top-level keys are"):
        resize_checkpoint({"epoch": 1}, 3)
    with pytest.raises(ValueError, match=r"neither 7, 6 nor 5 is a square grid"):
        resize_checkpoint({"pos_embed": torch.zeros(1, 7, 4)}, 3)


@pytest.mark.parametrize(
    ("key", "extra", "message"),
    [
        ("head.weight", [], "head.weight has shape (10, 8): not a position table (1, N, C)"),
        ("blocks.0.attn.qkv.weight", [], "blocks.0.attn.qkv.weight has shape (24, 8): not a position table (1, N, C)"),
        ("cls_token", [], "cls_token has shape (1, 1, 8): not a position table (1, N, C) (0 rows after 1 prefix "
                          "token(s) are not a square grid)"),
        ("extra.table", [], "extra.table has shape (1, 197, 4): not a position table (1, N, C) of the 8-wide tokens"),
        ("extra.rows", ["--old-grid", "3x3"], "extra.rows has shape (1, 20, 8): not a position table (1, N, C) "
                                              "(19 rows after 1 prefix token(s) are not a 3x3 grid)"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("verb", ["resize-pos-embed", "to-cpvt"])
def test_a_key_that_is_not_a_position_table_is_refused(tmp_path, capsys, verb, key, extra, message):
    sd = {**deit_like(), "extra.table": torch.randn(1, 197, 4), "extra.rows": torch.randn(1, 20, 8)}
    src, out = tmp_path / "deit.pth", tmp_path / "out.pth"
    torch.save(sd, src)
    if verb == "to-cpvt" and extra:
        extra = []  # to-cpvt has no --old-grid: the square-grid rule applies
        message = "extra.rows has shape (1, 20, 8): not a position table (1, N, C) (19 rows after 1 prefix " \
                  "token(s) are not a square grid)"  # fmt: skip
    grid = ["--grid", "4x4"] if verb == "resize-pos-embed" else []
    capsys.readouterr()
    assert cli([verb, str(src), str(out), *grid, "--key", key, *extra]) == 1
    assert capsys.readouterr().err == f"error: {message}: {src}\n"
    assert not out.exists()


def test_a_table_under_another_name_is_accepted_by_its_shape():
    sd = {
        "cls_token": torch.randn(1, 1, 8),
        "enc.pe": torch.randn(1, 1 + 14 * 14, 8),
        "blocks.0.w": torch.zeros(1),
    }
    new, change = resize_checkpoint(sd, 4, key="enc.pe", mode="nearest")
    assert change.old_grid == (14, 14) and new["enc.pe"].shape == (1, 17, 8)
    converted, report = learned_to_cpvt(sd, key="enc.pe")
    assert report.dropped == {"enc.pe": (1, 197, 8)} and "enc.pe" not in converted
    # (N, C) is a table only under a table's name
    assert resize_checkpoint({"pos_embed": torch.randn(17, 8)}, 2, key="pos_embed")[0]["pos_embed"].shape == (
        5,
        8,
    )


@torch.no_grad()
def test_learned_to_cpvt_equals_source_without_table():
    src = small_cpvt(pos_enc="learned", global_pool="token")
    sd = src.state_dict()
    sd["pos_embed"] = sd.pop("pos_enc.pos_embed")  # the timm/DeiT name
    sd["dist_token"], sd["head_dist.weight"] = torch.randn(1, 1, 16), torch.randn(3, 16)
    out, report = learned_to_cpvt({"model": sd}, peg_at=(0, 1))
    assert report.dropped == {"pos_embed": (1, 17, 16), "dist_token": (1, 1, 16), "head_dist.weight": (3, 16)}
    assert report.added == {
        "pos_blocks.0.proj.weight": (16, 1, 3, 3), "pos_blocks.0.proj.bias": (16,),
        "pos_blocks.1.proj.weight": (16, 1, 3, 3), "pos_blocks.1.proj.bias": (16,),
    }  # fmt: skip
    cpvt = small_cpvt(pos_enc="peg", peg_at=(0, 1), global_pool="token")
    cpvt.load_state_dict(out, strict=True)
    src.pos_enc.pos_embed.zero_()
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(cpvt(x), src(x))
    with pytest.raises(
        ValueError, match=r"peg_at=\(5,\): blocks \[5\] do not exist \(checkpoint has blocks 0..1\)"
    ):
        learned_to_cpvt(sd, peg_at=(5,))


def test_torchvision_names_map_to_deit():
    sd = {
        "class_token": torch.zeros(1, 1, 4), "conv_proj.weight": torch.zeros(4, 3, 2, 2),
        "encoder.pos_embedding": torch.zeros(1, 5, 4), "encoder.ln.weight": torch.zeros(4),
        "encoder.layers.encoder_layer_3.self_attention.in_proj_weight": torch.zeros(12, 4),
        "encoder.layers.encoder_layer_3.self_attention.out_proj.bias": torch.zeros(4),
        "encoder.layers.encoder_layer_3.mlp.0.weight": torch.zeros(8, 4),
        "encoder.layers.encoder_layer_3.mlp.linear_2.bias": torch.zeros(4),
        "encoder.layers.encoder_layer_3.ln_2.bias": torch.zeros(4), "heads.head.weight": torch.zeros(2, 4),
    }  # fmt: skip
    assert sorted(torchvision_vit_to_deit(sd)) == sorted([
        "cls_token", "patch_embed.proj.weight", "pos_embed", "norm.weight", "blocks.3.attn.qkv.weight",
        "blocks.3.attn.proj.bias", "blocks.3.mlp.fc1.weight", "blocks.3.mlp.fc2.bias", "blocks.3.norm2.bias",
        "head.weight",
    ])  # fmt: skip
    with pytest.raises(ValueError, match=r"'heads.pre_logits.weight' has no timm/DeiT counterpart"):
        torchvision_vit_to_deit({"heads.pre_logits.weight": torch.zeros(2, 2)})
    out, report = learned_to_cpvt(sd, peg_at=(3,))
    assert report.source_layout == "torchvision ViT" and "pos_blocks.3.proj.weight" in out


def test_file_formats_round_trip(tmp_path):
    sd = deit_like(grid=4)
    ckpt = {"model": sd, "epoch": 3}
    write_state_file(ckpt, tmp_path / "a.pth")
    left_out = write_state_file(ckpt, tmp_path / "a.safetensors")
    assert left_out == ["epoch (checkpoint entry outside the state dict)"]
    back = read_state_file(tmp_path / "a.safetensors")
    assert sorted(back) == sorted(sd) and all(torch.equal(back[k], sd[k]) for k in sd)
    assert read_state_file(tmp_path / "a.pth")["epoch"] == 3
    with pytest.raises(WeightsError, match=r"checkpoint not found: .*missing\.safetensors"):
        read_state_file(tmp_path / "missing.safetensors")
    (tmp_path / "garbage.safetensors").write_bytes(b"not a safetensors file at all")
    with pytest.raises(
        WeightsError, match=r"checkpoint is not a readable safetensors file \(.*\): .*garbage"
    ):
        read_state_file(tmp_path / "garbage.safetensors")
    with pytest.raises(WeightsError, match=r"checkpoint is empty \(0 bytes\): .*empty\.pth"):
        read_state_file(_touch(tmp_path / "empty.pth"))


def test_cli_in_process(tmp_path, capsys):
    sd = deit_like(grid=4)
    write_state_file(sd, tmp_path / "in.safetensors")
    assert cli(["resize-pos-embed", str(tmp_path / "in.safetensors"), str(tmp_path / "out.pth"),
                "--grid", "6x8", "--mode", "nearest"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "pos_embed: (1, 17, 8) -> (1, 49, 8), grid 4x4 -> 6x8 (nearest)" in out
    assert torch.load(tmp_path / "out.pth", weights_only=True)["pos_embed"].shape == (1, 49, 8)
    assert (
        cli(["to-cpvt", str(tmp_path / "out.pth"), str(tmp_path / "cpvt.safetensors"), "--peg-at", "0"]) == 0
    )
    out = capsys.readouterr().out
    assert (
        "dropped pos_embed (1, 49, 8)" in out
        and "added   pos_blocks.0.proj.weight (8, 1, 3, 3) (zeros)" in out
    )
    cpvt = read_state_file(tmp_path / "cpvt.safetensors")
    assert "pos_embed" not in cpvt and not cpvt["pos_blocks.0.proj.weight"].any()
    assert cli(["resize-pos-embed", str(tmp_path / "in.safetensors"), str(tmp_path / "x.pth"),
                "--grid", "6", "--key", "nope"]) == 1  # fmt: skip
    err = capsys.readouterr().err
    assert err.startswith("error: key 'nope' is not in the checkpoint") and err.count("\n") == 1
    assert err.rstrip().endswith(str(tmp_path / "in.safetensors"))
    assert cli(["resize-pos-embed", "a.pth", "b.pth", "--grid", "6xq"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: python -m peg_core resize-pos-embed: argument --grid: expected HxW")
    assert cli(["to-cpvt", "a.pth", "b.pth", "--peg-at", "0,x"]) == 2
    assert "argument --peg-at: expected comma-separated integers" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("bad.safetensors", b"garbage bytes", "checkpoint is not a readable safetensors file"),
        ("bad.pth", b"garbage bytes", "checkpoint is truncated or not a torch file"),
        ("missing.pth", None, "checkpoint not found"),
    ],
)
@pytest.mark.parametrize("command", [["resize-pos-embed", "--grid", "4"], ["to-cpvt"]])
def test_cli_unreadable_inputs_are_one_line_errors(tmp_path, capsys, name, content, message, command):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    code = cli([command[0], str(path), str(tmp_path / "out.pth"), *command[1:]])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"error: {message}") and err.rstrip().endswith(str(path))
    assert not (tmp_path / "out.pth").exists()


def test_cli_subprocess_imports_without_optional_packages(tmp_path):
    """`python -m peg_core` end to end, with safetensors made unimportable: peg_core and .pth still work."""
    torch.save(deit_like(grid=14), tmp_path / "deit.pth")
    # sys.modules[name] = None makes `import name` fail, as if it were not installed.
    code = (
        "import sys; sys.modules['safetensors'] = None; import runpy; "
        "import peg_core, peg_core.interop, peg_core.viz, peg_core.models, peg_core.classify.shapes; "
        "assert 'matplotlib' not in sys.modules and 'torchvision' not in sys.modules; "
        "sys.argv = ['peg_core'] + sys.argv[1:]; runpy.run_module('peg_core', run_name='__main__')"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-c", code, "resize-pos-embed", str(tmp_path / "deit.pth"), str(tmp_path / "o.pth"),
            "--grid", "24x24"]  # fmt: skip
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "grid 14x14 -> 24x24 (bicubic), 1 prefix token(s) kept (from cls_token)" in done.stdout
    assert torch.load(tmp_path / "o.pth", weights_only=True)["pos_embed"].shape == (1, 577, 8)


def test_safetensors_missing_is_a_clear_error(tmp_path, monkeypatch, capsys):
    torch.save(deit_like(grid=4), tmp_path / "a.pth")
    monkeypatch.setitem(sys.modules, "safetensors", None)
    monkeypatch.delitem(sys.modules, "safetensors.torch", raising=False)
    with pytest.raises(
        ImportError, match=r"reading .*b.safetensors needs safetensors: pip install 'peg-core\[safetensors\]'"
    ):
        read_state_file(_touch(tmp_path / "b.safetensors"))
    assert (
        cli(["resize-pos-embed", str(tmp_path / "a.pth"), str(tmp_path / "o.safetensors"), "--grid", "2"])
        == 1
    )
    assert "writing" in capsys.readouterr().err and not (tmp_path / "o.safetensors").exists()


def _touch(path: Path) -> Path:
    path.write_bytes(b"")
    return path
