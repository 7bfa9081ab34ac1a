"""The README's quick-starts are ``make demo``'s commands, so the numbers they quote are the demo table's bars.

The demo's parts (``peg_core/classify/demo.py``, ``peg_detr/demo.py``, ``peg_video/demo.py``) are run
with their ``train`` / ``evaluate`` / data functions replaced by recorders, which gives the exact argv
each part runs.  Each quick-start command, as the README writes it, is parsed by its package's own
parser and must resolve to the same settings as the demo's argv, except what does not change what is
computed: the output folder, ``--workers``, ``--no-progress``, ``--overwrite`` and ``--threads`` (one
thread in the demo: float sums round differently with more, as on another CPU), and the data's place
(checked to be the folder the quick-start's ``make-data`` writes).  ``make-data``'s flags must give the
demo's data (counts, generator settings and seed; a small set drawn both ways is compared file by
file).  Each command's comment quotes the demo table's bars for its part, all of them, and no bar for
a part the table does not quote yet.  So "the commands as the README writes them reach the number" is
this equivalence plus ``python -m tools.readme_numbers --check`` on the demo's summary in CI.
"""

from __future__ import annotations

import filecmp
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from tools.readme_numbers import END, START, read_bars

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"

#: flags that change no computed number (see the module doc); ``cli_flags`` records which flags were typed,
#: which matters only with ``--init`` (none here)
IGNORED = {"output_dir", "workers", "threads", "progress", "overwrite", "cli_flags"}


# ------------------------------------------------------------------------------------- the README's side


def _section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"\n## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def quickstarts() -> list[tuple[str, list[str], str]]:
    """``(module, arguments, comment)`` of each command of the quick-starts' bash blocks; ``comment`` is
    the ``#`` lines right under the command (what it prints)."""
    out: list[tuple[str, list[str], str]] = []
    section = _section("Quick-starts")
    for block in re.findall(r"^```bash\n(.*?)^```", section, re.S | re.M):
        for line in block.splitlines():
            if line.startswith("#"):
                module, args, comment = out[-1]
                out[-1] = (module, args, f"{comment} {line.lstrip('# ')}".strip())
            elif line.strip():
                argv = shlex.split(line)
                assert argv[:2] == ["python", "-m"], line
                out.append((argv[2], argv[3:], ""))
    return out


def _commands(module: str, verb: str) -> list[tuple[list[str], str]]:
    return [(args[1:], comment) for mod, args, comment in quickstarts() if mod == module and args[0] == verb]


def _flag(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def settings(ns: Any, *also: str) -> dict[str, Any]:
    return {k: v for k, v in vars(ns).items() if k not in IGNORED and k not in also}


# ----------------------------------------------------------------------------------- the demo's side


@pytest.fixture
def classify_demo(tmp_path, monkeypatch) -> dict[str, list[str]]:
    """The argv of ``make demo``'s classify part: ``{"train": [...], "eval": [...]}``."""
    import peg_core.classify.demo as demo

    calls: dict[str, list[str]] = {}

    def train(argv):
        calls["train"] = list(argv)
        return {"train": {"loss": 0.0}}

    def evaluate(argv):
        calls["eval"] = list(argv)
        sizes = _flag(argv, "--eval-sizes").split(",")
        return {"eval": {"top1_by_size": dict.fromkeys(sizes, 0.5)}}

    monkeypatch.setattr(demo, "train", train)
    monkeypatch.setattr(demo, "evaluate", evaluate)
    (tmp_path / "classify").mkdir()  # the run would have made it
    demo.run_demo(tmp_path / "classify")
    return calls


@pytest.fixture
def detect_demo(tmp_path, monkeypatch) -> tuple[dict[str, list[str]], dict[str, Any]]:
    """The argv of each detector of ``make demo``'s detect part (by ``--config``) and its data call."""
    import peg_detr.demo as demo

    trains: dict[str, list[str]] = {}
    data: dict[str, Any] = {}

    def make_demo_data(root, quick=False, seed=0):
        data.update(root=Path(root), quick=quick, seed=seed)
        return Path(root)

    def train(argv):
        trains[_flag(argv, "--config")] = list(argv)
        table = {s: {"ap": 0.0, "ap50": 0.0} for s in _flag(argv, "--eval-sizes").split(",")}
        return {"eval": {"ap": 0.0, "ap50": 0.0, "sizes": table}, "train": {"loss": 0.0}}

    monkeypatch.setattr(demo, "make_demo_data", make_demo_data)
    monkeypatch.setattr(demo, "train", train)
    demo.run_demo(tmp_path / "detect")
    return trains, data


@pytest.fixture
def video_demo(tmp_path, monkeypatch) -> dict[str, Any]:
    """The data spec and the argv of ``make demo``'s video part."""
    import peg_video.demo as demo

    calls: dict[str, Any] = {}

    def demo_data(root, spec):
        calls.update(root=Path(root), spec=spec)
        return Path(root)

    def train(argv):
        calls["train"] = list(argv)
        checkpoint = Path(_flag(argv, "--output-dir")) / "checkpoint.pth"
        return {
            "checkpoint": str(checkpoint),
            "eval": {"top1": 0.0, "top5": 0.0, "num_videos": 60},
            "broken": {},
        }

    def evaluate(argv):
        calls["eval"] = list(argv)
        return {"eval": {"top1": 0.0}}

    monkeypatch.setattr(demo, "demo_data", demo_data)
    monkeypatch.setattr(demo.cli, "train", train)
    monkeypatch.setattr(demo.cli, "evaluate", evaluate)
    demo.run_demo(tmp_path / "video")
    return calls


# ------------------------------------------------------------------------------------------------ tests


def test_classify_quickstart_is_the_demos(classify_demo):
    from peg_core.classify.cli import build_eval_parser, parse_train_args

    ((train, _),) = _commands("peg_core", "train")
    ((evaluate, _),) = _commands("peg_core", "eval")
    assert settings(parse_train_args(train)) == settings(parse_train_args(classify_demo["train"]))
    assert _flag(evaluate, "--checkpoint") == f"{_flag(train, '--output-dir')}/checkpoint.pth"
    readme, demo = (build_eval_parser().parse_args(a) for a in (evaluate, classify_demo["eval"]))
    assert settings(readme, "checkpoint") == settings(demo, "checkpoint")


def test_detect_quickstart_is_the_demos(detect_demo):
    from peg_detr.cli import build_make_data_parser, parse_train_args
    from peg_detr.data import SyntheticSpec
    from peg_detr.demo import DEMO_DATA

    trains, data = detect_demo
    ((make, _),) = _commands("peg_detr", "make-data")
    made = build_make_data_parser().parse_args(make)
    n_train, n_val, spec = DEMO_DATA[data["quick"]]
    assert (made.num_train, made.num_val, made.seed, made.layout) == (n_train, n_val, data["seed"], "coco")
    assert SyntheticSpec(made.size, made.num_classes, made.min_objects, made.max_objects) == spec
    readme = {_flag(args, "--config"): args for args, _ in _commands("peg_detr", "train")}
    assert set(readme) == set(trains), "one README line per detector the demo trains"
    for config, args in readme.items():
        assert Path(_flag(args, "--data-root")) == made.out  # the set the make-data line writes
        assert Path(_flag(trains[config], "--data-root")) == data["root"]
        ours, theirs = parse_train_args(args), parse_train_args(trains[config])
        assert settings(ours, "data_root") == settings(theirs, "data_root"), config


def test_make_data_draws_the_demos_data(tmp_path):
    """``make-data``'s code path and the demo's draw the same images and annotations (a small set)."""
    from peg_detr.cli import build_make_data_parser, make_data
    from peg_detr.data import make_synthetic_coco
    from peg_detr.demo import DEMO_DATA

    ((make, _),) = _commands("peg_detr", "make-data")
    small = [str(tmp_path / "cli"), *make[1:]]
    small[small.index("--num-train") + 1], small[small.index("--num-val") + 1] = "6", "3"
    assert make_data(small) == 0
    made = build_make_data_parser().parse_args(small)
    make_synthetic_coco(tmp_path / "demo", 6, 3, seed=made.seed, spec=DEMO_DATA[False][2])
    for folder in ("annotations", "train2017", "val2017"):
        cmp = filecmp.dircmp(tmp_path / "cli" / folder, tmp_path / "demo" / folder)
        assert not (cmp.left_only or cmp.right_only or cmp.diff_files), folder
        _, mismatch, errors = filecmp.cmpfiles(cmp.left, cmp.right, cmp.common_files, shallow=False)
        assert not (mismatch or errors), folder


def test_video_quickstart_is_the_demos(video_demo):
    from peg_video.cli import build_make_data_parser, parse_eval_args, parse_train_args
    from peg_video.data.synthetic import SyntheticSpec

    ((make, _),) = _commands("peg_video", "make-data")
    m = build_make_data_parser().parse_args(make)
    spec = SyntheticSpec(num_train=m.num_train, num_val=m.num_val, width=m.width, height=m.height,
                         frames=m.frames, fps=m.fps, seed=m.seed, codec=m.codec)  # fmt: skip
    assert (m.dataset, spec) == ("kinetics", video_demo["spec"])  # as peg_video/make_data.py builds it
    ((train, _),) = _commands("peg_video", "train")
    for flag, name in (("--train-ann", "train.csv"), ("--val-ann", "val.csv")):
        assert Path(_flag(train, flag)) == m.out / name
        assert Path(_flag(video_demo["train"], flag)) == video_demo["root"] / name
    data = ("train_ann", "val_ann")
    assert settings(parse_train_args(train), *data) == settings(parse_train_args(video_demo["train"]), *data)
    ((evaluate, _),) = _commands("peg_video", "eval")
    assert _flag(evaluate, "--checkpoint") == f"{_flag(train, '--output-dir')}/checkpoint.pth"
    readme, demo = (parse_eval_args(a) for a in (evaluate, video_demo["eval"]))
    assert settings(readme, "checkpoint") == settings(demo, "checkpoint")


def _part(module: str, args: list[str]) -> str | None:
    """The demo table's row a quick-start command prints the numbers of (``None``: prints none)."""
    from peg_detr.demo import FAMILY_DEMOS

    if module == "peg_core" and args[0] in ("train", "eval"):
        return "classify"
    if module == "peg_video" and args[0] in ("train", "eval"):
        return "video"
    if module == "peg_detr" and args[0] == "train":
        config = _flag(args, "--config")
        families = {recipe: f"detect-{key}" for key, (_, recipe) in FAMILY_DEMOS.items()}
        return "detect" if config == "demo_tiny" else families[config]
    return None


def test_each_quickstart_quotes_its_bars():
    """Every bar the demo table quotes is quoted under the command that prints it, and nothing else is."""
    text = README.read_text()
    table = read_bars(text[text.index(START) : text.index(END)])
    quoted: dict[tuple[str, str], float] = {}
    parts = set()
    for module, args, comment in quickstarts():
        part = _part(module, args)
        if part is None:
            assert not comment, f"{shlex.join(args)}: a comment on a command that prints no bar"
            continue
        parts.add(part)
        found = read_bars(f"| {part} | - | {comment} |")
        assert not set(found) & set(quoted), f"{part}: a bar quoted twice"
        quoted |= found
    missing = {key: bar for key, bar in table.items() if key[0] in parts and key not in quoted}
    assert not missing, f"the quick-starts do not quote these bars of the demo table: {missing}"
    assert quoted == {key: table.get(key) for key in quoted}, "a quick-start quotes a bar the table does not"
    assert {part for part, _ in table} <= parts, "a part of the demo table has no quick-start"
