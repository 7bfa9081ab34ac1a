"""Fail fast offline: a ``timm:NAME``, a hub id or a torchvision enum that is not cached, with the hub or
the download host unreachable, is one line within seconds (not huggingface_hub's five retries with
back-off per file, ~50 s and ten warning lines).

The network is made unreachable the way a user meets it: ``HF_ENDPOINT`` (read by huggingface_hub at
import, so each case runs in a fresh interpreter) points at a closed port on 127.0.0.1, and the proxy
variables are cleared.  Caches are empty folders under ``tmp_path``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

pytest.importorskip("huggingface_hub")

#: what a user waits at most for the one line once the libraries are imported (the reachability check's
#: 3 s and the cache look-up; imports are left out: on a loaded 2-core machine they alone take ~20 s)
SECONDS = 10.0

_RESOLVE = """
import sys, time
import huggingface_hub  # imported before the clock starts, as a command has by then
from peg_core.interop.io import WeightsError
from peg_core.interop.resolve import resolve_weights
if sys.argv[1].startswith("timm:"):
    import timm
start = time.monotonic()
try:
    resolve_weights(sys.argv[1], kind="file")
except WeightsError as e:
    print(time.monotonic() - start)
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
"""


def _closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(spec: str, tmp_path, **env: str) -> tuple[float, list[str]]:
    clean = {k: v for k, v in os.environ.items() if "proxy" not in k.lower() and not k.startswith("HF_")}
    clean.update(HF_HOME=str(tmp_path / "hf"), TORCH_HOME=str(tmp_path / "torch"), **env)
    clean.pop("TRANSFORMERS_OFFLINE", None)
    done = subprocess.run([sys.executable, "-c", _RESOLVE, spec], env=clean, capture_output=True, text=True,
                          timeout=120, cwd=os.getcwd())  # fmt: skip
    assert done.returncode == 1, done.stderr
    return float(done.stdout.strip().splitlines()[-1]), done.stderr.splitlines()


@pytest.mark.parametrize(
    "spec, named",
    [
        ("timm:vit_tiny_patch16_224.augreg_in21k_ft_in1k", "'timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k' is not in the cache"),
        ("hf:org/absent", "'org/absent' is not in the cache"),
    ],
)  # fmt: skip
def test_unreachable_hub_is_one_line_within_seconds(spec, named, tmp_path):
    if spec.startswith("timm:"):
        pytest.importorskip("timm")
    port = _closed_port()
    seconds, lines = _run(spec, tmp_path, HF_ENDPOINT=f"http://127.0.0.1:{port}")
    assert len(lines) == 1, lines  # no retry warnings
    assert named in lines[0] and f"the hub could not be reached (127.0.0.1:{port}:" in lines[0], lines
    assert seconds < SECONDS, f"{seconds:.1f} s"


def test_unreachable_download_host_is_one_line_within_seconds(tmp_path):
    """A torchvision enum (a URL download) with the proxy pointing at a closed port: the same one line."""
    port = _closed_port()
    proxy = f"http://127.0.0.1:{port}"
    seconds, lines = _run(
        "torchvision:resnet18.IMAGENET1K_V1", tmp_path, HTTPS_PROXY=proxy, https_proxy=proxy
    )
    assert len(lines) == 1, lines
    assert "is not in the cache; its host could not be reached (127.0.0.1:" in lines[0], lines
    assert seconds < SECONDS, f"{seconds:.1f} s"


def test_a_cached_timm_name_needs_no_hub(tmp_path, monkeypatch):
    """The hub down and the weights cached: read from the cache, with no download attempted."""
    pytest.importorskip("timm")
    import peg_core.interop.resolve as resolve
    from tests.hub_cache import offline_caches, put_in_hf_cache

    cache = offline_caches(tmp_path, monkeypatch)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(resolve, "unreachable", lambda url: "127.0.0.1:9: Connection refused")
    repo = "timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k"
    put_in_hf_cache(cache, repo, {"model.safetensors": b"weights"})
    found = resolve.resolve_weights("timm:vit_tiny_patch16_224.augreg_in21k_ft_in1k", kind="file")
    assert found.path.read_bytes() == b"weights" and found.source == "timm"


def test_unreachable_names_the_host_and_remembers():
    import peg_core.interop.resolve as resolve

    port = _closed_port()
    url = f"http://127.0.0.1:{port}/x"
    why = resolve.unreachable(url)
    assert why is not None and why.startswith(f"127.0.0.1:{port}: ")
    with socket.socket() as server:  # now something listens there: the remembered answer still holds
        server.bind(("127.0.0.1", 0))
        server.listen()
        live = server.getsockname()[1]
        assert resolve.unreachable(url) == why
        assert resolve.unreachable(f"http://127.0.0.1:{live}/") is None
