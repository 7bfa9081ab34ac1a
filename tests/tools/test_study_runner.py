"""``tools.study_runner``: a resumed study reuses its finished cells (``--retrain`` does not), GPU workers are
pinned one per GPU (a faked CUDA: nothing runs on a GPU), CPU workers and a failed cell; ``tools.study_estimate``'s
arithmetic."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from tools import study_runner
from tools.study import main
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
