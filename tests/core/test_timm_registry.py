"""peg_core.interop.timm: CPVT names in timm's registry, local-file pretrained loading, timm's model contract."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from peg_core.engine.checkpoint import CHECKPOINT_FORMAT, CheckpointStore
from peg_core.interop import WeightsError
from peg_core.models.cpvt import CPVT

timm = pytest.importorskip("timm")
pytest.importorskip("peg_core.interop.timm")

REPO = Path(__file__).resolve().parents[2]
TINY = dict(depth=2)  # registered widths, fewer blocks: seconds, not minutes
NAMES = ["cpvt_tiny", "cpvt_small", "cpvt_base", "cpvt_tiny_gap", "cpvt_small_gap", "cpvt_base_gap"]


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, env={"PYTHONPATH": str(REPO)}
    )


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_timm_stays_optional() -> None:
    """``import peg_core`` never imports timm; without timm, ``import peg_core.interop.timm`` names the extra."""
    r = _run(
        "import sys, peg_core\n"
        "assert 'timm' not in sys.modules, 'import peg_core imported timm'\n"
        "sys.modules['timm'] = None\n"  # makes 'import timm' fail as if it were not installed
        "try:\n    import peg_core.interop.timm\nexcept ImportError as e:\n    print(e)\nelse:\n    raise SystemExit('no error')"
    )
    assert r.returncode == 0, r.stderr
    assert "peg-core[timm]" in r.stdout


def test_registered_names() -> None:
    assert set(NAMES) <= set(timm.list_models("cpvt_*"))
    assert timm.is_model("cpvt_tiny_gap")


@pytest.mark.parametrize("name,pool,has_cls", [("cpvt_tiny", "token", True), ("cpvt_tiny_gap", "avg", False)])
def test_create_model_two_sizes(name: str, pool: str, has_cls: bool) -> None:
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=10, **TINY).eval()
    assert isinstance(model, CPVT) and model.num_classes == 10 and model.embed_dim == 192
    assert model.global_pool == pool and (model.cls_token is not None) == has_cls
    assert model.pretrained_cfg["architecture"] == name and model.default_cfg is model.pretrained_cfg
    with torch.no_grad():
        assert model(torch.randn(2, 3, 224, 224)).shape == (2, 10)
        assert model(torch.randn(2, 3, 160, 96)).shape == (2, 10)
        tokens = model.forward_features(torch.randn(1, 3, 64, 48))  # timm contract: a tensor
        assert tokens.shape == (1, int(has_cls) + 4 * 3, 192)
        assert model.forward_head(tokens, pre_logits=True).shape == (1, 192)
    config = timm.data.resolve_data_config(model=model)
    assert config["input_size"] == (3, 224, 224) and config["interpolation"] == "bicubic"


def test_reset_classifier_and_helpers() -> None:
    model = timm.create_model("cpvt_tiny", num_classes=10, **TINY).eval()
    assert model.get_classifier() is model.head and model.num_features == 192
    model.reset_classifier(4)
    assert model.get_classifier().out_features == 4 and model.num_classes == 4
    model.reset_classifier(0, "avg")
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), model.forward_features(x)[:, 1:].mean(1))  # pooled features
    gap = timm.create_model("cpvt_tiny_gap", **TINY)
    with pytest.raises(ValueError, match="class token"):
        gap.reset_classifier(3, "token")
    from timm.optim import create_optimizer_v2

    groups = create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05).param_groups
    no_decay = {id(p) for g in groups if g["weight_decay"] == 0 for p in g["params"]}
    assert id(model.cls_token) in no_decay and id(model.blocks[0].attn.qkv.weight) not in no_decay


def _load(name: str, path: Path, **kw) -> torch.nn.Module:
    return timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=str(path)), **TINY, **kw)


def test_pretrained_file_bare_state_dict_pth_and_safetensors(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    src = timm.create_model("cpvt_tiny_gap", num_classes=10, **TINY)
    torch.save(src.state_dict(), tmp_path / "w.pth")
    save_file(src.state_dict(), str(tmp_path / "w.safetensors"))
    for f in ("w.pth", "w.safetensors"):
        assert _same_weights(_load("cpvt_tiny_gap", tmp_path / f, num_classes=10), src)
    # another number of classes: the head is new, every other tensor is the file's
    other = _load("cpvt_tiny_gap", tmp_path / "w.pth", num_classes=3)
    assert other.head.weight.shape == (3, 192)
    sd, ref = other.state_dict(), src.state_dict()
    assert all(torch.equal(sd[k], ref[k]) for k in sd if not k.startswith("head."))


def test_pretrained_file_classify_checkpoint(tmp_path: Path) -> None:
    src = timm.create_model("cpvt_tiny", num_classes=6, **TINY)
    opt = torch.optim.AdamW(src.parameters())
    src(torch.randn(1, 3, 32, 32)).sum().backward()
    opt.step()  # a real optimizer state in the file, as training leaves it
    ckpt = {
        "format": CHECKPOINT_FORMAT, "task": "classify", "model": src.state_dict(),
        "model_config": {"arch": "cpvt_tiny", "global_pool": "token", "num_classes": 6, "depth": 2},
        "meta": {"classes": list("abcdef")}, "optimizer": opt.state_dict(), "scheduler": None, "scaler": None,
        "epoch": 0, "step": 1, "args": {"lr": 1e-3}, "metrics": {"acc": 0.5}, "rng_per_rank": [],
    }  # fmt: skip
    CheckpointStore(tmp_path, "classify").save(ckpt)  # the writer training uses
    loaded = _load("cpvt_tiny", tmp_path / "checkpoint.pth", num_classes=6).eval()
    assert _same_weights(loaded, src)
    x = torch.randn(1, 3, 80, 112)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), src.eval()(x))
    torch.save({**ckpt, "task": "video"}, tmp_path / "video.pth")
    with pytest.raises(WeightsError, match="'video' checkpoint"):
        _load("cpvt_tiny", tmp_path / "video.pth", num_classes=6)


def test_converted_timm_vit_loads_into_cpvt(tmp_path: Path) -> None:
    """A timm ViT converted with convert_to_cpvt has CPVT's parameter names: same outputs after loading."""
    from timm.models.vision_transformer import VisionTransformer

    from peg_core.interop import convert_to_cpvt

    torch.manual_seed(0)
    vit = convert_to_cpvt(VisionTransformer(embed_dim=64, depth=2, num_heads=2, num_classes=7)).eval()
    with torch.no_grad():
        vit.pos_blocks["0"].proj.weight.normal_(0, 0.2)
    torch.save(vit.state_dict(), tmp_path / "vit.pth")
    cpvt = _load("cpvt_tiny", tmp_path / "vit.pth", embed_dim=64, num_heads=2, num_classes=7).eval()
    x = torch.randn(2, 3, 96, 128)
    with torch.no_grad():
        torch.testing.assert_close(cpvt(x), vit(x))


def test_pretrained_errors(tmp_path: Path) -> None:
    src = timm.create_model("cpvt_tiny", num_classes=4, **TINY)
    torch.save(src.state_dict(), tmp_path / "cls.pth")
    with pytest.raises(WeightsError, match=r"cpvt_\* \(class token\)"):
        _load("cpvt_tiny_gap", tmp_path / "cls.pth", num_classes=4)
    torch.save({**src.state_dict(), "pos_embed": torch.zeros(1, 197, 192)}, tmp_path / "deit.pth")
    with pytest.raises(WeightsError, match="to-cpvt"):
        _load("cpvt_tiny", tmp_path / "deit.pth", num_classes=4)
    with pytest.raises(WeightsError, match="not found"):
        _load("cpvt_tiny", tmp_path / "missing.safetensors")
    with pytest.raises(RuntimeError, match="pretrained_cfg_overlay"):
        timm.create_model("cpvt_tiny", pretrained=True, **TINY)
