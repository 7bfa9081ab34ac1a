"""One typed config per detector family: old checkpoints' settings, the derived flags, refusals, recipes and HF names.

``data/model_configs_before_typed_configs.json`` holds the ``model_config`` each family's demo run
(and two flag variants) recorded with the keyword builders, before the configs were typed: they
must build the same model, and a checkpoint carrying one must still load, evaluate, resume and
export.
"""

from __future__ import annotations

import ast
import json
import warnings
from pathlib import Path

import pytest
import torch

from peg_core.engine import UserError, read_checkpoint
from peg_detr.__main__ import main as cli
from peg_detr.archs import ARCHS
from peg_detr.cli import build_train_parser, parse_train_args
from peg_detr.configs import CONFIGS
from peg_detr.data import RTDETR_TRAIN_SIZES
from peg_detr.interop.hf_deimv2 import deimv2_hf_config
from peg_detr.interop.hf_detr import detr_hf_config
from peg_detr.interop.hf_dfine import dfine_hf_config
from peg_detr.interop.hf_rtdetr import rtdetr_hf_config
from peg_detr.model import build_model, load_model
from peg_detr.models import DETRConfig, build_detr
from peg_detr.models.config import json_safe
from peg_detr.models.deimv2 import DEIMV2_SIZES, DEIMv2Config
from peg_detr.models.dfine import DFINE_SIZES, DFineConfig
from peg_detr.models.rtdetr import RTDETRConfig
from peg_detr.models.rtdetr.build import build_rtdetr

BEFORE = json.loads((Path(__file__).parent / "data" / "model_configs_before_typed_configs.json").read_text())
BEFORE.pop("_about")
ROOT = Path(__file__).resolve().parents[2]
COCO_SET = dict(size=96)  # the module's ``data`` (tests/conftest.py)


# ------------------------------------------------------------------------ checkpoints written before


@pytest.mark.parametrize("name", sorted(BEFORE))
def test_a_model_config_written_before_builds_the_same_model(name):
    old = BEFORE[name]
    torch.manual_seed(0)
    model, criterion, _ = build_model(old["model_config"])
    # a new checkpoint stores the same dict: the builders' keyword names are the fields' names
    assert model.build_config == old["model_config"]
    assert sum(p.numel() for p in model.parameters()) == old["num_params"]
    assert sorted(criterion.weight_dict) == old["weight_keys"]
    config = ARCHS[old["model_config"]["arch"]].config.from_dict(old["model_config"])
    assert json.loads(json.dumps(config.to_dict())) == config.to_dict()  # json-safe as it is
    assert {"arch": old["model_config"]["arch"], **config.to_dict()} == old["model_config"]


def test_older_key_names_and_unknown_keys():
    old = {**BEFORE["rtdetr_demo_tiny"]["model_config"]}
    old["nheads"] = old.pop("num_heads")  # configs written before the shared vocabulary
    model, _, _ = build_model(old)
    assert model.build_config["num_heads"] == 2 and "nheads" not in model.build_config
    with pytest.raises(TypeError, match="RT-DETR has no setting 'hidden_dimension'"):
        RTDETRConfig.from_dict({"hidden_dimension": 3})
    with pytest.raises(
        UserError, match=r"invalid model settings \(RT-DETR has no setting 'hidden_dimension'\)"
    ):
        build_model({**old, "hidden_dimension": 3})


@pytest.mark.slow  # two training epochs
def test_a_checkpoint_in_the_old_format_loads_evaluates_resumes_and_exports(data, tmp_path, monkeypatch):
    """An RT-DETR checkpoint with its settings under older names: eval, export and resume take it.

    ``export`` hands the ONNX exporter the model of a new-format checkpoint of the same run (fused, same
    settings and weights, the same metadata); the ONNX export of a trained ``rtdetr_demo_tiny`` itself is
    README's quick start (``tests/docs``, with ``--check``), so it is not traced a second time here."""
    out = tmp_path / "run"
    argv = ["train", "--config", "rtdetr_demo_tiny", "--data-root", str(data), "--output-dir", str(out),
            "--epochs", "2", "--stop-after-epoch", "1", "--workers", "0", "--no-progress"]  # fmt: skip
    assert cli(argv) == 0
    path = out / "checkpoint.pth"
    ckpt = torch.load(path, weights_only=False)
    old = {**BEFORE["rtdetr_demo_tiny"]["model_config"], "num_classes": ckpt["model_config"]["num_classes"]}
    assert ckpt["model_config"] == old  # what the run wrote is what the keyword builder wrote
    old["nheads"] = old.pop("num_heads")
    ckpt["model_config"] = old  # an older checkpoint still: its settings under older names
    torch.save(ckpt, path)
    assert load_model(path).model.build_config["num_heads"] == 2
    assert cli(["eval", "--checkpoint", str(path), "--workers", "0", "--no-progress"]) == 0
    import peg_detr.export

    exported = []
    monkeypatch.setattr(peg_detr.export, "export_onnx", lambda *args: exported.append(args))
    assert cli(["export", str(path), str(tmp_path / "m.onnx"), "--height", "96", "--width", "96"]) == 0
    new = tmp_path / "new.pth"
    torch.save({**ckpt, "model_config": {**BEFORE["rtdetr_demo_tiny"]["model_config"],
                                         "num_classes": ckpt["model_config"]["num_classes"]}}, new)  # fmt: skip
    assert cli(["export", str(new), str(tmp_path / "n.onnx"), "--height", "96", "--width", "96"]) == 0
    (old_wrapper, old_example, *old_rest), (new_wrapper, new_example, *new_rest) = exported
    assert old_wrapper.detr.build_config == new_wrapper.detr.build_config
    assert old_wrapper.state_dict().keys() == new_wrapper.state_dict().keys()
    assert all(torch.equal(v, new_wrapper.state_dict()[k]) for k, v in old_wrapper.state_dict().items())
    assert torch.equal(old_example, new_example) and old_example.shape == (2, 3, 96, 96)
    # the dynamic sizes (torch.export.Dim: compared by what they print), names, opset, metadata
    assert repr(old_rest[1]) == repr(new_rest[1]) and old_rest[2:] == new_rest[2:]
    assert any("FusedConv" in type(m).__name__ for m in old_wrapper.modules())  # RT-DETR's deploy form
    assert cli([*argv[:-5], "--epochs", "2", "--resume", "auto", "--workers", "0", "--no-progress"]) == 0
    assert read_checkpoint(path, "detect")["epoch"] == 1


# ------------------------------------------------------------------------------- the typed configs


def test_configs_validate_in_one_place_and_round_trip():
    cfg = RTDETRConfig(backbone="tiny", hidden_dim=32, num_heads=2, peg_at=0)
    assert cfg.peg_at == [0] and RTDETRConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert "backbone_weights" not in cfg.to_dict()  # a weights file is not a setting of the model
    with pytest.raises(ValueError, match="hidden_dim=30 must be divisible by num_heads=4"):
        cfg.replace(hidden_dim=30, num_heads=4)
    with pytest.raises(ValueError, match="num_queries=0 must be >= 1"):
        DFineConfig(num_queries=0)
    with pytest.raises(ValueError, match="the lite encoder has no attention"):
        DEIMv2Config(encoder="lite")
    assert (
        DFineConfig.preset("x").encoder_hidden_dim == 384 and DEIMv2Config.preset("pico").num_queries == 200
    )
    assert issubclass(DFineConfig, RTDETRConfig) and not issubclass(DEIMv2Config, DFineConfig)
    # the builders take a config; the keyword form builds the same one
    a, _, _ = build_rtdetr(cfg)
    b, _, _ = build_rtdetr("tiny", hidden_dim=32, num_heads=2, peg_at=0)
    assert a.build_config == b.build_config == cfg.to_dict()
    detr, _, _ = build_detr(DETRConfig(backbone="tiny", pos_enc="learned", hidden_dim=32, num_heads=2))
    assert detr.build_config["learned_grid"] == [50, 84]  # the table's grid, recorded


def test_no_function_in_the_packages_takes_more_than_25_parameters():
    widest = []
    for package in ("peg_core", "peg_video", "peg_detr"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    a = node.args
                    names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
                    count = len(names) - (names[:1] in (["self"], ["cls"])) + bool(a.vararg) + bool(a.kwarg)
                    widest.append((count, f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"))
    assert max(widest)[0] <= 25, sorted(widest)[-5:]


# ------------------------------------------------------------------ what is derived from the fields


def test_arch_entries_and_train_flags_come_from_the_configs():
    parser = build_train_parser()
    for arch in ARCHS.values():
        assert arch.options == tuple(arch.config.flags())
        assert arch.sizes is arch.config.SIZES and arch.backbone == arch.config.default("backbone")
        for dest, spec in arch.config.flags().items():
            action = parser._option_string_actions[spec.flag]  # the flag exists, writing the field
            assert action.dest == dest, (arch.name, spec.flag)
    assert ARCHS["dfine"].loss_options == ("cls_loss",)
    assert set(DFINE_SIZES) < set(ARCHS["dfine"].sizes) and set(DEIMV2_SIZES) < set(ARCHS["deimv2"].sizes)


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--arch", "deimv2", "--head-act", "silu"], "applies to --arch dfine only (not --arch deimv2): --head-act silu"),
        (["--arch", "deimv2", "--pos-enc", "peg", "--peg-separable"], "applies to --arch detr, rtdetr, dfine only (not --arch deimv2): "
         "--peg-separable"),
        (["--arch", "rtdetr", "--decoder-key-pos", "none"], "applies to --arch detr only (not --arch rtdetr): "
         "--decoder-key-pos none"),
        (["--num-denoising", "5"], "applies to --arch rtdetr, dfine, deimv2 only (not --arch detr): --num-denoising 5"),
    ],
)  # fmt: skip
def test_another_familys_flag_is_refused_as_typed_in_one_line(argv, line):
    with pytest.raises(UserError) as e:
        parse_train_args(["--data-root", "x", *argv])
    assert e.value.line() == f"error: {line}"


def test_recipes_name_the_presets_and_one_set_of_sides():
    assert CONFIGS["rtdetr_r50vd_6x"]["train_scales"] == ",".join(map(str, RTDETR_TRAIN_SIZES))
    assert CONFIGS["detr_r50_500ep"]["train_scales"] == CONFIGS["rtdetr_r50vd_6x"]["train_scales"]
    assert CONFIGS["dfine_s"]["train_scales"].split(",").count("640") == 20  # D-FINE's scale_ori_repeat
    assert "640" not in CONFIGS["dfine_n"]["train_scales"].split(",")
    for name, recipe in CONFIGS.items():
        size = recipe.get("model_size")
        if size is None or size == "tiny":
            continue
        config = ARCHS[recipe["arch"]].config
        preset = config.SIZES[size]
        for key in ("backbone", "pos_enc", "num_queries"):
            want = (
                "peg" if key == "pos_enc" and name.endswith("_peg") else preset.get(key, config.default(key))
            )
            assert recipe[key] == want, (name, key)


def _tiny(arch):
    kw = {
        "detr": dict(backbone="resnet18", pos_enc="sine", hidden_dim=32, num_heads=2, enc_layers=1, dec_layers=2,
                     dim_feedforward=64, num_queries=10),
        "rtdetr": dict(backbone="tiny", hidden_dim=32, num_heads=2, dim_feedforward=64, dec_layers=2,
                       encoder_expansion=0.5, num_queries=20, num_denoising=10),
        "dfine": dict(backbone="hgnetv2_b0", hidden_dim=64, num_heads=4, dec_layers=2, dim_feedforward=64,
                      num_queries=20, max_num_bins=8, encoder_expansion=0.5, depth_mult=0.34, num_denoising=10),
        "deimv2": dict(**ARCHS["deimv2"].sizes["tiny"], num_queries=20, num_denoising=10),
    }[arch]  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a random ResNet-18
        return build_model({"arch": arch, **kw, "num_classes": 3})[0]


@pytest.mark.parametrize(
    ("arch", "export"),
    [
        ("detr", detr_hf_config),
        ("rtdetr", rtdetr_hf_config),
        ("dfine", dfine_hf_config),
        ("deimv2", deimv2_hf_config),
    ],
)
def test_the_hugging_face_names_declared_on_the_fields_hold_their_values(arch, export):
    model = _tiny(arch)
    config = ARCHS[arch].config.from_dict(model.build_config)
    exported = export(model)
    declared = config.hf_fields()
    assert declared
    for name, hf_names in declared.items():
        value = json_safe(getattr(config, name))
        for hf in hf_names:
            assert hf in exported, (name, hf)
            got = json_safe(exported[hf])
            if value is None:  # "as the other field" (encoder_hidden_dim: hidden_dim's)
                continue
            if isinstance(value, int) and isinstance(got, list):  # one value for every level
                value = [value] * len(got)
            assert got == value, (name, hf, got, value)
    # the exporters' encoder / decoder maps are these declarations: each name holds the module's value
    for part in ("encoder", "decoder"):
        hparams = getattr(getattr(model, part, None), "hparams", None)
        for key, hf in config.hf_names(part).items() if hparams is not None else ():
            assert json_safe(exported[hf]) == json_safe(hparams[key]), (part, key, hf)
