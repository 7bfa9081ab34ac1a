"""Where weights come from: one resolver from what the user names to a file or folder on disk.

:func:`resolve_weights` takes the spec every weights option accepts (``--init``, ``--backbone-weights``,
``--init-timm``, ``from_hf``, ``from_timm_file``, ``Predictor.from_checkpoint``) and returns a
:class:`ResolvedWeights` whose ``path`` the existing loaders read as before:

==============================================  ===============================================
spec                                            read from
==============================================  ===============================================
an existing file or folder (any path)           itself (``source="local"``), exactly as before
``org/name``, ``org/name@revision``,            the Hugging Face hub: ``snapshot_download`` into
``hf:org/name``                                 its cache (``HF_HUB_CACHE``, else ``HF_HOME/hub``)
``timm:NAME`` (``NAME`` as timm names it,       timm's own pretrained weights (its ``hf_hub_id``
e.g. ``vit_small_patch16_224.augreg_in1k``)     in the hub cache, else its URL in ``TORCH_HOME``)
``torchvision:resnet50.IMAGENET1K_V2``,         torchvision's file (``weights.url``'s basename) in
``torchvision:ResNet50_Weights.IMAGENET1K_V2``  ``TORCH_HOME/hub/checkpoints``, torchvision's cache
or, for a backbone option, ``IMAGENET1K_V2``
==============================================  ===============================================

A timm name is always written with its ``timm:`` prefix (a bare word is a local path, so a file
called like a timm model is never shadowed).  A path-like spec that does not exist (``runs/x.pth``,
``./w``, ``/abs``, a name with a weights suffix or more than one ``/``) stays a local path, so the
loader's own "not found" message is unchanged.

Only a remote spec fetches anything, and only the files a loader reads: ``config.json``, the
(video) preprocessor configs, ``*.safetensors`` and the shard index; a ``pytorch_model*.bin`` only
when the snapshot has no safetensors (read later by :func:`~peg_core.interop.io.read_state_file`,
``weights_only=True``: a pickle with code in it is refused, never run).  ``HF_HUB_OFFLINE=1`` or
``TRANSFORMERS_OFFLINE=1`` reads the caches only.  Each remote spec prints one line on stderr saying
what was found or fetched and where it lies.

Fail fast offline: before asking the hub (its ``HF_ENDPOINT``) or a download URL for anything, the
host (or the proxy the environment names for it) is connected to once, for at most
:data:`REACH_TIMEOUT` seconds (:func:`unreachable`).  A host that does not answer makes the call
read the caches only, as ``HF_HUB_OFFLINE=1`` does: what is cached is used, what is not is one
line naming the host and why (``127.0.0.1:9: Connection refused``), within seconds, whatever the
library's retry policy (huggingface_hub retries a refused connection five times with back-off,
~50 s and ten warning lines per file).

Every failure is one :class:`~peg_core.interop.io.WeightsError` line (an id not in the cache while
offline names the id and the cache folder looked in; a revision the hub or the cache lacks names
it); a hub id without ``huggingface_hub`` is a :class:`~peg_core.errors.MissingDependency` naming the
extra ``pip install 'peg-core[hub]'``.
"""

from __future__ import annotations

import importlib
import os
import re
import socket
import sys
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Literal

from ..errors import require
from .io import WEIGHTS_AS_TYPED, WeightsError

__all__ = [
    "HF_ALLOW_PATTERNS",
    "HF_PICKLE_PATTERNS",
    "PUBLIC_MODELS_NOTE",
    "REACH_TIMEOUT",
    "PublicModel",
    "ResolvedWeights",
    "format_public_models",
    "hf_cache_dir",
    "is_offline",
    "parse_weights_spec",
    "resolve_path_arg",
    "resolve_weights",
    "resolve_weights_arg",
    "unreachable",
]

#: what a Hugging Face model folder is fetched with (the loaders read nothing else)
HF_ALLOW_PATTERNS = (
    "config.json",
    "preprocessor_config.json",
    "video_preprocessor_config.json",
    "*.safetensors",
    "model.safetensors.index.json",
)
#: the pickle weights, fetched only when a snapshot has no safetensors
HF_PICKLE_PATTERNS = ("pytorch_model.bin", "pytorch_model-*.bin", "pytorch_model.bin.index.json")
#: the single weights file of a snapshot, in the order it is looked for (safetensors first)
_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
#: suffixes that make a spec a file path, never a hub id
_FILE_SUFFIXES = (".pth", ".pt", ".bin", ".safetensors", ".ckpt", ".npz", ".json", ".tar")

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
#: a branch, tag or commit name: word characters, ``.``, ``-`` and ``/`` (``refs/pr/1``), from a word
#: character; :func:`_revision_ok` adds git's ref-name rules (no ``..``, no empty or hidden component)
_REVISION = re.compile(r"[\w][\w./-]*")
_ENUM_MEMBER = re.compile(r"[A-Z][A-Z0-9_]*")

Source = Literal["local", "hf", "timm", "torchvision"]
Kind = Literal["file", "folder"]


@dataclass(frozen=True)
class ResolvedWeights:
    """Where a weights spec lies on disk.

    Attributes:
        path: the file (``kind="file"``) or model folder (``kind="folder"``) the loaders read.
        source: ``"local"`` (the spec was a path), ``"hf"``, ``"timm"`` or ``"torchvision"``.
        id: the remote id as named (``"PekingU/rtdetr_r50vd"``, ``"vit_small_patch16_224"``,
            ``"ResNet50_Weights.IMAGENET1K_V2"``); ``None`` for a local path.
        revision: the hub commit the files belong to (``None`` for local / URL files).
        fetched: the file names found or fetched (relative to ``path``'s folder).
        cache: the cache folder read (``None`` for a local path).
    """

    path: Path
    source: Source = "local"
    id: str | None = None
    revision: str | None = None
    fetched: tuple[str, ...] = ()
    cache: Path | None = None

    @property
    def remote(self) -> bool:
        """Whether the spec named remote weights (then a run records ``id``/``revision``)."""
        return self.source != "local"


# ------------------------------------------------------------------------------------ environment


def is_offline() -> bool:
    """``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE`` set to a true value, read now (not at import)."""
    return any(
        os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")
        for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def hf_cache_dir() -> Path:
    """The hub cache huggingface_hub uses: ``HF_HUB_CACHE``, else ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``.

    Read from the environment at call time (huggingface_hub reads it once, at import).
    """
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "huggingface"
    )
    return Path(home).expanduser() / "hub"


def _torch_checkpoints() -> Path:
    """``TORCH_HOME/hub/checkpoints``, torchvision's (and timm's URL weights') cache."""
    import torch.hub  # torch is a dependency; torch.hub reads TORCH_HOME at call time

    return Path(torch.hub.get_dir()) / "checkpoints"


#: seconds a download host has to accept a connection before the caches alone are read
REACH_TIMEOUT = 3.0
#: how long a host's answer is remembered (a run resolving several specs asks once)
_REACH_MEMO_SECONDS = 60.0
_reach_memo: dict[tuple[str, int], tuple[float, str | None]] = {}


def _connect(host: str, port: int, out: list[str | None]) -> None:
    try:
        socket.create_connection((host, port), timeout=REACH_TIMEOUT).close()
        out.append(None)
    except OSError as e:
        out.append(e.strerror or str(e) or type(e).__name__)


def unreachable(url: str) -> str | None:
    """Why the host of ``url`` cannot be reached now, or ``None`` when it accepts a connection.

    One TCP connection to the host (or to the proxy ``HTTPS_PROXY`` / ``HTTP_PROXY`` names for it,
    unless ``NO_PROXY`` exempts the host), given :data:`REACH_TIMEOUT` seconds in all, the name
    look-up included (it runs in a daemon thread, so a resolver that hangs is not waited for).
    The answer is remembered for a minute.  Nothing is sent: an answering host is "reachable"
    whatever it would say to a request.
    """
    parts = urllib.parse.urlsplit(url)
    host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    proxy = urllib.request.getproxies().get(parts.scheme)
    if proxy and not urllib.request.proxy_bypass(host):
        via = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        host, port = via.hostname or host, via.port or 80
    now = time.monotonic()
    memo = _reach_memo.get((host, port))
    if memo is not None and now - memo[0] < _REACH_MEMO_SECONDS:
        return memo[1]
    out: list[str | None] = []
    worker = threading.Thread(target=_connect, args=(host, port, out), daemon=True)
    worker.start()
    worker.join(REACH_TIMEOUT + 0.5)
    if out and out[0] is None:
        why = None
    else:
        why = f"{host}:{port}: " + (out[0] if out else f"no answer in {REACH_TIMEOUT:g} s")
    _reach_memo[(host, port)] = (now, why)
    return why


def _hub_endpoint() -> str:
    """The hub huggingface_hub talks to (``HF_ENDPOINT``, read by it at import)."""
    return importlib.import_module("huggingface_hub.constants").ENDPOINT


def _say(line: str) -> None:
    """The one line a remote spec prints: what was found or fetched, and where it lies."""
    print(line, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------ parse


def _looks_local(text: str) -> bool:
    """A spec that is a path even when it does not exist (its loader then says "not found")."""
    return (
        text.startswith(("/", ".", "~"))
        or os.sep in text.replace("/", "")  # a Windows path
        or text.count("/") != 1
        or text.lower().endswith(_FILE_SUFFIXES)
    )


def parse_weights_spec(
    spec: str | os.PathLike, *, torchvision_model: str | None = None
) -> tuple[Source, str]:
    """``(source, what to fetch)`` of a spec; see the module's table.  Does not touch the disk but to
    check whether the spec is an existing path.

    ``torchvision_model``: the backbone in context (``"resnet50"``), which lets a bare enum member
    (``IMAGENET1K_V2``) name its weights.
    """
    if not isinstance(spec, str):  # a Path is always a path
        return "local", os.fspath(spec)
    if Path(spec).exists():
        return "local", spec
    for prefix, source in (("hf:", "hf"), ("timm:", "timm"), ("torchvision:", "torchvision")):
        if spec.startswith(prefix):
            rest = spec[len(prefix) :]
            if not rest:
                raise WeightsError(f"weights spec {spec!r} names nothing after {prefix!r}")
            return source, rest  # type: ignore[return-value]
    if torchvision_model and _ENUM_MEMBER.fullmatch(spec):
        return "torchvision", f"{torchvision_model}.{spec}"
    if not _looks_local(spec) and _HUB_ID.fullmatch(spec.split("@", 1)[0]):
        return "hf", spec
    return "local", spec


def _revision_ok(revision: str) -> bool:
    """A branch, tag or commit name as git allows one (``git check-ref-format``): :data:`_REVISION`'s
    characters, no ``..`` (huggingface_hub joins a revision to ``refs/``: ``pr/../../x`` would read a
    file outside it), no leading, trailing or doubled ``/``, no component that starts with ``.`` or
    ends with ``.lock``, no trailing ``.``."""
    if not _REVISION.fullmatch(revision) or ".." in revision or revision.endswith("."):
        return False
    return all(
        part and not part.startswith(".") and not part.endswith(".lock") for part in revision.split("/")
    )


def _split_revision(text: str) -> tuple[str, str | None]:
    """``"org/name@rev"`` -> ``("org/name", "rev")``; a malformed id or revision is one line."""
    repo, _, revision = text.partition("@")
    if not _HUB_ID.fullmatch(repo):
        raise WeightsError("not a Hugging Face id (expected org/name or org/name@revision)", text)
    if "@" in text and not _revision_ok(revision):
        raise WeightsError(f"not a revision ({revision!r}; expected a branch, tag or commit)", text)
    return repo, revision or None


# ------------------------------------------------------------------------------------ Hugging Face


def _repo_folder(cache: Path, repo: str) -> Path:
    """``models--org--name``: where huggingface_hub keeps one repository's refs, blobs and snapshots."""
    return cache / ("models--" + repo.replace("/", "--"))


def _in_cache(path: Path, repo: str, cache: Path, spec: str) -> Path:
    """``path`` (a snapshot folder, or a file in one) when it lies in ``repo``'s folder of the cache.

    huggingface_hub names the snapshot after the commit a ref file holds; a ref file planted in the
    cache (``../../elsewhere``) would point it at any folder.  The check is on the real path (links
    followed): a snapshot must be ``snapshots/<commit>`` itself, a file (a link to ``blobs/``) must
    stay in the repository's folder.
    """
    folder = _repo_folder(cache, repo)
    real = Path(os.path.realpath(path))
    inside = (
        real.parent == Path(os.path.realpath(folder / "snapshots"))
        if path.is_dir()
        else real.is_relative_to(os.path.realpath(folder))
    )
    if not inside:
        raise WeightsError(f"Hugging Face id {spec!r}: the snapshot lies outside the cache (a planted ref file?) "
                           f"at {real}", folder)  # fmt: skip
    return path


def _hub_error(
    e: Exception, repo: str, revision: str | None, cache: Path, offline: bool, down: str | None = None
) -> WeightsError:
    """huggingface_hub's exception as one line naming the id, the revision and the cache folder.

    ``down``: why the hub could not be reached (:func:`unreachable`), when the caches alone were read.
    """
    from huggingface_hub import errors  # huggingface_hub is present: the caller imported it

    shown = f"{repo}@{revision}" if revision else repo
    folder = _repo_folder(cache, repo)
    if isinstance(e, errors.RevisionNotFoundError):
        return WeightsError(f"the Hugging Face repository {repo!r} has no revision {revision!r}",
                            f"https://huggingface.co/{repo}")  # fmt: skip
    if isinstance(e, errors.GatedRepoError):
        return WeightsError(f"the Hugging Face repository {repo!r} is gated: accept its terms and log in "
                            "(hf auth login)", f"https://huggingface.co/{repo}")  # fmt: skip
    if isinstance(e, errors.RepositoryNotFoundError):
        return WeightsError(f"no Hugging Face repository {repo!r} (or it is private: log in with hf auth login)",
                            f"https://huggingface.co/{repo}")  # fmt: skip
    if isinstance(e, errors.EntryNotFoundError | errors.LocalEntryNotFoundError | FileNotFoundError):
        why = (
            "offline (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE)"
            if offline
            else f"the hub could not be reached ({down})"
            if down
            else "the hub could not be reached"
        )
        if revision and folder.is_dir():
            return WeightsError(f"Hugging Face id {shown!r}: revision {revision!r} is not in the cache; {why}",
                                folder)  # fmt: skip
        return WeightsError(f"Hugging Face id {shown!r} is not in the cache; {why}", folder)
    first = " ".join(str(e).split())[:160]
    return WeightsError(
        f"Hugging Face id {shown!r} could not be fetched ({type(e).__name__}: {first})", folder
    )


def _hub_failures() -> tuple[type[Exception], ...]:
    """What huggingface_hub raises for a download that cannot be done: HTTP and cache misses are
    ``OSError`` s, a bad argument a ``ValueError``, a file the repository lacks an ``EntryNotFoundError``."""
    from huggingface_hub.errors import EntryNotFoundError  # present: the caller has imported huggingface_hub

    return (OSError, ValueError, EntryNotFoundError)


def _snapshot(
    hub: ModuleType, repo: str, revision: str | None, patterns: tuple[str, ...], cache: Path
) -> Path:
    """``snapshot_download`` of the files matching ``patterns`` (the cache only when offline, or when
    the hub does not answer: :func:`unreachable`)."""
    offline = is_offline()
    down = None if offline else unreachable(_hub_endpoint())
    try:
        return Path(
            hub.snapshot_download(
                repo,
                revision=revision,
                cache_dir=cache,
                allow_patterns=list(patterns),
                local_files_only=offline or down is not None,
            )
        )
    except _hub_failures() as e:
        raise _hub_error(e, repo, revision, cache, offline, down) from None


def _fetch_hf(text: str) -> ResolvedWeights:
    """A hub snapshot holding the loaders' files (safetensors, else the pickle weights)."""
    repo, revision = _split_revision(text)
    hub = require("huggingface_hub", "hub", what=f"the Hugging Face id {text!r}")
    cache = hf_cache_dir()
    folder = _in_cache(_snapshot(hub, repo, revision, HF_ALLOW_PATTERNS, cache), repo, cache, text)
    if not any(folder.glob("*.safetensors")):  # the pickle weights only when there is no safetensors
        folder = _in_cache(_snapshot(hub, repo, revision, HF_PICKLE_PATTERNS, cache), repo, cache, text)
    files = tuple(sorted(p.name for p in folder.iterdir() if p.is_file()))
    if not files:
        raise WeightsError(f"Hugging Face id {text!r}: the snapshot holds no files", folder)
    return ResolvedWeights(folder, "hf", repo, folder.name, files, cache)


def _one_file(found: ResolvedWeights, spec: str) -> ResolvedWeights:
    """The single weights file of a snapshot, for options that read one file."""
    folder = found.path
    for name in _WEIGHT_FILES:
        if (folder / name).is_file():
            return ResolvedWeights(
                folder / name, found.source, found.id, found.revision, found.fetched, found.cache
            )
    if any(folder.glob("*.index.json")):
        raise WeightsError(f"{spec!r} is sharded; this option takes one weights file", folder)
    raise WeightsError(f"{spec!r} has neither {' nor '.join(_WEIGHT_FILES)}", folder)


# ------------------------------------------------------------------------------- timm, torchvision


def _fetch_url(url: str, what: str) -> tuple[Path, bool]:
    """``TORCH_HOME/hub/checkpoints/<basename of url>``, downloaded unless already there: ``(path, fetched)``."""
    folder = _torch_checkpoints()
    path = folder / os.path.basename(url.split("?")[0])
    if path.is_file():
        return path, False
    if is_offline():
        raise WeightsError(
            f"{what} is not in the cache; offline (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE)", path
        )
    down = unreachable(url)
    if down is not None:
        raise WeightsError(f"{what} is not in the cache; its host could not be reached ({down})", path)
    import torch.hub  # the download itself; torch is a dependency

    folder.mkdir(parents=True, exist_ok=True)
    try:
        torch.hub.download_url_to_file(url, os.fspath(path), progress=False)
    except (OSError, ValueError, RuntimeError) as e:
        raise WeightsError(f"{what} could not be downloaded from {url} ({type(e).__name__})", path) from None
    return path, True


def _fetch_timm(name: str) -> ResolvedWeights:
    """timm's pretrained weights of ``name``: its ``hf_hub_id`` in the hub cache, else its URL."""
    timm = require("timm", "timm", what=f"the timm weights {name!r}")
    cfg = timm.models.get_pretrained_cfg(name)
    if cfg is None:
        raise WeightsError(f"timm has no pretrained weights named {name!r}", "timm.list_pretrained()")
    if cfg.hf_hub_id:
        hub = require("huggingface_hub", "hub", what=f"the timm weights {name!r}")
        repo, revision = _split_revision(cfg.hf_hub_id)
        cache, offline = hf_cache_dir(), is_offline()
        down = None if offline else unreachable(_hub_endpoint())
        names = [cfg.hf_hub_filename] if cfg.hf_hub_filename else list(_WEIGHT_FILES)
        last: Exception | None = None
        for filename in names:
            try:
                path = Path(hub.hf_hub_download(repo, filename, revision=revision, cache_dir=cache,
                                                local_files_only=offline or down is not None))  # fmt: skip
            except _hub_failures() as e:  # this file name is not there: try the next
                last = e
                continue
            _in_cache(path, repo, cache, cfg.hf_hub_id)
            return ResolvedWeights(path, "timm", name, path.parent.name, (filename,), cache)
        raise _hub_error(last, repo, revision, cache, offline, down)  # type: ignore[arg-type]
    if cfg.url:
        path, _ = _fetch_url(cfg.url, f"timm weights {name!r}")
        return ResolvedWeights(path, "timm", name, None, (path.name,), path.parent)
    raise WeightsError(
        f"timm names no weights file for {name!r} (no hf_hub_id or url)", "timm.list_pretrained()"
    )


def _fetch_torchvision(text: str) -> ResolvedWeights:
    """``resnet50.IMAGENET1K_V2`` or ``ResNet50_Weights.IMAGENET1K_V2`` -> torchvision's file in ``TORCH_HOME``."""
    models = require("torchvision.models", "vision", what=f"the torchvision weights {text!r}")
    model, _, member = text.rpartition(".")
    try:
        enum = (
            models.get_weight(text) if model.endswith("_Weights") else models.get_model_weights(model)[member]
        )
    except (KeyError, ValueError, AttributeError):
        raise WeightsError(f"torchvision has no weights {text!r} (e.g. resnet50.IMAGENET1K_V2)",
                           "torchvision.models.list_models()") from None  # fmt: skip
    shown = f"{type(enum).__name__}.{enum.name}"
    path, _ = _fetch_url(enum.url, f"torchvision weights {shown}")
    return ResolvedWeights(path, "torchvision", shown, None, (path.name,), path.parent)


# ---------------------------------------------------------------------------------------- resolve


def resolve_weights(
    spec: str | os.PathLike, *, kind: Kind = "folder", torchvision_model: str | None = None
) -> ResolvedWeights:
    """The file or folder on disk that ``spec`` names (see the module's table); fetched only when remote.

    Args:
        spec: a local path, ``org/name[@revision]`` (or ``hf:org/name``), ``timm:NAME``,
            ``torchvision:model.MEMBER`` / ``torchvision:Enum_Weights.MEMBER``.
        kind: what the caller reads: ``"folder"`` (a Hugging Face model folder: the snapshot) or
            ``"file"`` (one weights file: the snapshot's ``model.safetensors``, else
            ``pytorch_model.bin``).  A timm or torchvision spec is always one file.
        torchvision_model: the backbone in context (``"resnet50"``): a bare ``IMAGENET1K_V2`` names its weights.

    A local spec is returned as it is, existing or not (the loader checks it, as before).

    Raises:
        WeightsError: one line: an id not in the cache while offline (naming the id and the cache
            folder), a revision or repository the hub lacks, a snapshot without the file asked for,
            an unknown timm / torchvision name.
        MissingDependency: a hub id without huggingface_hub (``pip install 'peg-core[hub]'``), a timm
            name without timm.
    """
    if kind not in ("file", "folder"):
        raise ValueError(f"kind must be 'file' or 'folder'; got {kind!r}")
    source, text = parse_weights_spec(spec, torchvision_model=torchvision_model)
    if source == "local":
        return ResolvedWeights(Path(spec))
    if source == "hf":
        try:
            found = _fetch_hf(text)
        except WeightsError as e:
            if os.fspath(spec).startswith("hf:"):
                raise
            # a bare org/name may have been meant as a relative path: say that none exists either
            raise WeightsError(f"{e.what} (and there is no local path {text!r})", e.where) from None
        if kind == "file":
            found = _one_file(found, text)
    elif source == "timm":
        found = _fetch_timm(text)
    else:
        found = _fetch_torchvision(text)
    at = f"@{found.revision[:12]}" if found.revision else ""
    _say(f"weights {spec}: {found.source} {found.id}{at} ({', '.join(found.fetched)}) in {found.path}")
    return found


def resolve_path_arg(
    value: str | os.PathLike | None, *, kind: Kind, torchvision_model: str | None = None
) -> Path | None:
    """A weights option's value as the local path its loader reads (:func:`resolve_weights`); ``None`` stays.

    The command lines resolve their options right after parsing (through :func:`resolve_weights_arg`,
    which also keeps the text typed for the run's record), so everything after sees a local path
    exactly as before.  ``argparse``'s ``type=Path`` has already
    turned the value into a ``Path``; its text is what the user named.
    """
    if value is None:
        return None
    return resolve_weights(os.fspath(value), kind=kind, torchvision_model=torchvision_model).path


def resolve_weights_arg(args: object, dest: str, *, kind: Kind, torchvision_model: str | None = None) -> None:
    """``args.<dest>`` (a parsed weights option) -> the local path its loader reads, in place (:func:`resolve_path_arg`).

    A remote spec's text as typed (``"org/name@rev"``) is kept in ``args.weights_as_typed[dest]``
    (:data:`~peg_core.interop.io.WEIGHTS_AS_TYPED`): the run's ``args.json`` and checkpoint record it as
    ``dest`` and the resolved path as ``<dest>_path`` (:func:`peg_core.engine.cli.json_safe`), so the
    command re-run or resumed from them names the same id again, read from the cache.
    """
    value = getattr(args, dest, None)
    if value is None:
        return
    found = resolve_weights(os.fspath(value), kind=kind, torchvision_model=torchvision_model)
    setattr(args, dest, found.path)
    if found.remote:
        typed = dict(getattr(args, WEIGHTS_AS_TYPED, None) or {})
        setattr(args, WEIGHTS_AS_TYPED, {**typed, dest: os.fspath(value)})


# ------------------------------------------------------------------------------- the model tables


@dataclass(frozen=True)
class PublicModel:
    """One row of ``python -m <package> models``: public weights a family reads, and how to fine-tune them.

    ``family`` names the config layout the tests build (tiny random copies, offline), ``id`` is what
    ``--init`` takes, ``accuracy`` / ``source`` the published number and where it is published
    (``"—"`` when no source is at hand: no number is made up), ``command`` the fine-tuning run with a PEG.
    """

    family: str
    id: str
    accuracy: str
    source: str
    command: str


#: the closing note of every ``models`` table
PUBLIC_MODELS_NOTE = (
    "Ids are what --init takes (fetched once into the Hugging Face cache; HF_HUB_OFFLINE=1: the cache "
    "only); the tests build each family's config layout as a tiny random folder, offline. Accuracy as "
    "published by the source named; — where no source is at hand."
)


def format_public_models(rows: tuple[PublicModel, ...], note: str = PUBLIC_MODELS_NOTE) -> str:
    """The rows as plain text, one block per family: id, published accuracy and source, then the command."""
    width = max(len(r.id) for r in rows)
    blocks = []
    for family in dict.fromkeys(r.family for r in rows):
        block = [family]
        for r in (r for r in rows if r.family == family):
            published = f"{r.accuracy}  ({r.source})" if r.source != "—" else "—"
            block += [f"  {r.id:<{width}}  {published}", f"      {r.command}"]
        blocks.append("\n".join(block))
    text = "\n\n".join(blocks)
    return f"{text}\n\n{note}" if note else text
