"""Caches laid out as huggingface_hub and torch.hub lay them out, for the offline resolver tests.

huggingface_hub's cache (``HF_HUB_CACHE``, else ``HF_HOME/hub``) keeps one folder per repository::

    models--org--name/
        blobs/<sha256 of the file>          the bytes, once
        refs/main                           the commit hash a branch points at
        snapshots/<commit>/<file>           a relative symlink to ../../blobs/<sha256>

:func:`put_in_hf_cache` writes that layout (checked by the tests with ``scan_cache_dir`` and
``try_to_load_from_cache``); :func:`torch_checkpoint_path` is torchvision's cache file of a weights enum.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path

import pytest


def commit_of(repo: str, revision: str = "main") -> str:
    """A stable 40-hex commit id for ``repo`` at ``revision`` (a real one is the same shape)."""
    return hashlib.sha1(f"{repo}@{revision}".encode()).hexdigest()


def put_in_hf_cache(
    cache: Path,
    repo: str,
    files: Path | Mapping[str, bytes | Path],
    revision: str = "main",
    commit: str | None = None,
) -> Path:
    """Put ``files`` (a folder's files, or ``{name: bytes or file}``) in the hub cache as ``repo`` at
    ``revision``; returns the snapshot folder."""
    if isinstance(files, Path):
        files = {p.name: p for p in sorted(files.iterdir()) if p.is_file()}
    commit = commit or commit_of(repo, revision)
    root = cache / ("models--" + repo.replace("/", "--"))
    snapshot = root / "snapshots" / commit
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        data = content.read_bytes() if isinstance(content, Path) else content
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / revision).write_text(commit)
    return snapshot


def offline_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty ``HF_HOME`` under ``tmp_path`` (its hub cache returned), offline; ``TORCH_HOME`` beside it.

    Each test module makes it a fixture (``hf_home``) so that the variables are undone after each test.
    """
    home = tmp_path / "hf_home"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    (home / "hub").mkdir(parents=True)
    return home / "hub"
