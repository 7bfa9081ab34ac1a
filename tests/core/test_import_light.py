"""``import peg_core`` is the position-encoding library alone: it loads no opt-in sub-package."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: everything ``import peg_core`` may load of the project: the contract, PEGs, encodings, resizing
LIBRARY = [
    "peg_core",
    "peg_core.base",
    "peg_core.bias",
    "peg_core.encodings",
    "peg_core.errors",
    "peg_core.peg",
    "peg_core.registry",
    "peg_core.resize",
    "peg_core.rope",
]
#: opt-in sub-packages and heavy / optional dependencies that must stay unloaded
NEVER = (
    "peg_core.engine", "peg_core.interop", "peg_core.export", "peg_core.classify", "peg_core.models",
    "peg_core.viz", "timm", "torchvision", "safetensors", "onnx", "onnxruntime", "torchao", "matplotlib",
)  # fmt: skip


def _loaded(code: str) -> list[str]:
    """``sorted(sys.modules)`` after running ``code`` in a fresh interpreter on this checkout."""
    done = subprocess.run(
        [sys.executable, "-c", f"{code}; import json, sys; print(json.dumps(sorted(sys.modules)))"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_peg_core_loads_exactly_the_library():
    code = "import peg_core, sys; print(sorted(m for m in sys.modules if m.startswith('peg_core')))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == repr(LIBRARY)


def test_import_peg_core_loads_no_opt_in_package_or_heavy_dependency():
    loaded = _loaded("import peg_core")
    leaked = sorted(m for m in loaded if any(m == n or m.startswith(n + ".") for n in NEVER))
    assert leaked == []


def test_interop_loads_neither_the_engine_nor_optional_packages():
    """Reading weights needs no training machinery; safetensors / timm load only when used."""
    loaded = _loaded("import peg_core.interop")
    assert "peg_core.interop.io" in loaded and "peg_core.interop.surgery" in loaded
    for name in (
        "peg_core.engine",
        "peg_core.export",
        "peg_core.classify",
        "timm",
        "safetensors",
        "torchvision",
    ):
        assert name not in loaded, name


#: what a model package must not load: the command line, the trainer and the CLI's dependencies
CLI_MODULES = ("peg_core.engine", "argparse", "tqdm")


@pytest.mark.parametrize("package", ["peg_detr.models", "peg_video.models"])
def test_model_packages_load_no_command_line(package):
    """Models and losses are a library: building one loads no ``peg_core.engine`` (its CLI, trainer), argparse or tqdm.

    ``import torch`` itself loads argparse and tqdm on some versions (``torch.hub``), so the check is
    against what a bare ``import torch`` loads in the same kind of fresh process.
    """
    torch_only = set(_loaded("import torch"))
    added = set(_loaded(f"import {package}")) - torch_only
    assert package in added or package.split(".")[0] in added
    leaked = sorted(m for m in added if any(m == n or m.startswith(n + ".") for n in CLI_MODULES))
    assert leaked == [], f"import {package} loads {leaked}"
    assert "peg_core.dist" in added or package == "peg_video.models"  # the losses reduce through it
