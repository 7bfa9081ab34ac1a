"""peg_core depends on torch alone, and each wheel holds only its own import package."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from email.message import Message
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torchvision", "pytorchvideo", "decord", "scipy", "pycocotools")
PACKAGES = ("peg-core", "peg-detr", "peg-video")
REPO_URL = "https://github.com/peg-project/peg"

IMPORT_ALL = """
import importlib, json, pkgutil, sys
import peg_core
names = []
# modules of optional extras (peg-core[timm]) bring their own dependencies by design
OPTIONAL = {"peg_core.interop.timm"}
for info in pkgutil.walk_packages(peg_core.__path__, "peg_core."):
    if info.name in OPTIONAL:
        continue
    if info.name.endswith(".__main__"):
        sys.argv = ["peg_core", "--help"]  # in case it runs its CLI on import
        try:
            importlib.import_module(info.name)
        except SystemExit:
            pass
    else:
        importlib.import_module(info.name)
    names.append(info.name)
print(json.dumps({"modules": names, "loaded": sorted(m.split(".")[0] for m in sys.modules)}))
"""


def test_peg_core_imports_no_heavy_dependency():
    proc = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"peg_core.peg", "peg_core.encodings", "peg_core.resize", "peg_core.base"} <= set(
        report["modules"]
    )
    leaked = sorted(set(HEAVY) & set(report["loaded"]))
    assert not leaked, f"importing every peg_core module loaded {leaked}"


def _build_wheel(package: str, out: Path) -> Path:
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         str(ROOT / "packages" / package), "-w", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, f"building {package} failed:\n{proc.stdout}\n{proc.stderr}"
    (wheel,) = out.glob(f"{package.replace('-', '_')}-*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    """The three wheels, built once for the module."""
    out = tmp_path_factory.mktemp("wheels")
    return {package: _build_wheel(package, out) for package in PACKAGES}


def _metadata(wheel: zipfile.ZipFile) -> Message:
    (meta,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    return Parser().parsestr(wheel.read(meta).decode())


def _requirements(wheel: zipfile.ZipFile) -> list[str]:
    return _metadata(wheel).get_all("Requires-Dist") or []


@pytest.mark.parametrize(
    "package,own,needs",
    [
        ("peg-core", "peg_core", {"torch"}),
        ("peg-video", "peg_video", {"peg-core", "torch", "torchvision", "pytorchvideo", "decord"}),
        ("peg-detr", "peg_detr", {"peg-core", "torch", "torchvision", "scipy", "pycocotools"}),
    ],
)
def test_wheel_holds_only_its_package(wheels, package, own, needs):
    with zipfile.ZipFile(wheels[package]) as wheel:
        names = wheel.namelist()
        stray = [n for n in names if not (n.startswith(f"{own}/") or ".dist-info/" in n)]
        assert not stray, f"{package} wheel holds files outside {own}/: {stray}"
        assert f"{own}/__init__.py" in names
        assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
        reqs = _requirements(wheel)
    parsed = [Requirement(r) for r in reqs]
    # extras (``extra == "viz"``) are optional; everything else is installed with the wheel
    names_only = {r.name for r in parsed if r.marker is None or "extra" not in str(r.marker)}
    if package == "peg-core":
        assert names_only == {"torch"}, reqs  # torch alone; anything else only as an extra
    else:
        assert needs <= names_only, reqs
        assert not {n for n in names_only if n.startswith("peg-") and n != "peg-core"}, reqs


@pytest.mark.parametrize(
    "package,extras",
    [
        ("peg-core", {"vision", "onnx", "safetensors", "quantize", "timm", "viz", "hub"}),
        ("peg-detr", {"onnx", "safetensors", "hf", "hub", "timm"}),
        ("peg-video", {"onnx", "safetensors", "hub"}),
    ],
)
def test_wheel_metadata_readme_license_urls_extras_scripts(wheels, package, extras):
    """What an index page and ``pip install`` show: the README, the license, the links, the extras, the command."""
    with zipfile.ZipFile(wheels[package]) as wheel:
        meta = _metadata(wheel)
        (entry_points,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
        scripts = wheel.read(entry_points).decode()
        license_text = wheel.read(
            next(n for n in wheel.namelist() if n.endswith(".dist-info/licenses/LICENSE"))
        )
    readme = (ROOT / "packages" / package / "README.md").read_text()
    assert meta["Description-Content-Type"] == "text/markdown"
    assert meta.get_payload().strip() == readme.strip() and readme.startswith(f"# {package}\n")
    assert meta["License-Expression"] == "Apache-2.0" and meta.get_all("License-File") == ["LICENSE"]
    assert b"Apache License" in license_text and b"Version 2.0, January 2004" in license_text
    assert sorted(meta.get_all("Project-URL")) == [
        f"Documentation, {REPO_URL}/tree/main/docs",
        f"Homepage, {REPO_URL}",
        f"Issues, {REPO_URL}/issues",
    ]
    assert set(meta.get_all("Provides-Extra")) == extras
    module = package.replace("-", "_")
    assert scripts.split() == ["[console_scripts]", package, "=", f"{module}.__main__:main"]
    if package != "peg-core":  # the task packages' extras come through peg-core's of the same name
        onnx = [Requirement(r) for r in _requirements(zipfile.ZipFile(wheels[package])) if "onnx" in r]
        assert [(r.name, r.extras) for r in onnx] == [("peg-core", {"onnx"})]


def test_dev_install_declares_the_three_console_scripts():
    """The root development pyproject installs the same commands as the wheels."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"] == {
        "peg-core": "peg_core.__main__:main",
        "peg-detr": "peg_detr.__main__:main",
        "peg-video": "peg_video.__main__:main",
    }
    assert project["license"] == "Apache-2.0" and (ROOT / "LICENSE").read_text().lstrip().startswith(
        "Apache License"
    )
