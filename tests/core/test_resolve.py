"""``peg_core.interop.resolve_weights``: local paths as before, hub ids / timm names / torchvision enums from
caches laid out as their libraries lay them out, offline (``HF_HUB_OFFLINE=1``); every failure one line."""

from __future__ import annotations

import argparse
import os
import pickle
import sys
from pathlib import Path

import pytest
import torch

import peg_core.interop.resolve as resolve
from peg_core.engine.cli import json_safe
from peg_core.errors import MissingDependency
from peg_core.interop import WeightsError, read_hf_weights
from peg_core.interop.resolve import (
    HF_ALLOW_PATTERNS,
    HF_PICKLE_PATTERNS,
    ResolvedWeights,
    hf_cache_dir,
    parse_weights_spec,
    resolve_path_arg,
    resolve_weights,
    resolve_weights_arg,
)
from tests.hub_cache import commit_of, offline_caches, put_in_hf_cache

safetensors = pytest.importorskip("safetensors.torch")
hub = pytest.importorskip("huggingface_hub")


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    return offline_caches(tmp_path, monkeypatch)


def _tiny_folder(tmp_path, name="tiny"):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "detr"}')
    safetensors.save_file({"w": torch.arange(6.0).reshape(2, 3)}, str(folder / "model.safetensors"))
    return folder


def _one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert "\n" not in text, text
    return text


def test_local_paths_are_returned_as_they_are(tmp_path, capsys):
    folder = _tiny_folder(tmp_path)
    for spec in (folder, str(folder), str(folder / "model.safetensors")):
        found = resolve_weights(spec, kind="file")
        assert (
            found == ResolvedWeights(type(found.path)(spec)) and found.source == "local" and not found.remote
        )
    # a missing local path stays a path: the loader says "not found" as before
    for spec in ("runs/x.pth", "./org/name", "/abs/org/name", "a/b/c", "name", "org/name.safetensors"):
        assert parse_weights_spec(spec)[0] == "local", spec
    assert resolve_path_arg(None, kind="file") is None
    assert capsys.readouterr().err == ""  # nothing said for local paths


def test_spec_forms():
    assert parse_weights_spec("PekingU/rtdetr_r50vd") == ("hf", "PekingU/rtdetr_r50vd")
    assert parse_weights_spec("org/name@v1.0") == ("hf", "org/name@v1.0")
    assert parse_weights_spec("hf:org/name") == ("hf", "org/name")
    assert parse_weights_spec("timm:vit_small_patch16_224") == ("timm", "vit_small_patch16_224")
    assert parse_weights_spec("torchvision:resnet50.IMAGENET1K_V2") == (
        "torchvision",
        "resnet50.IMAGENET1K_V2",
    )
    assert parse_weights_spec("IMAGENET1K_V2", torchvision_model="resnet50") == (
        "torchvision",
        "resnet50.IMAGENET1K_V2",
    )
    assert parse_weights_spec("IMAGENET1K_V2")[0] == "local"  # no backbone in context: a path
    with pytest.raises(WeightsError, match="names nothing"):
        parse_weights_spec("timm:")


def test_hub_id_from_the_cache_offline(hf_home, tmp_path, capsys):
    snapshot = put_in_hf_cache(hf_home, "org/tiny", _tiny_folder(tmp_path))
    # the layout is huggingface_hub's own: its scanner and cache lookup find the files
    repos = {r.repo_id: r for r in hub.scan_cache_dir(hf_home).repos}
    assert repos["org/tiny"].nb_files == 2 and {r.commit_hash for r in repos["org/tiny"].revisions} == {
        snapshot.name
    }
    assert hub.try_to_load_from_cache("org/tiny", "config.json", cache_dir=hf_home) == str(
        snapshot / "config.json"
    )
    assert hf_cache_dir() == hf_home
    found = resolve_weights("org/tiny", kind="folder")
    assert (found.path, found.source, found.id, found.revision) == (snapshot, "hf", "org/tiny", snapshot.name)
    assert found.fetched == ("config.json", "model.safetensors") and found.cache == hf_home
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "org/tiny" in err and str(snapshot) in err
    assert resolve_weights("org/tiny", kind="file").path == snapshot / "model.safetensors"
    assert resolve_weights(f"org/tiny@{snapshot.name}").path == snapshot  # a commit
    assert resolve_weights("hf:org/tiny@main").path == snapshot  # a branch
    state, _ = read_hf_weights(found.path)
    torch.testing.assert_close(state["w"], torch.arange(6.0).reshape(2, 3))


def test_hub_cache_from_hf_hub_cache_variable(tmp_path, monkeypatch):
    cache = tmp_path / "elsewhere"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    snapshot = put_in_hf_cache(cache, "org/tiny", _tiny_folder(tmp_path))
    assert resolve_weights("org/tiny").path == snapshot


def test_missing_id_offline_is_one_line_naming_id_and_cache(hf_home):
    with pytest.raises(WeightsError) as e:
        resolve_weights("org/absent")
    text = _one_line(e)
    assert "'org/absent' is not in the cache" in text and "offline" in text
    assert str(hf_home / "models--org--absent") in text


def test_bad_revision_is_one_line(hf_home, tmp_path):
    put_in_hf_cache(hf_home, "org/tiny", _tiny_folder(tmp_path))
    with pytest.raises(WeightsError) as e:
        resolve_weights("org/tiny@no-such-branch")
    text = _one_line(e)
    assert "revision 'no-such-branch' is not in the cache" in text and "models--org--tiny" in text
    with pytest.raises(WeightsError, match="not a revision"):
        resolve_weights("org/tiny@bad revision")


class _Payload:
    """Unpickling this runs ``open(marker, "w")``: a weights file must never do that."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_pickle_only_snapshot_with_a_payload_is_refused(hf_home, tmp_path):
    marker = tmp_path / "executed"
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text('{"model_type": "detr"}')
    (bad / "pytorch_model.bin").write_bytes(pickle.dumps({"w": _Payload(marker)}, protocol=2))
    put_in_hf_cache(hf_home, "org/pickled", bad)
    found = resolve_weights("org/pickled")
    assert found.fetched == ("config.json", "pytorch_model.bin")
    assert resolve_weights("org/pickled", kind="file").path.name == "pytorch_model.bin"
    with pytest.raises(WeightsError) as e:
        read_hf_weights(found.path)
    assert "refused" in _one_line(e)
    assert not marker.exists()  # nothing executed


def test_torchvision_enum_from_torch_home(hf_home, tmp_path, capsys):
    tv = pytest.importorskip("torchvision.models")
    url = tv.get_model_weights("resnet18")["IMAGENET1K_V1"].url
    path = tmp_path / "torch_home" / "hub" / "checkpoints" / url.rsplit("/", 1)[1]
    path.parent.mkdir(parents=True)
    torch.save({"fc.bias": torch.zeros(3)}, path)
    for spec, context in (
        ("torchvision:resnet18.IMAGENET1K_V1", None),
        ("torchvision:ResNet18_Weights.IMAGENET1K_V1", None),
        ("IMAGENET1K_V1", "resnet18"),
    ):
        found = resolve_weights(spec, kind="file", torchvision_model=context)
        assert (found.path, found.source, found.id) == (path, "torchvision", "ResNet18_Weights.IMAGENET1K_V1")
    with pytest.raises(WeightsError) as e:  # not in TORCH_HOME, offline
        resolve_weights("torchvision:resnet34.IMAGENET1K_V1")
    assert "not in the cache" in _one_line(e) and "checkpoints" in _one_line(e)
    with pytest.raises(WeightsError, match="torchvision has no weights"):
        resolve_weights("torchvision:resnet18.NOPE")


def test_timm_name_from_its_hub_cache(hf_home, tmp_path):
    timm = pytest.importorskip("timm")
    cfg = timm.models.get_pretrained_cfg("vit_tiny_patch16_224")
    repo, _, _ = cfg.hf_hub_id.partition("@")
    put_in_hf_cache(hf_home, repo, {"model.safetensors": _tiny_folder(tmp_path) / "model.safetensors"})
    found = resolve_weights("timm:vit_tiny_patch16_224", kind="file")
    assert (
        found.source == "timm"
        and found.path.name == "model.safetensors"
        and found.revision == commit_of(repo)
    )
    with pytest.raises(WeightsError) as e:  # another tag of the same model: not in the cache
        resolve_weights("timm:vit_tiny_patch16_224.augreg_in21k")
    assert "is not in the cache" in _one_line(e)
    with pytest.raises(WeightsError, match="timm has no pretrained weights named"):
        resolve_weights("timm:no_such_model_xyz")


def test_hub_id_without_huggingface_hub_names_the_extra(hf_home, monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails: not installed
    with pytest.raises(MissingDependency) as e:
        resolve_weights("org/tiny")
    assert "pip install 'peg-core[hub]'" in _one_line(e) and "org/tiny" in _one_line(e)


TIMM_NAME = "vit_tiny_patch16_224"


@pytest.fixture
def timm_cache(hf_home, tmp_path):
    """timm's pretrained weights of :data:`TIMM_NAME` (random) where timm keeps them: its hub repo."""
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model(TIMM_NAME, pretrained=False, num_classes=4)
    local = tmp_path / "timm.safetensors"
    safetensors.save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(local))
    repo = timm.models.get_pretrained_cfg(TIMM_NAME).hf_hub_id
    snapshot = put_in_hf_cache(hf_home, repo, {"model.safetensors": local, "config.json": b"{}"})
    return repo, snapshot / "model.safetensors", local


def test_init_timm_names_resolve_from_the_cache(timm_cache, tmp_path):
    from peg_core import from_timm_file
    from peg_core.classify import cli
    from peg_core.classify.model import read_init

    repo, cached, local = timm_cache
    want = read_init(local, TIMM_NAME)
    run = ["--img-size", "32", "--num-train", "8", "--num-val", "8", "--batch-size", "8", "--epochs", "1",
           "--workers", "0", "--threads", "1", "--no-progress", "--device", "cpu"]  # fmt: skip
    for init in (["--init", f"timm:{TIMM_NAME}"], ["--init", repo, "--init-timm", TIMM_NAME]):
        args = cli.parse_train_args([*run, *init])
        assert (args.init, args.init_timm) == (cached, TIMM_NAME)
        got = read_init(args.init, args.init_timm)
        assert got.config == want.config and got.state.keys() == want.state.keys()
        for k, v in want.state.items():
            torch.testing.assert_close(got.state[k], v, rtol=0, atol=0, msg=k)
    assert read_init(f"timm:{TIMM_NAME}").config == want.config  # read_init takes the names too
    for path in (None, f"timm:{TIMM_NAME}", repo):  # the library takes the same names
        torch.testing.assert_close(
            from_timm_file(TIMM_NAME, path).state_dict(), from_timm_file(TIMM_NAME, local).state_dict()
        )
    report = cli.train([*run, "--init", f"timm:{TIMM_NAME}", "--output-dir", str(tmp_path / "run")])
    assert report["status"] == "finished"


def test_classify_init_missing_id_is_one_line(hf_home, tmp_path, capsys):
    from peg_core.__main__ import main

    code = main(["train", "--output-dir", str(tmp_path / "o"), "--init", "org/absent"])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and "'org/absent' is not in the cache" in err, err
    assert str(hf_home / "models--org--absent") in err


@pytest.mark.parametrize("package", ["peg_core", "peg_detr", "peg_video"])
def test_models_tables_print_and_their_commands_parse(package, capsys):
    """``python -m <package> models``: every row's command parses with the package's train parser."""
    import importlib
    import shlex

    from peg_core.engine.cli import parse_with_config

    main = importlib.import_module(f"{package}.__main__").main
    cli = importlib.import_module("peg_core.classify.cli" if package == "peg_core" else f"{package}.cli")
    configs = importlib.import_module(
        "peg_core.classify.configs" if package == "peg_core" else f"{package}.configs"
    )
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for row in configs.PUBLIC_MODELS:
        assert row.id in out and row.command in out and (row.accuracy == "—") == (row.source == "—")
        argv = shlex.split(row.command)
        assert argv[:4] == ["python", "-m", package, "train"]
        parse_with_config(cli.build_train_parser(), argv[4:], configs.CONFIGS)  # flags, choices, recipe names
        if row.id.startswith("timm:"):  # a name timm has pretrained weights for
            assert pytest.importorskip("timm").models.get_pretrained_cfg(row.id[len("timm:") :]) is not None


def test_online_fetch_asks_for_the_loaders_files_only(hf_home, tmp_path, monkeypatch):
    """Online (no HF_HUB_OFFLINE): safetensors and configs first; the pickle weights only without safetensors.

    ``snapshot_download`` is replaced by a recorder that serves the cache (the machines are offline).
    """
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(resolve, "unreachable", lambda url: None)  # the hub "answers": the recorder serves it
    put_in_hf_cache(hf_home, "org/tiny", _tiny_folder(tmp_path))
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    torch.save({"w": torch.zeros(1)}, pickled / "pytorch_model.bin")
    put_in_hf_cache(hf_home, "org/pickled", pickled)
    calls = []
    real = hub.snapshot_download

    def recorder(repo_id, **kw):
        calls.append((repo_id, tuple(kw["allow_patterns"]), kw["local_files_only"], kw["cache_dir"]))
        return real(repo_id, **{**kw, "local_files_only": True})

    monkeypatch.setattr(hub, "snapshot_download", recorder)
    resolve_weights(str(tmp_path / "pickled" / "pytorch_model.bin"))  # a local path: nothing asked
    assert calls == []
    resolve_weights("org/tiny")
    assert calls == [("org/tiny", HF_ALLOW_PATTERNS, False, hf_home)]
    calls.clear()
    assert resolve_weights("org/pickled", kind="file").path.name == "pytorch_model.bin"
    assert [c[1] for c in calls] == [HF_ALLOW_PATTERNS, HF_PICKLE_PATTERNS]
    assert "*.bin" not in " ".join(HF_ALLOW_PATTERNS)


def test_a_bare_id_that_is_no_path_either_says_so(hf_home):
    with pytest.raises(WeightsError, match=r"no local path 'runs/exp1'"):
        resolve_weights("runs/exp1")
    with pytest.raises(WeightsError) as e:
        resolve_weights("hf:org/absent")
    assert "local path" not in str(e.value)


@pytest.mark.parametrize(
    "error, message",
    [
        ("RevisionNotFoundError", "the Hugging Face repository 'org/tiny' has no revision 'v9'"),
        ("RepositoryNotFoundError", "no Hugging Face repository 'org/tiny'"),
        ("GatedRepoError", "is gated"),
    ],
)
def test_hub_answers_are_one_line(hf_home, monkeypatch, error, message):
    """What the hub answers online (a revision or repository it lacks, a gated one), as one line."""
    from huggingface_hub import errors

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(resolve, "unreachable", lambda url: None)  # the hub answers (with the error below)
    cls = getattr(errors, error)
    raised = cls.__new__(cls)  # its __init__ wants an HTTP response; the message is all that is read
    Exception.__init__(raised, "404 Client Error")

    def refuse(*_, **__):
        raise raised

    monkeypatch.setattr(hub, "snapshot_download", refuse)
    with pytest.raises(WeightsError) as e:
        resolve_weights("org/tiny@v9")
    assert message in _one_line(e) and "https://huggingface.co/org/tiny" in _one_line(e)


def test_a_run_records_the_id_typed_and_the_path_apart(hf_home, tmp_path):
    """``resolve_weights_arg``: the option becomes the local path; ``json_safe`` (``args.json``, the
    checkpoint's ``args``) records the text typed under the option and the path under ``<dest>_path``."""
    snapshot = put_in_hf_cache(hf_home, "org/tiny", _tiny_folder(tmp_path))
    local = _tiny_folder(tmp_path, "local")
    args = argparse.Namespace(init=Path("org/tiny@main"), backbone_weights=local, other=None)
    resolve_weights_arg(args, "init", kind="folder")
    resolve_weights_arg(args, "backbone_weights", kind="file")
    resolve_weights_arg(args, "other", kind="file")
    assert args.init == snapshot and args.backbone_weights == local and args.other is None
    record = json_safe(args)
    assert record == {
        "init": "org/tiny@main",
        "init_path": str(snapshot),
        "backbone_weights": str(local),  # a local path is recorded as it is, with no second key
        "other": None,
    }
    assert json_safe(record) == record  # a recorded run re-recorded (a resumed run's args) is unchanged


def test_a_revision_is_a_branch_tag_or_commit_as_git_allows(hf_home, tmp_path):
    """huggingface_hub joins a revision to ``refs/``: ``..`` in it would read a ref file outside."""
    (hf_home / "models--org--tiny" / "refs" / "pr").mkdir(parents=True)
    snapshot = put_in_hf_cache(hf_home, "org/tiny", _tiny_folder(tmp_path), revision="pr/1")
    assert resolve_weights("hf:org/tiny@pr/1").path == snapshot  # a ref with a slash is fine
    for bad in (
        "pr/../../evil_ref",
        "..",
        "a//b",
        "main/",
        "/main",
        ".hidden",
        "a/.b",
        "v1.lock",
        "main.",
        "a b",
    ):
        with pytest.raises(WeightsError, match="not a revision") as e:
            resolve_weights(f"hf:org/tiny@{bad}")
        assert bad in _one_line(e)


def test_a_planted_ref_cannot_take_the_snapshot_out_of_the_cache(hf_home, tmp_path):
    """A ref file (``refs/main``, or one a ``..`` revision reaches) that names a folder outside the cache:
    refused, not loaded from there."""
    put_in_hf_cache(hf_home, "org/rt", _tiny_folder(tmp_path))
    outside = _tiny_folder(tmp_path, "outside")
    root = hf_home / "models--org--rt"
    (root / "refs" / "pr").mkdir()
    (root / "evil_ref").write_text(os.path.relpath(outside, root / "snapshots"))
    with pytest.raises(WeightsError, match="not a revision"):  # it once reached refs/pr/../../evil_ref
        resolve_weights("hf:org/rt@pr/../../evil_ref", kind="folder")
    (root / "refs" / "main").write_text(os.path.relpath(outside, root / "snapshots"))
    for spec in ("hf:org/rt", "org/rt@main"):
        with pytest.raises(WeightsError, match="lies outside the cache") as e:
            resolve_weights(spec, kind="folder")
        assert str(outside) in _one_line(e)
