"""The position-encoding registry from outside the packages.

Encodings defined in this file (a table, a conditional encoding and a rotary one) are registered
with :func:`peg_core.registry.register_encoding` and then train and evaluate through the command
lines of all four model families (CPVT, DETR, RT-DETR, the video ViT) with ``--pos-enc NAME``,
without any change to the packages.  Also: the ``+`` rules, the family filters, and the
``peg.encodings`` entry-point group reaching every ``-h``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from peg_core import PositionEncoding
from peg_core.engine import read_checkpoint
from peg_core.registry import (
    Encoding,
    EncodingContext,
    EncodingSupport,
    PosEncError,
    encoding_names,
    parse_pos_enc,
    register_encoding,
    unregister_encoding,
)
from peg_core.rope import RoPEAxial

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


class FourierTable(PositionEncoding):
    """A table of the grid alone: sin / cos of random projections of coordinates in [-1, 1], any rank.

    ``position(x (B, P + N, C), size) -> (1, P + N, C)``, zeros at the ``P`` prefix tokens.
    """

    def __init__(self, dim: int, num_prefix_tokens: int, apply_to: str) -> None:
        super().__init__()
        self.freqs = nn.Parameter(torch.randn(3, dim // 2))
        self.gain = nn.Parameter(torch.tensor(0.1))
        self.num_prefix_tokens = num_prefix_tokens
        self._set_apply_to(apply_to)

    def position(self, x: Tensor, size: tuple[int, ...], mask: Tensor | None = None) -> Tensor:
        axes = [torch.linspace(-1.0, 1.0, int(s), device=x.device) for s in size]
        coords = torch.stack(torch.meshgrid(*axes, indexing="ij"), -1).reshape(-1, len(size))
        phase = coords @ self.freqs[: len(size)]
        pos = torch.cat([phase.sin(), phase.cos()], -1) * self.gain
        pos = torch.cat([pos.new_zeros(self.num_prefix_tokens, pos.shape[-1]), pos])
        return pos.unsqueeze(0).to(x.dtype)


class TokenGate(PositionEncoding):
    """A conditional encoding: a gated projection of the grid tokens themselves (prefix tokens get 0)."""

    conditional = True

    def __init__(self, dim: int, num_prefix_tokens: int) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        nn.init.normal_(self.proj.weight, std=0.02)
        self.num_prefix_tokens = num_prefix_tokens

    def position(self, x: Tensor, size: tuple[int, ...], mask: Tensor | None = None) -> Tensor:
        p = self.num_prefix_tokens
        delta = torch.tanh(self.proj(x[:, p:]))
        return torch.cat([torch.zeros_like(x[:, :p]), delta], 1)


TABLE = Encoding("test-fourier", "add", lambda ctx: FourierTable(ctx.dim, ctx.num_prefix_tokens, ctx.apply_to),
                 dims=(2, 3), description="test: random Fourier table")  # fmt: skip
GATE = Encoding("test-gate", "add", lambda ctx: TokenGate(ctx.dim, ctx.num_prefix_tokens), dims=(2, 3),
                conditional=True, description="test: gated token projection")  # fmt: skip
ROPE = Encoding("test-rope", "rotate", lambda ctx: RoPEAxial(ctx.dim, ctx.ndim, temperature=33.0), dims=(2, 3),
                description="test: axial rotary, temperature 33")  # fmt: skip
BIAS = Encoding("test-bias", "bias", lambda ctx: nn.Identity(), dims=(2, 3))


@pytest.fixture(autouse=True, scope="module")
def registered():
    """The test encodings, registered for this module only; torch's threads as they were."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    for e in (TABLE, GATE, ROPE, BIAS):
        register_encoding(e)
    yield
    for e in (TABLE, GATE, ROPE, BIAS):
        unregister_encoding(e.name)
    torch.set_num_threads(threads)


# --------------------------------------------------------------------------------- the registry


def test_parse_rules_and_family_filters():
    spec = parse_pos_enc("test-gate+test-fourier+test-rope")
    assert (spec.table, spec.conditional, spec.rotary, spec.bias) == (TABLE, GATE, ROPE, None)
    assert (
        spec.slots == ("table", "conditional", "rotary") and str(spec) == "test-gate+test-fourier+test-rope"
    )
    assert parse_pos_enc("none").parts == ()
    for bad, why in (
        ("test-fourier+learned", "both table encodings"),
        ("none+test-gate", "combines with nothing"),
        ("test-nothing", "unknown position encoding 'test-nothing'"),
        ("peg+", "empty part"),
    ):
        with pytest.raises(PosEncError, match=why):
            parse_pos_enc(bad)
    images = EncodingSupport("images", 2, combos=(("conditional", "rotary"),), exclude=("sine",))
    assert {"test-fourier", "test-gate", "test-rope"} <= set(images.names())
    assert (
        "test-bias" not in images.names() and "sine" not in images.names() and "rope-3d" not in images.names()
    )
    for bad, why in (
        ("test-bias", "has no bias encoding 'test-bias'"),
        ("test-fourier+test-rope", "takes no table\\+rotary combination"),
        ("sine", "has no table encoding 'sine'"),
        ("peg3d", "2-D token grid; encoding 'peg3d' runs on 3-D grids"),
    ):
        with pytest.raises(PosEncError, match=why):
            parse_pos_enc(bad, images)
    with pytest.raises(ValueError, match="already registered"):
        register_encoding(Encoding("test-fourier", "add", TABLE.build))
    register_encoding(TABLE)  # the same object again: a no-op, so modules may register at import
    for kwargs, why in (({"name": "a+b"}, "without '\\+'"), ({"name": "none"}, "reserved"),
                        ({"kind": "scale"}, "kind must be one of"), ({"dims": (4,)}, "grid ranks")):  # fmt: skip
        with pytest.raises(ValueError, match=why):
            Encoding(**{"name": "x", "kind": "add", "build": TABLE.build, **kwargs})
    assert encoding_names(kind="rotate", ndim=3) == ["rope-3d", "test-rope"]


def test_builders_get_the_model_context():
    table = TABLE.build(EncodingContext(16, (3, 5), num_prefix_tokens=1, apply_to="qk"))
    x = torch.randn(2, 16, 16)
    pos = table.position(x, (3, 5))
    assert pos.shape == (1, 16, 16) and not pos[0, 0].any() and table.apply_to == "qk"
    rope = ROPE.build(EncodingContext(8, (2, 3, 4)))
    sin, cos = rope((2, 3, 4))
    assert sin.shape[-2] == 24 and torch.allclose(sin**2 + cos**2, torch.ones_like(sin))


# ------------------------------------------------------------------------- the four model families


def _state_keys(path: Path, task: str) -> set[str]:
    return set(read_checkpoint(path, task)["model"])


def _finished(report: dict) -> dict:
    assert report["status"] == "finished", report
    return report["eval"]


def test_classifier_trains_and_evaluates_with_registered_encodings(tmp_path):
    from peg_core.__main__ import main
    from tests.core.classify_runs import tiny

    run = tmp_path / "run"
    argv = ["train", *tiny(16, 8), "--epochs", "1", "--output-dir", str(run),
            "--pos-enc", "test-fourier+test-gate+test-rope"]  # fmt: skip
    assert main(argv) == 0
    keys = _state_keys(run / "checkpoint.pth", "classify")
    assert {"pos_enc.freqs", "pos_enc.gain", "pos_blocks.0.proj.weight"} <= keys
    assert main(["eval", "--checkpoint", str(run / "checkpoint.pth"), "--eval-sizes", "16,24", "--output-dir",
                 str(tmp_path / "ev"), "--no-progress", "--device", "cpu"]) == 0  # fmt: skip
    ev = json.loads((tmp_path / "ev" / "report.json").read_text())["eval"]
    assert list(ev["top1_by_size"]) == ["16", "24"] and all(0 <= v <= 1 for v in ev["top1_by_size"].values())


DETR_TINY = [
    "--backbone", "tiny", "--hidden-dim", "32", "--num-heads", "2", "--enc-layers", "1", "--dec-layers", "1",
    "--dim-feedforward", "64", "--num-queries", "6", "--train-sizes", "64", "--max-size", "64",
    "--val-size", "64", "--total-batch-size", "4", "--workers", "0", "--no-progress", "--device", "cpu",
]  # fmt: skip
RTDETR_TINY = ["--config", "rtdetr_demo_tiny", "--workers", "0", "--no-progress", "--device", "cpu"]


@pytest.mark.parametrize(
    ("arch", "pos_enc", "keys"),
    [
        ("detr", "test-fourier", {"transformer.encoder.pos.freqs"}),
        ("detr", "test-gate+test-rope", {"transformer.encoder.pegs.0.proj.weight"}),
        ("rtdetr", "test-fourier", {"encoder.aifi.0.pos.freqs"}),
        ("rtdetr", "test-gate+test-rope", {"encoder.aifi.0.pegs.-1.proj.weight"}),
    ],
)
def test_detectors_train_and_evaluate_with_registered_encodings(coco, tmp_path, arch, pos_enc, keys):
    from peg_detr.__main__ import main

    run = tmp_path / "run"
    flags = DETR_TINY if arch == "detr" else RTDETR_TINY
    argv = ["train", *flags, "--data-root", str(coco), "--output-dir", str(run), "--epochs", "1",
            "--pos-enc", pos_enc]  # fmt: skip
    assert main(argv) == 0
    report = json.loads((run / "report.json").read_text())
    assert 0.0 <= _finished(report)["ap50"] <= 1.0
    model_keys = _state_keys(run / "checkpoint.pth", "detect")
    missing = {k for k in keys if not any(m.endswith(k) for m in model_keys)}
    assert not missing, sorted(k for k in model_keys if "pos" in k or "peg" in k)
    ev = tmp_path / "ev"
    assert main(["eval", "--checkpoint", str(run / "checkpoint.pth"), "--data-root", str(coco), "--output-dir",
                 str(ev), "--no-progress", "--device", "cpu", "--workers", "0"]) == 0  # fmt: skip
    assert json.loads((ev / "report.json").read_text())["eval"]["ap50"] == report["eval"]["ap50"]


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    from tests.video.runs import synthetic_set

    return synthetic_set(tmp_path_factory.mktemp("clips"), num_train=8, num_val=4, seed=2)


@pytest.mark.parametrize(
    ("pos_enc", "keys"),
    [("test-fourier", {"pos_enc.freqs"}), ("test-gate+test-rope", {"pos_blocks.0.proj.weight"})],
)
def test_video_vit_trains_and_evaluates_with_registered_encodings(clips, tmp_path, pos_enc, keys):
    from peg_video.__main__ import main
    from tests.video.runs import TINY

    run = tmp_path / "run"
    data = ["--train-ann", str(clips / "train.csv"), "--val-ann", str(clips / "val.csv")]
    # synthetic_tiny's recipe puts a PEG after block 0: without a conditional encoding the recipe's value is dropped
    argv = ["train", *data, "--output-dir", str(run), *TINY, "--epochs", "1", "--pos-enc", pos_enc]
    assert main(argv) == 0
    report = json.loads((run / "report.json").read_text())
    assert 0.0 <= _finished(report)["top1"] <= 1.0
    assert keys <= _state_keys(run / "checkpoint.pth", "video")
    ev = tmp_path / "ev"
    assert main(["eval", "--checkpoint", str(run / "checkpoint.pth"), "--val-ann", str(clips / "val.csv"),
                 "--output-dir", str(ev), "--no-progress", "--workers", "0"]) == 0  # fmt: skip
    assert json.loads((ev / "report.json").read_text())["eval"]["top1"] == report["eval"]["top1"]


# ------------------------------------------------------------------------------ entry-point plugins

PLUGIN = """
from torch import nn
from peg_core.registry import Encoding
from peg_core.rope import RoPEAxial

ENCODINGS = [
    Encoding("plug-rope", "rotate", lambda ctx: RoPEAxial(ctx.dim, ctx.ndim, temperature=50.0), dims=(2, 3)),
]

def broken():
    raise RuntimeError("this plugin is broken")
"""


def _plugin_env(tmp_path: Path) -> dict[str, str]:
    """A 'installed' package on ``PYTHONPATH``: a module and a dist-info declaring two ``peg.encodings`` entries."""
    (tmp_path / "peg_test_plugin.py").write_text(textwrap.dedent(PLUGIN))
    info = tmp_path / "peg_test_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: peg-test-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[peg.encodings]\nplug = peg_test_plugin:ENCODINGS\nbroken = peg_test_plugin:broken\n"
    )
    path = os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path}


@pytest.mark.parametrize("package", ["peg_core", "peg_detr", "peg_video"])
def test_entry_point_encodings_reach_every_help(tmp_path, package):
    env = _plugin_env(tmp_path)
    done = subprocess.run([sys.executable, "-m", package, "train", "-h"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "plug-rope" in " ".join(done.stdout.split())
    # the broken entry is skipped with one warning naming it, and takes nothing else down
    warned = [line for line in done.stderr.splitlines() if "plugin 'broken'" in line]
    assert len(warned) == 1 and "this plugin is broken" in warned[0], done.stderr


def test_entry_point_encoding_builds_in_a_fresh_process(tmp_path):
    env = _plugin_env(tmp_path)
    code = ("from peg_core.models import CPVT; m = CPVT(embed_dim=16, depth=1, num_heads=2, num_classes=3, "
            "img_size=16, patch_size=8, pos_enc='peg+plug-rope'); print(type(m.rope).__name__, m.rope.temperature)")  # fmt: skip
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", code], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["RoPEAxial", "50.0"]


EXITING_PLUGIN = """
import sys

sys.exit(7)  # at import: once, this made every --pos-enc command exit 7 with nothing said
"""

FAILING_BUILDERS = """
from peg_core.registry import Encoding


def _explode(ctx):
    raise RuntimeError("plugin build exploded")


ENCODINGS = [
    Encoding("plug-explodes", "rotate", _explode, dims=(2, 3)),
    Encoding("plug-none-bias", "bias", lambda ctx: None, dims=(2, 3)),  # a model with no position information
]
"""


def _bad_plugins_env(tmp_path: Path) -> dict[str, str]:
    """:func:`_plugin_env` plus a package ``peg-bad-plugins 2.0`` whose module exits at import and
    whose other entry's builders raise / return ``None``."""
    env = _plugin_env(tmp_path)
    (tmp_path / "peg_exit_plugin.py").write_text(textwrap.dedent(EXITING_PLUGIN))
    (tmp_path / "peg_failing_plugin.py").write_text(textwrap.dedent(FAILING_BUILDERS))
    info = tmp_path / "peg_bad_plugins-2.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: peg-bad-plugins\nVersion: 2.0\n")
    (info / "entry_points.txt").write_text(
        "[peg.encodings]\nexits = peg_exit_plugin:ANYTHING\nfailing = peg_failing_plugin:ENCODINGS\n"
    )
    return env


def test_a_plugin_that_exits_at_import_is_one_warning_and_the_others_work(tmp_path):
    done = subprocess.run([sys.executable, "-m", "peg_core", "train", "-h"], env=_bad_plugins_env(tmp_path),
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, (done.returncode, done.stderr)
    assert "plug-rope" in done.stdout and "plug-explodes" in done.stdout  # the other plugins still load
    warned = [line for line in done.stderr.splitlines() if "plugin 'exits'" in line]
    assert len(warned) == 1 and "SystemExit: 7" in warned[0], done.stderr
    assert "entry point exits = peg_exit_plugin:ANYTHING (package peg-bad-plugins 2.0)" in warned[0]
    assert "Traceback" not in done.stderr


def test_a_plugin_builder_that_fails_or_returns_the_wrong_kind_is_one_line(tmp_path):
    code = textwrap.dedent("""
        from peg_core.engine.command import run_command
        from peg_core.models import CPVT

        def build(argv):
            CPVT(embed_dim=16, depth=1, num_heads=2, num_classes=3, img_size=16, patch_size=8, pos_enc=argv[0])

        for pos_enc in ("plug-explodes", "plug-none-bias", "peg+plug-rope"):
            print(run_command(build, [pos_enc]))
    """)
    done = subprocess.run([sys.executable, "-c", code], env=_bad_plugins_env(tmp_path), cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stdout.split() == ["1", "1", "0"]  # two one-line user errors; the good plugin still builds
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        "error: position-encoding plugin 'plug-explodes' failed to build (RuntimeError: plugin build exploded): "
        "entry point failing = peg_failing_plugin:ENCODINGS (package peg-bad-plugins 2.0)",
        "error: encoding 'plug-none-bias' of kind 'bias' built NoneType, not a peg_core.bias.AttentionBias: "
        "entry point failing = peg_failing_plugin:ENCODINGS (package peg-bad-plugins 2.0)",
    ]


def test_every_builder_result_is_checked_against_its_kind():
    ctx = EncodingContext(8, (2, 3))
    for kind, wrong in (("add", nn.Identity()), ("rotate", None), ("bias", nn.Identity())):
        enc = Encoding(f"test-wrong-{kind}", kind, lambda ctx, w=wrong: w, dims=(2,))
        with pytest.raises(PosEncError, match=f"of kind '{kind}' built"):
            enc.build(ctx)
    assert isinstance(ROPE.build(EncodingContext(8, (2, 3))), RoPEAxial)  # the right kind passes through
    assert Encoding("test-same", "add", TABLE.build) == Encoding("test-same", "add", TABLE.build)
