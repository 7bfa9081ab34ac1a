"""``tools.study_runner``: a resumed study reuses its finished cells (``--retrain`` does not), GPU workers are
pinned one per GPU (a faked CUDA: nothing runs on a GPU), CPU workers and a failed cell; ``tools.study_estimate``'s
arithmetic."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch

from tools import study_runner
from tools.study import StudyFailed, cli, main
from tools.study_estimate import Workload, cpvt_flops, estimate_table, gpu_hours, input_hours
from tools.study_runner import (
    CELL_FILE,
    fingerprint,
    load_cell,
    resolve_devices,
    run_cells,
    save_cell,
)
from tools.study_tasks import Budget, CellResult, Plan, RowSpec, cell_dir, run_cell


def _study(out: Path, *extra: str) -> dict:
    threads = torch.get_num_threads()
    try:
        return main(["--task", "classify", "--quick", "--rows", "peg,none", "--out", str(out), *extra])
    finally:
        torch.set_num_threads(threads)


def test_a_second_run_reuses_every_cell_and_retrain_trains_them_again(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    first = _study(tmp_path)["classify"]
    cells = [tmp_path / "classify" / row / "seed0" / CELL_FILE for row in ("peg", "none")]
    assert all(p.is_file() for p in cells)
    doc = json.loads((tmp_path / "study.json").read_text())["tasks"]["classify"]
    assert set(doc["cell_seconds"]) == {"peg", "none"} and all(v > 0 for v in doc["cell_seconds"].values())
    capsys.readouterr()

    def refuse(*args, **kwargs):
        raise AssertionError("a finished cell was trained again")

    monkeypatch.setattr(study_runner, "run_cell", refuse)
    second = _study(tmp_path)["classify"]
    reused = [line for line in capsys.readouterr().out.splitlines() if ": reused " in line]
    assert len(reused) == 2 and all(CELL_FILE in line for line in reused)
    assert [(r.label, r.scores, r.params, r.flops) for r in second.rows] == [
        (r.label, r.scores, r.params, r.flops) for r in first.rows
    ]
    assert second.seconds == first.seconds  # a reused cell counts the seconds it took when trained

    calls = []

    def count(*args, **kwargs):
        calls.append(args[1].name)
        return run_cell(*args, **kwargs)

    monkeypatch.setattr(study_runner, "run_cell", count)
    _study(tmp_path, "--retrain")
    assert sorted(calls) == ["none", "peg"]
    calls.clear()
    _study(tmp_path, "--epochs", "2")  # another budget: another fingerprint, trained again
    assert sorted(calls) == ["none", "peg"]
    assert json.loads(cells[0].read_text())["fingerprint"]["plan"]["epochs"] == 2


def _plan(out: Path, names: tuple[str, ...] = ("peg", "none"), seeds: tuple[int, ...] = (0,)) -> Plan:
    return Plan(
        task="classify", key="classify", out=out, specs=[RowSpec(n, n) for n in names], seeds=list(seeds),
        budget=Budget(1, 8, 4, 32), epochs=1, metric="top-1", sizes=[32], labels=["32 px"], train_label="32 px",
        data={"root": str(out / "data")}, data_name="toy", model="toy",
    )  # fmt: skip


def test_cell_json_round_trip_and_what_is_not_reused(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    spec = plan.specs[0]
    fp = fingerprint(plan, spec, 0)
    result = CellResult({"None": {"32 px": 0.5}}, {}, 10, 20, seconds=1.5)
    path = cell_dir(plan, spec, 0) / CELL_FILE
    save_cell(path, fp, result)
    assert load_cell(path, fp) == result and not path.with_name(CELL_FILE + ".tmp").exists()
    assert load_cell(path, fingerprint(plan, spec, 1)) is None  # another seed
    assert load_cell(path, fingerprint(plan, RowSpec("peg", "peg", ("--peg-kernel-size", "5")), 0)) is None
    other = _plan(tmp_path)
    other.epochs = 2
    assert load_cell(path, fingerprint(other, spec, 0)) is None
    assert fingerprint(_plan(tmp_path, seeds=(0, 1, 2)), spec, 0) == fp  # the other seeds do not count
    doc = json.loads(path.read_text())
    doc["result"]["no_such_field"] = 1  # written by a CellResult this code does not know
    path.write_text(json.dumps(doc))
    assert load_cell(path, fp) is None
    path.write_text("{half a file")
    assert load_cell(path, fp) is None


def test_devices_with_a_faked_cuda(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    assert resolve_devices("auto") == resolve_devices("cuda") == ["cuda:0", "cuda:1", "cuda:2"]
    assert resolve_devices("cuda:0, cuda:2") == ["cuda:0", "cuda:2"] and resolve_devices("cpu") == ["cpu"]
    with pytest.raises(ValueError, match="no such GPU"):
        resolve_devices("cuda:3")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_devices("auto") == ["cpu"]
    with pytest.raises(ValueError, match="CUDA is not available"):
        resolve_devices("cuda:0")
    for flag in ("cuda", "cuda:x", "gpu"):  # a usage error before any data is written
        with pytest.raises(SystemExit):
            main(["--task", "classify", "--quick", "--out", str(tmp_path), "--devices", flag])
    assert not any(tmp_path.iterdir())


def fake_cell(plan: Plan, spec: RowSpec, seed: int, threads: int, device: str) -> CellResult:
    """A cell in a worker process: what it was given and where it runs, no training (module level: picklable)."""
    if spec.name == "boom":
        raise RuntimeError("this cell fails")
    if spec.name == "crash":  # the worker process dies (a segfault, the OOM killer)
        os._exit(1)
    if spec.name == "interrupt":  # Ctrl-C as a cell sees it
        raise KeyboardInterrupt
    if spec.name == "sleep":
        time.sleep(120)
    where = {
        "device": device,
        "slot": study_runner._WORKER_SLOT,
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "cuda_initialised": torch.cuda.is_initialized(),
        "pid": os.getpid(),
    }
    return CellResult({"None": {"32 px": 0.5 + seed / 10}}, {"where": where}, 0, 0, seconds=0.1)


def _run(plans: list[Plan], jobs: int, devices: list[str]) -> dict:
    finished: dict[str, dict] = {}
    run_cells(
        plans, jobs, 1, lambda p, cells, s: finished.setdefault(p.key, dict(cells)), devices, cell=fake_cell
    )
    return finished


def test_one_pinned_worker_per_gpu(monkeypatch, tmp_path: Path, capsys) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6")  # cuda:N is the N-th GPU this process sees
    finished = _run([_plan(tmp_path, seeds=(0, 1))], 1, ["cuda:0", "cuda:2"])
    cells = finished["classify"]
    assert sorted(cells) == [("none", 0), ("none", 1), ("peg", 0), ("peg", 1)]
    where = [c.extra["where"] for c in cells.values()]
    assert {(w["slot"], w["visible"]) for w in where} == {("cuda:0", "4"), ("cuda:2", "6")}  # both GPUs used
    assert all(w["device"] == "cuda" and not w["cuda_initialised"] for w in where)  # the cell sees one GPU
    assert len({w["pid"] for w in where}) == 2 and os.getpid() not in {w["pid"] for w in where}
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "4,5,6" and not torch.cuda.is_initialized()
    assert all((cell_dir(_plan(tmp_path), RowSpec(n, n), s) / CELL_FILE).is_file() for n, s in cells)
    capsys.readouterr()
    again = _run([_plan(tmp_path, seeds=(0, 1))], 1, ["cuda:0", "cuda:2"])  # resumed: no worker trains
    assert again == finished and capsys.readouterr().out.count(": reused ") == 4


def test_cpu_workers_and_a_failed_cell(monkeypatch, tmp_path: Path, capsys) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    finished = _run([_plan(tmp_path, ("peg", "boom", "crash", "none", "sincos"))], 2, ["cpu"])
    cells = finished["classify"]
    assert cells["boom", 0] is None and not (tmp_path / "boom" / "seed0" / CELL_FILE).exists()
    assert cells["crash", 0] is None  # its worker died: the other one trains the cells left
    where = [cells[n, 0].extra["where"] for n in ("peg", "none", "sincos")]
    assert all(w["device"] == "cpu" and w["slot"] == "cpu" and w["visible"] is None for w in where)
    failed = sorted(line for line in capsys.readouterr().out.splitlines() if "FAILED" in line)  # either first
    assert failed[0] == "[study classify] boom seed 0 FAILED: RuntimeError: this cell fails"
    assert (
        failed[1].startswith("[study classify] crash seed 0 FAILED: BrokenProcessPool") and len(failed) == 2
    )


# ------------------------------------------------------------------------------------------- estimate


def test_estimate_arithmetic_of_one_row() -> None:
    # CPVT-Ti-like: 2.5 GFLOPs x 3 passes x 126,689 images x 100 epochs = 9.501675e16 FLOPs;
    # at 40% of 989 TFLOP/s = 3.956e14 FLOP/s: 240.18 s = 0.066718 h
    assert gpu_hours(2.5e9, 126_689, 100) == pytest.approx(0.066718, rel=1e-4)
    assert gpu_hours(2.5e9, 126_689, 100, tflops=494.5, utilisation=0.8) == pytest.approx(0.066718, rel=1e-4)
    assert input_hours(126_689, 100, 3000) == pytest.approx(1.17305, rel=1e-4)  # 12,668,900 images / 3000/s
    with pytest.raises(ValueError):
        gpu_hours(1e9, 1, 1, utilisation=0)
    row = Workload("classify", "CPVT-Ti", "ImageNet-100", 126_689, 100, 2.5e9, 30)
    lines = estimate_table([row]).splitlines()
    assert lines[2] == "| classify | CPVT-Ti | ImageNet-100 | 100 | 2.5 | 0.067 | 1.2 | 30 | 2 |"
    assert "395.6 TFLOP/s sustained" in estimate_table([row])


def test_cpvt_tiny_flops_on_the_meta_device() -> None:
    # DeiT-Ti's published 1.3 GFLOPs count a multiply-add once; here FLOPs = 2 x multiply-adds
    assert 2.4e9 < cpvt_flops("cpvt_tiny") < 2.6e9


# ------------------------------------------------------------------------------ bad input (issue 39)


def _fake_run_cell(plan: Plan, spec: RowSpec, seed: int, threads: int = 1, device: str = "cpu") -> CellResult:
    """``run_cell`` without training: a score of 0.5 at every test size; row ``none`` fails."""
    if spec.name == "none":
        raise RuntimeError("this cell fails")
    return CellResult({str(m): dict.fromkeys(plan.labels, 0.5) for m in spec.modes}, {}, 1, 2, seconds=0.1)


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


#: a stored cell.json changed after it was written: (what is done to the file's result, words the line says)
CORRUPTIONS = {
    "a score as text": (lambda r: r["scores"]["None"].update({"32 px": "0.5"}), "scores['None']['32 px']"),
    "scores as a list": (lambda r: r.update(scores=[1, 2]), "scores is a JSON array"),
    "seconds as text": (lambda r: r.update(seconds="1.5"), "seconds"),
    "a top-1 of 7.5": (lambda r: r["scores"]["None"].update({"32 px": 7.5}), "not a score in [0, 1]"),
    "a test size missing": (lambda r: r["scores"].update({"None": {}}), "has no '32 px'"),
    "another mode": (lambda r: r.update(scores={"bicubic": {"32 px": 0.5}}), "not the row's"),
    "params negative": (lambda r: r.update(params=-3), "params"),
    "flops a boolean": (lambda r: r.update(flops=True), "flops"),
    "extra metric as text": (lambda r: r["extra"].update({"None": {"AP": "high"}}), "extra['None']['AP']"),
    "int8 of one size only": (lambda r: r.update(int8={"24 px": 0.5}), "int8 has no '32 px'"),
    "diagnostics of two depths": (
        lambda r: r.update(diagnostics={"32 px": {"entropy": [1.0, 2.0], "distance": [1.0]}}),
        "layer counts",
    ),
    "an unknown field": (lambda r: r.update(no_such_field=1), "no_such_field"),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_a_reused_cell_json_with_a_wrong_field_is_trained_again_and_said(
    tmp_path: Path, capsys, case
) -> None:
    _run([_plan(tmp_path)], 1, ["cpu"])
    path = cell_dir(_plan(tmp_path), RowSpec("peg", "peg"), 0) / CELL_FILE
    doc = json.loads(path.read_text())
    change, said = CORRUPTIONS[case]
    change(doc["result"])
    path.write_text(json.dumps(doc))
    assert load_cell(path, fingerprint(_plan(tmp_path), RowSpec("peg", "peg"), 0)) is None
    capsys.readouterr()
    cells = _run([_plan(tmp_path)], 1, ["cpu"])["classify"]  # no crash in the report's lines
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if "peg seed 0" in line and "not reused" in line)
    assert said in line and line.endswith("trained again"), line
    assert cells["peg", 0].scores == {"None": {"32 px": 0.5}}  # trained again
    assert out.count(": reused ") == 1  # the other cell, untouched
    assert json.loads(path.read_text())["result"]["scores"] == {"None": {"32 px": 0.5}}  # written anew


@pytest.mark.parametrize("case", ["nested 100,000 levels", "a folder", "a huge file"])
def test_a_cell_json_the_json_reader_refuses_is_trained_again(tmp_path: Path, capsys, case) -> None:
    """Read through peg_core.jsonfile (nesting and size limits), never json.loads: no RecursionError,
    no IsADirectoryError."""
    path = cell_dir(_plan(tmp_path), RowSpec("peg", "peg"), 0) / CELL_FILE
    path.parent.mkdir(parents=True)
    if case == "a folder":
        (path / "inside").mkdir(parents=True)
    elif case == "a huge file":
        with path.open("wb") as f:
            f.truncate(study_runner.MAX_CELL_BYTES + 1)
    else:
        path.write_text(_nested(100_000))
    cells = _run([_plan(tmp_path)], 1, ["cpu"])["classify"]
    line = next(line for line in capsys.readouterr().out.splitlines() if "not reused" in line)
    why = {
        "a folder": "is not a file",
        "a huge file": "bytes, more than",
        "nested 100,000 levels": "nested deeper",
    }
    assert why[case] in line and cells["peg", 0] is not None and path.is_file()


def test_one_study_per_out_and_a_stale_lock_is_taken_over(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(study_runner, "run_cell", _fake_run_cell)
    argv = ["--task", "classify", "--quick", "--rows", "peg", "--out", str(tmp_path)]
    with study_runner.out_lock(tmp_path):  # a first study holds --out
        assert (tmp_path / study_runner.LOCK_FILE).read_text().strip() == str(os.getpid())
        assert cli(argv) == 1
        line = _one_error_line(capsys.readouterr().err)
        assert f"another study is running on this --out (pid {os.getpid()})" in line and ".study.lock" in line
        assert not (tmp_path / "classify").exists()  # nothing planned, nothing trained
    assert not (tmp_path / study_runner.LOCK_FILE).exists()
    # a lock file left by a runner that was killed: nobody holds it, so it is taken over (one line)
    (tmp_path / study_runner.LOCK_FILE).write_text("4194999\n")
    assert cli(argv) == 0
    out = capsys.readouterr().out
    assert "the lock of pid 4194999 is stale" in out and not (tmp_path / study_runner.LOCK_FILE).exists()


def test_ctrl_c_is_one_line_and_exit_130(tmp_path: Path, monkeypatch, capsys) -> None:
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(study_runner, "run_cell", interrupted)
    assert cli(["--task", "classify", "--quick", "--rows", "peg", "--out", str(tmp_path)]) == 130
    assert "interrupted" in _one_error_line(capsys.readouterr().err)
    assert not (tmp_path / study_runner.LOCK_FILE).exists()  # released: the same command resumes


def test_ctrl_c_stops_the_workers_without_waiting_for_their_cells(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):  # the worker's Ctrl-C reaches the parent; the sleeper is ended
        _run([_plan(tmp_path, ("sleep", "interrupt"))], 2, ["cpu"])
    assert time.monotonic() - t0 < 45  # the sleeping cell (120 s) was not waited for


def test_failed_cells_make_the_study_exit_non_zero_naming_them(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(study_runner, "run_cell", _fake_run_cell)
    argv = ["--task", "classify", "--quick", "--rows", "peg,none", "--seeds", "2", "--out", str(tmp_path)]
    assert cli(argv) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert "2 of 4 cells failed" in line and line.endswith("classify: none seed 0, none seed 1")
    assert "Row `none` left out" in (tmp_path / "report.md").read_text()  # the report is still written
    with pytest.raises(StudyFailed) as e:
        main(argv)
    assert [r.label for r in e.value.results["classify"].rows] == ["peg"]


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--train-args", '"--epochs 2'], "No closing quotation"),
        (["--train-args", "--output-dir X"], "--output-dir is the study's"),
        (["--train-args", "--output X"], "--output (--output-dir) is the study's"),
        (["--train-args=--seed=3"], "--seed is the study's"),
        (["--train-args", "--pos-enc sine --lr 0.01"], "--pos-enc is the study's"),
        (["--train-args", "--data-root /data"], "--data-root is the study's"),
        (["--train-args", "--img-size 64"], "--train-size"),
        (["--train-args", "--device cpu"], "--devices"),
        (["--train-args=--no-such-flag"], "--no-such-flag is not a flag in python -m peg_core train"),
        (["--train-args", "--lr fast"], "argument --lr"),
        (["--seeds", "100000000000"], "argument --seeds"),
        (["--seed", "-1"], "argument --seed"),
        (["--seed", "2147483647", "--seeds", "2"], "the last seed"),
        (["--jobs", "100000"], "argument --jobs"),
        (["--threads", "0"], "argument --threads"),
        (["--epochs", "1000000000"], "argument --epochs"),
        (["--train-size", "100000"], "argument --train-size"),
        (["--test-sizes", "32,100000"], "argument --test-sizes"),
    ],
)
def test_flags_are_bounded_and_train_args_parsed_before_any_work(tmp_path: Path, capsys, flags, said) -> None:
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        main(["--task", "classify", "--quick", "--out", str(out), *flags])
    assert e.value.code == 2 and said in _one_error_line(capsys.readouterr().err)
    assert not out.exists()


def test_train_args_flags_of_each_task_in_the_run(tmp_path: Path, capsys) -> None:
    for task, flags, said in (
        ("detect", "--train-sizes 64", "--train-sizes is the study's"),
        ("detect", "--arch cpvt_tiny", "in python -m peg_detr train (--task detect)"),
        ("video", "--config k400_vit_s_16x4_peg3d", "--video-config"),
        ("all", "--arch cpvt_tiny", "in python -m peg_detr train (--task detect)"),
    ):
        with pytest.raises(SystemExit):
            main(["--task", task, "--quick", "--out", str(tmp_path / "out"), "--train-args", flags])
        assert said in _one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "out").exists()


def test_out_naming_a_file_is_one_line(tmp_path: Path, capsys) -> None:
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    for out in (afile, afile / "below"):
        with pytest.raises(SystemExit) as e:
            main(["--task", "classify", "--quick", "--out", str(out)])
        assert e.value.code == 2 and str(afile) in _one_error_line(capsys.readouterr().err)
    assert afile.read_text() == "keep me"
