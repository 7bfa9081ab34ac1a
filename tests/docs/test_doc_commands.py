"""Every fenced ```bash / ```sh / ```python block of README.md and docs/*.md is executed or checked.

* ``python`` blocks run for real: all blocks of one file, in order, in one
  subprocess (``python -c``, through :mod:`tests.prewarmed`; the repository on ``PYTHONPATH``), each
  in a fresh namespace; a failure names the file and the block's line.  They run in the working
  directory where the file's own commands ran, beside what README.md's
  commands created (``runs/detr_tiny`` ...): a block reads what a documented
  command makes, never a file made for the test (:func:`test_python_blocks_read_what_commands_make`).
* shell commands (one per line; ``\\`` continuations joined, ``#`` comments
  dropped) are classified by :func:`classify`, then :func:`plan`:

  - ``run``: cheap commands run for real, in order, in one tmp working
    directory per file, each ``python -m`` in a process of its own (forked from one that imported
    torch and torchvision already: :mod:`tests.prewarmed`) (so ``make-data`` can feed a later command), after
    :data:`FIXTURES` created the downloads the docs refer to;
  - ``produce``: a ``train`` (not under ``torchrun``) whose ``--output-dir``
    a later ``run`` command or a ``python`` block reads runs for real too, as
    written but for :data:`SUBSTITUTIONS` (so ``predict`` and the Predictor
    blocks read a checkpoint the docs' own commands trained);
  - ``parse``: commands that need a GPU, real COCO / Kinetics, or ``torchrun``
    (its launcher options are stripped) are fed to the module's own argparse
    parser, so every flag, choice and config name they use must exist; so are
    the ``--quick`` runs of the study and the GPU check, which
    ``tests/tools/test_study.py`` and ``test_gpu_check.py`` run for real
    (:data:`COVERED`);
  - ``skip``: the ``make`` targets (``make test`` / ``make test-fast`` are this suite;
    ``make demo`` is covered by ``tests/tools/test_demo.py``) and the install
    lines (``pip``: the Makefile's set-up runs the same installs, and
    ``tests/core/test_packaging.py`` builds the wheels).

  A command the harness cannot classify fails the test, so a new command in
  the docs needs a rule here.

Placeholders: docs use real-looking names for files a user downloads, and the
fixtures make them (see :data:`FIXTURES`: a DeiT checkpoint, a Hugging Face
VideoMAE folder; nothing a documented command makes), and the hub ids they name
(:data:`HUB_FIXTURES`) are tiny random folders in an offline hub cache made for
the parse; :data:`SUBSTITUTIONS`
rewrites the few arguments that would be too slow to run as written (none of
them changes which flags are used).  The README says so where its Python
blocks read those runs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import textwrap
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import pytest

from tests.detr.rtdetr_checks import tiny_rtdetr_config
from tests.prewarmed import Prewarmed

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(bash|sh|python)[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)

#: (module, regex, replacement) applied to the ``run`` / ``produce`` commands of that module before they
#: execute (the README says so where its blocks read the result)
SUBSTITUTIONS: list[tuple[str, str, str]] = [
    # synthetic videos: enough to check the layout and train a few steps, seconds to write
    ("peg_video", r"--num-train \d+", "--num-train 6"),
    ("peg_video", r"--num-val \d+", "--num-val 6"),
    # the tiny DETR: 2 epochs give the checkpoint predict and the Predictor blocks read, 30 take a minute
    ("peg_detr", r"--epochs \d+", "--epochs 2"),
    # the README's detection quick-start is the demo's 1024-image set: 16 + 8 images train every family in seconds
    ("peg_detr", r"--num-train \d+", "--num-train 16"),
    ("peg_detr", r"--num-val \d+", "--num-val 8"),
    # the README's classifier quick-start is the demo's recipe (minutes): its smoke version, 512 images, 2 epochs
    ("peg_core", r"--config demo\b", "--config demo_quick"),
]


def _env() -> dict[str, str]:
    # One intra-op thread: on a shared 2-core machine OpenMP spinning makes tiny ops much slower with 2.
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}


# ------------------------------------------------------------------------------------------ extraction


def blocks(path: Path) -> list[tuple[str, int, str]]:
    """``(language, first line number, code)`` of each fenced bash/sh/python block."""
    text = path.read_text()
    out = []
    for m in FENCE.finditer(text):
        line = text.count("\n", 0, m.start(2)) + 1
        out.append(("python" if m.group(1) == "python" else "sh", line, m.group(2)))
    return out


def shell_commands(code: str) -> list[list[str]]:
    """Commands of a shell block as argv lists (continuations joined, comments dropped)."""
    joined = re.sub(r"\\\n", " ", code)
    return [argv for line in joined.splitlines() if (argv := shlex.split(line, comments=True))]


# -------------------------------------------------------------------------------------- classification


# (module, first argument or None) -> argparse check of the remaining arguments
def _detr_train(argv: list[str]) -> None:
    from peg_detr.cli import parse_train_args

    parse_train_args(argv)


def _detr_eval(argv: list[str]) -> None:
    from peg_detr.cli import parse_eval_args

    parse_eval_args(argv)


def _core_train(argv: list[str]) -> None:
    from peg_core.classify.cli import CONFIGS, build_train_parser
    from peg_core.engine import parse_with_config

    parse_with_config(build_train_parser(), argv, CONFIGS)


def _core_eval(argv: list[str]) -> None:
    from peg_core.classify.cli import build_eval_parser

    build_eval_parser().parse_args(argv)


def _video_train(argv: list[str]) -> None:
    from peg_video.cli import parse_train_args

    parse_train_args(argv)


def _video_eval(argv: list[str]) -> None:
    from peg_video.cli import build_eval_parser

    build_eval_parser().parse_args(argv)


def _study(argv: list[str]) -> None:
    from tools.study import build_parser

    build_parser().parse_args(argv)


def _gpu_check(argv: list[str]) -> None:
    """``tools/gpu_check.py`` builds its parser inside ``main``: stop ``main`` right after parsing."""
    import tools.gpu_check as gpu_check

    class Parsed(Exception):
        pass

    real_parse = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        raise Parsed(real_parse(self, args, namespace))

    with mock.patch.object(argparse.ArgumentParser, "parse_args", parse_then_stop), pytest.raises(Parsed):
        gpu_check.main(argv)


def _video_export_hf(argv: list[str]) -> None:
    from peg_video.cli import build_export_hf_parser

    build_export_hf_parser().parse_args(argv)


PARSERS: dict[tuple[str, str | None], Callable[[list[str]], None]] = {
    ("peg_video", "export-hf"): _video_export_hf,
    ("peg_detr", "train"): _detr_train,
    ("peg_detr", "eval"): _detr_eval,
    ("peg_video", "train"): _video_train,
    ("peg_video", "eval"): _video_eval,
    ("peg_core", "train"): _core_train,
    ("peg_core", "eval"): _core_eval,
    ("tools.study", None): _study,
    ("tools.gpu_check", None): _gpu_check,
}

#: commands cheap enough to run as written (module, first argument or None, required flag or None)
RUNNABLE: list[tuple[str, str | None, str | None]] = [
    ("peg_detr", "make-data", None),
    ("peg_detr", "export", None),
    ("peg_video", "export", None),
    ("peg_core", "models", None),
    ("peg_detr", "models", None),
    ("peg_video", "models", None),
    ("peg_detr", "predict", None),
    ("peg_video", "make-data", None),
    ("peg_core", "resize-pos-embed", None),
    ("peg_core", "make-data", None),
    ("peg_core", "configs", None),
    ("peg_detr", "configs", None),
    ("peg_video", "configs", None),
]
#: cheap commands that a dedicated test already runs for real (same flags): only parsed here, to keep
#: the suite's time down
COVERED = {
    "tools.study": "tests/tools/test_study.py (--quick, every task)",
    "tools.gpu_check": "tests/tools/test_gpu_check.py (--device cpu --quick)",
}
SKIPPED = {("make", "demo"), ("make", "test"), ("make", "test-fast")}


def _is_install(argv: list[str]) -> bool:
    """``pip ...`` / ``python -m pip ...``: set-up, as the Makefile does it (skipped, see the module doc)."""
    return argv[0] == "pip" or (argv[0] in ("python", "python3") and argv[1:3] == ["-m", "pip"])


def _module_argv(argv: list[str]) -> tuple[str, list[str], bool]:
    """``(module, its arguments, launched by torchrun)`` of a python / torchrun command line."""
    launcher = argv[0]
    if launcher not in ("python", "python3", "torchrun"):
        raise ValueError(f"not a python or torchrun command: {shlex.join(argv)}")
    rest = argv[1:]
    if "-m" in rest:
        i = rest.index("-m")
        return rest[i + 1], rest[i + 2 :], launcher == "torchrun"
    scripts = [i for i, a in enumerate(rest) if a.endswith(".py")]
    if not scripts:
        raise ValueError(f"no module or script in: {shlex.join(argv)}")
    i = scripts[0]
    return rest[i].removesuffix(".py").replace("/", "."), rest[i + 1 :], launcher == "torchrun"


def classify(argv: list[str]) -> tuple[str, str, list[str]]:
    """``(kind, module, args)`` with kind ``run`` / ``parse`` / ``skip``; ValueError when unknown."""
    if tuple(argv) in SKIPPED or _is_install(argv):
        return "skip", argv[0], argv[1:]
    module, args, torchrun = _module_argv(argv)
    sub = args[0] if args and not args[0].startswith("-") else None
    if not torchrun:
        for mod, first, flag in RUNNABLE:
            if mod == module and first == sub and (flag is None or flag in args):
                return "run", module, args
    for (mod, first), _ in PARSERS.items():
        if mod == module and (first is None or first == sub):
            return "parse", module, args
    raise ValueError(
        f"the doc harness has no rule for: {shlex.join(argv)} (add one to {Path(__file__).name})"
    )


def check_parse(module: str, args: list[str]) -> None:
    shown = shlex.join([module, *args])
    sub = args[0] if args and not args[0].startswith("-") else None
    if sub is not None and (module, sub) in PARSERS:  # a subcommand: its parser gets the rest
        fn, args = PARSERS[(module, sub)], args[1:]
    else:
        fn = PARSERS[(module, None)]
    try:
        fn(args)
    except SystemExit as e:
        raise AssertionError(f"argparse rejected `{shown}` (exit {e.code})") from None


#: verbs that write a folder a later command or block may read: (module, verb) -> the flag naming it
PRODUCERS: dict[tuple[str, str], str] = {
    ("peg_core", "train"): "--output-dir",
    ("peg_detr", "train"): "--output-dir",
    ("peg_video", "train"): "--output-dir",
}


def _output_of(module: str, args: list[str]) -> str | None:
    """The folder a producer command writes (its ``--output-dir``), else None."""
    sub = args[0] if args and not args[0].startswith("-") else None
    flag = PRODUCERS.get((module, sub)) if sub is not None else None
    if flag is None or flag not in args[:-1]:
        return None
    return args[args.index(flag) + 1].rstrip("/")


def _reads(text: str, folder: str) -> bool:
    """``text`` (an argument or a python block) names ``folder`` or a path inside it."""
    return re.search(rf"(?<![\w/.-]){re.escape(folder)}(?![\w.-])", text) is not None


def plan(
    commands: list[tuple[int, list[str]]], readers: list[str]
) -> list[tuple[int, list[str], str, str, list[str]]]:
    """``(line, argv, kind, module, args)`` per command, kind ``run`` / ``produce`` / ``parse`` / ``skip``.

    A ``train`` (not under ``torchrun``) is ``produce``d, that is run for real, when a later ``run`` or
    ``produce`` command or one of ``readers`` (the python blocks that run beside these commands) reads its
    ``--output-dir``; decided from the last command back, so a chain of runs is followed.
    """
    out: list[tuple[int, list[str], str, str, list[str]]] = []
    later: list[str] = list(readers)
    for line, argv in reversed(commands):
        kind, module, args = classify(argv)
        folder = _output_of(module, args) if kind == "parse" and argv[0] != "torchrun" else None
        if folder is not None and any(_reads(text, folder) for text in later):
            kind = "produce"
        if kind in ("run", "produce"):
            later.append(shlex.join(args))
        out.append((line, argv, kind, module, args))
    return out[::-1]


# ------------------------------------------------------------------------------------------- fixtures


def _deit_checkpoint(path: Path) -> None:
    """A timm/DeiT-tiny-shaped state dict (224 px, patch 16: a 14x14 table plus the class token)."""
    import torch

    g = torch.Generator().manual_seed(0)
    sd = {
        "cls_token": torch.randn(1, 1, 192, generator=g),
        "pos_embed": torch.randn(1, 1 + 14 * 14, 192, generator=g),
        "patch_embed.proj.weight": torch.randn(192, 3, 16, 16, generator=g),
    }
    torch.save({"model": sd}, path)


def _videomae_folder(path: Path) -> None:
    """A tiny random VideoMAE classifier (``save_pretrained``): the docs' downloaded VideoMAE folder."""
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.VideoMAEConfig(image_size=32, patch_size=8, num_frames=4, tubelet_size=2, hidden_size=32,
                                      num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)  # fmt: skip
    transformers.VideoMAEForVideoClassification(cfg).save_pretrained(path)


#: downloads the docs' commands and python blocks read (a user brings them; nothing here can be
#: downloaded), created in the working directory before they run.  What a documented command makes
#: (data, runs) is never a fixture: the command runs (``produce``, :func:`plan`).
FIXTURES: dict[str, Callable[[Path], None]] = {
    "deit_tiny_patch16_224.pth": _deit_checkpoint,
    "videomae-small-k400": _videomae_folder,
}


def _rtdetr_folder(path: Path) -> None:
    """A tiny random RT-DETR (``save_pretrained``): the docs' hub RT-DETR, 80 COCO-like classes."""
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = tiny_rtdetr_config(transformers, num_labels=80)
    transformers.RTDetrForObjectDetection(cfg).save_pretrained(path)


#: hub ids the docs' parsed commands name (``--init org/name``), made as tiny random folders in an offline
#: hub cache under the working directory (``tests/hub_cache.py``): the parse resolves them as a user's
#: machine resolves a downloaded id, and never reaches the network or the user's cache
HUB_FIXTURES: dict[str, Callable[[Path], None]] = {
    "PekingU/rtdetr_r50vd": _rtdetr_folder,
    "MCG-NJU/videomae-small-finetuned-kinetics": _videomae_folder,
}


def _hub_cache(work: Path, args: list[str]) -> dict[str, str]:
    """The environment of an offline hub cache under ``work`` holding the :data:`HUB_FIXTURES` ``args`` name."""
    from tests.hub_cache import put_in_hf_cache

    home = work / "hf_home"
    for repo, make in HUB_FIXTURES.items():
        if repo in args and not (home / "hub" / ("models--" + repo.replace("/", "--"))).is_dir():
            folder = work / "hub_fixtures" / repo.replace("/", "--")
            make(folder)
            put_in_hf_cache(home / "hub", repo, folder)
    (home / "hub").mkdir(parents=True, exist_ok=True)
    return {"HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "TORCH_HOME": str(work / "torch_home")}


def _make_fixtures(work: Path, texts: list[str]) -> None:
    """The :data:`FIXTURES` that ``texts`` (arguments, python blocks) name, made under ``work`` once."""
    for name, make in FIXTURES.items():
        if any(name in text for text in texts) and not (work / name).exists():
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            make(work / name)


def _python_code(path: Path) -> list[tuple[int, str]]:
    return [(line, textwrap.dedent(src)) for lang, line, src in blocks(path) if lang == "python"]


def _commands(path: Path) -> list[tuple[int, list[str]]]:
    return [
        (line, argv) for lang, line, code in blocks(path) if lang == "sh" for argv in shell_commands(code)
    ]


README = REPO / "README.md"


def _readers(path: Path) -> list[str]:
    """The python blocks that run beside ``path``'s commands: its own, and for README.md every file's
    (their blocks run beside README's runs)."""
    docs = DOCS if path == README else [path]
    return [code for doc in docs for _, code in _python_code(doc)]


def _made_by_commands(path: Path) -> set[str]:
    """The folders the shell commands of ``path`` and README.md write (``make-data OUT``, ``--output-dir``)."""
    made = set()
    for doc in dict.fromkeys([path, README]):
        for _, argv in _commands(doc):
            kind, module, args = classify(argv)
            if kind == "skip":
                continue
            if (out := _output_of(module, args)) is not None:
                made.add(out)
            if len(args) > 1 and args[0] == "make-data":
                made.add(args[1].rstrip("/"))
    return made


def _reads_readme_runs(path: Path) -> bool:
    """Whether the python blocks of ``path`` (another file than README.md) read what README's commands make."""
    made = _made_by_commands(README)
    return path != README and any(_reads(code, folder) for _, code in _python_code(path) for folder in made)


def _params(lang: str) -> list:
    """The doc files with ``lang`` blocks; those that train the documented runs first are marked slow."""
    out = []
    for path in DOCS:
        if any(b[0] == lang for b in blocks(path)):
            trains = path == README or (lang == "python" and _reads_readme_runs(path))
            out.append(pytest.param(path, id=_doc_id(path), marks=[pytest.mark.slow] if trains else []))
    return out


def run_doc_commands(path: Path, work: Path, python: Prewarmed) -> None:
    """Run (or parse) every shell command of ``path`` in order in ``work``; AssertionError on the first failure.

    ``python``: each ``run`` / ``produce`` command is ``python -m MODULE ARGS`` in a process of its own,
    forked from a server that imported torch and torchvision once (:mod:`tests.prewarmed`: seconds saved
    per command, the project's modules imported by each command as ``python -m`` does)."""
    commands = _commands(path)
    _make_fixtures(work, [a for _, argv in commands for a in argv])
    for line, argv, kind, module, args in plan(commands, _readers(path)):
        if kind == "parse":
            env = _hub_cache(work, args)
            with contextlib.chdir(work), mock.patch.dict(os.environ, env):  # a relative --init FOLDER is read
                os.environ.pop("HF_HUB_CACHE", None)  # while parsing; a hub id from the offline cache only
                check_parse(module, args)
        elif kind in ("run", "produce"):
            text = shlex.join(args)
            for mod, pattern, repl in SUBSTITUTIONS:
                text = re.sub(pattern, repl, text) if mod == module else text
            proc = python.run(module, shlex.split(text), cwd=work, env=_env(), timeout=600)
            assert proc.returncode == 0, (
                f"{_doc_id(path)}:{line}: `{shlex.join(argv)}` failed\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
            )


class DocRuns:
    """One working directory per doc file, its commands run once per session (the shell test and the
    python test of a file, and every file's python blocks beside README's runs, share it)."""

    def __init__(self, factory: pytest.TempPathFactory, python: Prewarmed) -> None:
        self.factory = factory
        self.python = python
        self.done: dict[Path, Path | str] = {}

    def workdir(self, path: Path) -> Path:
        if path not in self.done:
            work = self.factory.mktemp(re.sub(r"\W+", "_", _doc_id(path)))
            try:
                run_doc_commands(path, work, self.python)
                self.done[path] = work
            except AssertionError as e:
                self.done[path] = str(e)
        result = self.done[path]
        if isinstance(result, str):
            raise AssertionError(f"the commands of {_doc_id(path)} failed:\n{result}")
        return result


@pytest.fixture(scope="session")
def doc_runs(tmp_path_factory: pytest.TempPathFactory, prewarmed: Prewarmed) -> DocRuns:
    return DocRuns(tmp_path_factory, prewarmed)


# ---------------------------------------------------------------------------------------------- tests


def _doc_id(path: Path) -> str:
    return str(path.relative_to(REPO))


def test_docs_exist_and_have_commands() -> None:
    names = {_doc_id(p) for p in DOCS}
    assert {
        "README.md",
        "docs/api.md",
        "docs/data.md",
        "docs/troubleshooting.md",
        "docs/concepts.md",
    } <= names
    assert sum(len(blocks(p)) for p in DOCS) >= 10


def test_every_shell_command_is_classified() -> None:
    unknown = []
    for path in DOCS:
        for lang, line, code in blocks(path):
            if lang != "sh":
                continue
            for argv in shell_commands(code):
                try:
                    classify(argv)
                except ValueError as e:
                    unknown.append(f"{_doc_id(path)}:{line}: {e}")
    assert not unknown, "\n".join(unknown)


def test_covered_commands_have_their_tests() -> None:
    for module, where in COVERED.items():
        assert (REPO / where.split()[0]).is_file(), where
        assert classify(["python", "-m", module, "--quick"])[0] == "parse"


def test_harness_rejects_what_it_cannot_check() -> None:
    with pytest.raises(ValueError, match="no rule"):
        classify(["python", "-m", "peg_detr", "benchmark"])
    with pytest.raises(ValueError, match="not a python"):
        classify(["curl", "https://example.com"])
    # torchrun commands are never run, only parsed; a wrong flag fails the parse
    kind, module, args = classify(["torchrun", "--nproc_per_node", "8", "-m", "peg_detr", "train", "--bogus"])
    assert (kind, module) == ("parse", "peg_detr")
    with pytest.raises(AssertionError, match="argparse rejected"):
        check_parse(module, args)


@pytest.mark.parametrize("path", _params("sh"))
def test_shell_commands(path: Path, doc_runs: DocRuns) -> None:
    doc_runs.workdir(path)


_RUNNER = """
import sys, traceback
blocks = {blocks!r}
for line, code in blocks:
    try:
        exec(compile(code, f"{doc}:{{line}}", "exec"), {{"__name__": "__main__"}})
    except BaseException:
        traceback.print_exc()
        print(f"FAILED: python block at {doc}:{{line}}", file=sys.stderr)
        sys.exit(1)
"""


def _link_missing(src: Path, dst: Path) -> None:
    """Symbolic links in ``dst`` to what ``src`` holds and ``dst`` does not (folders merged entry by entry)."""
    for entry in src.iterdir():
        there = dst / entry.name
        if not there.exists():
            there.symlink_to(entry)
        elif entry.is_dir() and there.is_dir() and not there.is_symlink():
            _link_missing(entry, there)


@pytest.mark.parametrize("path", _params("python"))
def test_python_blocks(path: Path, doc_runs: DocRuns, prewarmed: Prewarmed) -> None:
    """The file's blocks, in the directory where its commands ran, beside what README's commands made."""
    code = _python_code(path)
    work = doc_runs.workdir(path)
    if _reads_readme_runs(path):
        _link_missing(doc_runs.workdir(README), work)
    _make_fixtures(work, [src for _, src in code])  # e.g. the Hugging Face folder a block loads
    runner = _RUNNER.format(blocks=code, doc=_doc_id(path))
    proc = prewarmed.run(None, [], cwd=work, env=_env(), timeout=300, code=runner)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]


def test_python_blocks_read_what_commands_make() -> None:
    """A path under ``runs/`` or ``data/`` in a python block is written by a documented command (of its file
    or README.md), which the tests run; a fixture only stands in for a download."""
    unmade = []
    for path in DOCS:
        made = _made_by_commands(path)
        for line, code in _python_code(path):
            for m in re.finditer(r"[\"']((?:runs|data)/[^\"'*]*)", code):
                if not any(_reads(m.group(1), folder) for folder in made):
                    unmade.append(f"{_doc_id(path)}:{line}: {m.group(1)}")
    assert not unmade, "python blocks read paths no documented command makes:\n" + "\n".join(unmade)
    every = set().union(*(_made_by_commands(p) for p in DOCS))
    assert not [name for name in FIXTURES if name.split("/")[0] in ("runs", "data") or name in every]


#: flags whose value is a folder or file the command writes (not one it reads)
_WRITES = ("--output-dir", "--out", "--json")


def test_commands_read_what_commands_make() -> None:
    """A run a shell command reads (an argument under ``runs/``: ``--checkpoint runs/x/checkpoint.pth``,
    ``--init``, ``export CKPT``) is written by a documented command (a quick-start, or a recipe of
    docs/guide.md that pages such as troubleshooting refer to), so a reader never meets ``checkpoint not
    found`` (the README once exported ``runs/detr/checkpoint.pth``, which no command made)."""
    made = set().union(*(_made_by_commands(p) for p in DOCS))
    unmade = []
    for path in DOCS:
        for line, argv in _commands(path):
            if classify(argv)[0] == "skip":
                continue
            for i, arg in enumerate(argv):
                read = arg.startswith("runs/") and argv[i - 1] not in _WRITES
                if read and not any(_reads(arg, folder) for folder in made):
                    unmade.append(f"{_doc_id(path)}:{line}: {arg}")
    assert not unmade, "commands read runs no documented command makes:\n" + "\n".join(unmade)


def test_plan_runs_a_train_only_when_its_output_is_read() -> None:
    def train(*flags: str) -> list[str]:
        return ["python", "-m", "peg_detr", "train", "--data-root", "d", *flags]

    commands = [
        (1, ["python", "-m", "peg_detr", "make-data", "d"]),
        (2, train("--output-dir", "runs/a")),  # read by 3, which a block reads: run
        (3, train("--init", "runs/a/checkpoint.pth", "--output-dir", "runs/b")),
        (4, train("--output-dir", "runs/ab")),  # runs/ab is not runs/a nor runs/b: parsed only
        (5, train("--output-dir", "runs/c")),  # read by the predict below: run
        (6, ["python", "-m", "peg_detr", "predict", "x.jpg", "--checkpoint", "runs/c/checkpoint.pth"]),
        (7, ["torchrun", "--nproc_per_node", "8", "-m", "peg_detr", "train", "--output-dir", "runs/d"]),
        (8, ["python", "-m", "peg_detr", "eval", "--checkpoint", "runs/ab/checkpoint.pth"]),  # parsed: no run
    ]
    readers = ['Predictor.from_checkpoint("runs/b/checkpoint.pth")', 'open("runs/d/report.json")']
    kinds = [kind for _, _, kind, _, _ in plan(commands, readers)]
    assert kinds == ["run", "produce", "produce", "parse", "produce", "run", "parse", "parse"]


def test_video_quick_start_is_the_demo_recipe() -> None:
    """The README's video quick start trains what ``make demo``'s video part trains: its recipe
    ``synthetic_tiny`` (not the default 12-block ViT-Ti) on a set of the demo's size."""
    from peg_video.cli import build_make_data_parser, parse_train_args

    video = [argv[3:] for _, argv in _commands(README) if argv[:3] == ["python", "-m", "peg_video"]]
    make = build_make_data_parser().parse_args(next(a for a in video if a[0] == "make-data")[1:])
    train = next(a for a in video if a[0] == "train" and "--train-ann" in a)[1:]
    assert str(make.out) in " ".join(train)  # it trains on the set the line before makes
    assert (make.num_train, make.num_val) == (240, 60)  # peg_video/demo.py: SyntheticSpec(240, 60)
    assert vars(parse_train_args(train)) == vars(parse_train_args([*train, "--config", "synthetic_tiny"]))
    assert parse_train_args(train).model_opts["depth"] == 2
