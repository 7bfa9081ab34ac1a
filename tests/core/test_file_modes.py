"""Files the engine writes atomically get the user's umask, not mkstemp's 0600 (shared clusters).

Under umask 022 every written file is 0644, under 002 it is 0664 (group-readable and -writable):
the training checkpoints (``checkpoint.pth``, the previous one, ``--save-every`` copies),
``report.json``, the log, and the weights files the surgery commands write (``.pth``, ``.safetensors``).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from peg_core.__main__ import main
from peg_core.engine import PREVIOUS_NAME
from peg_core.interop import atomic_save
from tests.core.test_classify_cli import TINY


@pytest.fixture(params=[0o022, 0o002], ids=["umask022", "umask002"])
def umask(request) -> Iterator[int]:
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def _modes(folder: Path) -> dict[str, int]:
    return {
        str(p.relative_to(folder)): stat.S_IMODE(p.stat().st_mode) for p in folder.rglob("*") if p.is_file()
    }


def test_training_files_follow_the_umask(tmp_path, umask):
    out = tmp_path / "run"
    assert main(["train", *TINY, "--epochs", "2", "--save-every", "1", "--output-dir", str(out)]) == 0
    modes = _modes(out)
    assert {"checkpoint.pth", PREVIOUS_NAME, "report.json", "log.jsonl"} <= set(modes), sorted(modes)
    assert any(name.startswith("checkpoint0") for name in modes), sorted(modes)  # the --save-every copies
    assert modes == dict.fromkeys(modes, 0o666 & ~umask)
    assert not [name for name in modes if name.endswith(".tmp")]


def test_surgery_outputs_follow_the_umask(tmp_path, umask):
    atomic_save({"pos_embed": torch.zeros(1, 5, 4)}, tmp_path / "in" / "a.pth")
    for out in ("b.pth", "b.safetensors"):
        assert main(["resize-pos-embed", str(tmp_path / "in" / "a.pth"), str(tmp_path / out),
                     "--grid", "3", "--prefix-tokens", "1"]) == 0  # fmt: skip
    assert _modes(tmp_path) == dict.fromkeys(["in/a.pth", "b.pth", "b.safetensors"], 0o666 & ~umask)
