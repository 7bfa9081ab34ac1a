"""peg_core depends on torch alone, and each wheel holds only its own import package."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torchvision", "pytorchvideo", "decord", "scipy", "pycocotools")

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


def _requirements(wheel: zipfile.ZipFile) -> list[str]:
    (meta,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    return Parser().parsestr(wheel.read(meta).decode()).get_all("Requires-Dist") or []


@pytest.mark.parametrize(
    "package,own,needs",
    [
        ("peg-core", "peg_core", {"torch"}),
        ("peg-video", "peg_video", {"peg-core", "torch", "torchvision", "pytorchvideo", "decord"}),
        ("peg-detr", "peg_detr", {"peg-core", "torch", "torchvision", "scipy", "pycocotools"}),
    ],
)
def test_wheel_holds_only_its_package(tmp_path, package, own, needs):
    with zipfile.ZipFile(_build_wheel(package, tmp_path)) as wheel:
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
