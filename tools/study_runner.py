"""Where and in what order ``python -m tools.study`` trains its cells; a finished cell is not trained again.

A *cell* is one row of one task trained with one seed (:func:`tools.study_tasks.run_cell`).
:func:`run_cells` trains the cells of every plan:

* ``devices=["cpu"]``, ``jobs=1``: one cell after the other in this process;
* ``devices=["cpu"]``, ``jobs=N``: ``N`` spawned worker processes (a fresh torch each), the longest
  tasks first so that the last cells to finish are short;
* ``devices=["cuda:0", "cuda:2", ...]``: one spawned worker per listed GPU (a GPU listed twice gets two),
  each pinned to its GPU by ``CUDA_VISIBLE_DEVICES`` from its first instruction, so the cells it trains
  see that GPU alone, as ``cuda``; a worker takes the next cell as soon as its last one is done.

Resume: a finished cell's :class:`~tools.study_tasks.CellResult` is written as ``cell.json`` in its run
folder, next to the checkpoint, with the *fingerprint* of what determines it (:func:`fingerprint`:
the task, the row, the seed, the budget, the test sizes, the data).  A later run with the same
``--out`` loads a cell whose ``cell.json`` has the same fingerprint instead of training it (one line
per reused cell); ``retrain=True`` (``--retrain``) trains every cell again.

A ``cell.json`` is read through :func:`peg_core.jsonfile.read_json` (size and nesting limits) and
every field of its result is checked (:func:`read_cell`: type, the modes and test-size labels its
row and plan have, scores in [0, 1]): a file that fails is not reused, the run says why in one
line and trains the cell again.

A cell that raises drops its row (one line), not the hours of the others; ``done(plan, cells,
seconds)`` is called as soon as all cells of a plan are in, and :func:`run_cells` returns the cells
that failed.  Ctrl-C stops the worker processes (they ignore SIGINT themselves: no traceback from
each) and reaches the caller as ``KeyboardInterrupt``.

:func:`out_lock`: one study per ``--out`` (an advisory ``flock`` on ``<out>/.study.lock``, which
holds the runner's pid; the kernel drops it when that process dies, so a stale file is taken over).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import multiprocessing
import os
import re
import shutil
import signal
import statistics
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

import torch

from peg_core.errors import InputError
from peg_core.jsonfile import JsonError, read_json
from tools.study_tasks import CellResult, Plan, RowSpec, cell_dir, cells_of, run_cell

try:  # POSIX: the lock on --out (elsewhere a study runs without one)
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "CELL_FILE",
    "LOCK_FILE",
    "devices_arg",
    "fingerprint",
    "load_cell",
    "out_lock",
    "read_cell",
    "resolve_devices",
    "row_seconds",
    "run_cells",
    "save_cell",
]

#: the file a finished cell leaves in its run folder (its CellResult and fingerprint)
CELL_FILE = "cell.json"
#: a cell.json larger than this is no file this runner wrote (one is a few kB)
MAX_CELL_BYTES = 16 << 20
#: the lock of a running study in its --out (:func:`out_lock`)
LOCK_FILE = ".study.lock"
#: bumped when the meaning of a stored cell changes, so that older ``cell.json`` files are trained again
FINGERPRINT_VERSION = 1
#: the order in which a pool takes the tasks: the longest cells first (a lower number is longer)
LONGEST_FIRST = {
    "detect-rtdetr": 0,
    "detect-dfine": 0,
    "detect-rfdetr": 0,
    "detect": 0,
    "video": 1,
    "classify": 2,
}

#: a cell callable: ``(plan, spec, seed, threads, device) -> CellResult`` (picklable: module level)
Cell = Callable[[Plan, RowSpec, int, int, str], CellResult]
Done = Callable[[Plan, dict, float], None]


# -------------------------------------------------------------------------------------------- devices


def devices_arg(text: str) -> str:
    """``argparse`` type of ``--devices``: ``auto``, ``cpu``, ``cuda`` or ``cuda:N[,cuda:M...]`` (checked at start)."""
    t = str(text).strip().lower().replace(" ", "")
    if t in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+(,cuda:\d+)*", t):
        return t
    raise argparse.ArgumentTypeError(f"expected auto, cpu, cuda or cuda:N[,cuda:M...]; got {text!r}")


def resolve_devices(text: str) -> list[str]:
    """The devices of ``--devices``: ``["cpu"]`` or one ``"cuda:N"`` per worker (N: a visible GPU's index).

    ``auto``: every visible GPU when ``torch.cuda.is_available()``, else the CPU; ``cuda``: every
    visible GPU.  A GPU that this machine does not have is an :class:`~peg_core.errors.InputError`.
    """
    t = devices_arg(text)
    if t == "cpu" or (t == "auto" and not torch.cuda.is_available()):
        return ["cpu"]
    if not torch.cuda.is_available():
        raise InputError("CUDA is not available on this machine", f"--devices {t}")
    count = torch.cuda.device_count()
    if t in ("auto", "cuda"):
        return [f"cuda:{i}" for i in range(count)]
    devices = t.split(",")
    missing = [d for d in devices if int(d.split(":")[1]) >= count]
    if missing:
        raise InputError(f"no such GPU ({count} visible)", f"--devices {','.join(missing)}")
    return devices


def _visible_id(device: str) -> str | None:
    """The ``CUDA_VISIBLE_DEVICES`` entry that pins a worker to ``device`` (``None``: the CPU, no pin).

    ``cuda:N`` is the N-th GPU this process sees, so under ``CUDA_VISIBLE_DEVICES=4,6`` ``cuda:1`` is
    the entry ``6`` (an index or a ``GPU-<uuid>``, passed on as written).
    """
    if not device.startswith("cuda"):
        return None
    index = int(device.split(":")[1]) if ":" in device else 0
    seen = os.environ.get("CUDA_VISIBLE_DEVICES")
    if seen is None:
        return str(index)
    entries = [e.strip() for e in seen.split(",") if e.strip()]
    if index >= len(entries):
        raise InputError(f"no such GPU (CUDA_VISIBLE_DEVICES={seen!r})", f"--devices {device}")
    return entries[index]


@contextlib.contextmanager
def _environment(name: str, value: str | None) -> Iterator[None]:
    """``os.environ[name] = value`` inside the block (``None``: unchanged), restored after it."""
    if value is None:
        yield
        return
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


# ------------------------------------------------------------------------------------------- workers

#: the device a worker's cells run on (``cuda`` in a worker pinned to one GPU) and the device it was given
_WORKER_DEVICE = "cpu"
_WORKER_SLOT = "cpu"


def _init_worker(slot: str, visible: str | None) -> None:
    """A pool worker's initializer: pin it to its GPU (``visible``) and record its device.

    The parent already set ``CUDA_VISIBLE_DEVICES`` when it started the process; setting it again
    here covers a Python that starts pool processes later (it still precedes any CUDA call: the
    cells initialise CUDA, importing torch does not).  Ctrl-C is the parent's to handle: a worker
    ignores SIGINT (else each one prints its traceback) and is terminated by the parent.
    """
    global _WORKER_DEVICE, _WORKER_SLOT
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if visible is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = visible
    _WORKER_DEVICE = "cpu" if visible is None else "cuda"
    _WORKER_SLOT = slot


def _work(cell: Cell, plan: Plan, spec: RowSpec, seed: int, threads: int) -> CellResult:
    """One cell in a pool worker, on the worker's device."""
    return cell(plan, spec, seed, threads, _WORKER_DEVICE)


def _slots(devices: Sequence[str], jobs: int) -> list[str]:
    """One entry per worker: each listed GPU, or ``jobs`` CPU workers."""
    devices = list(devices) or ["cpu"]
    if devices == ["cpu"]:
        return ["cpu"] * max(1, jobs)
    if "cpu" in devices:
        raise InputError("cpu and GPUs do not mix in one run", f"--devices {','.join(devices)}")
    return devices


# -------------------------------------------------------------------------------------------- resume


def _jsonable(obj: Any) -> Any:
    """``json.dumps`` fallback: tensors / numpy values as lists or numbers, anything else as text."""
    if hasattr(obj, "tolist"):
        return obj.tolist()
    return str(obj)


def _normal(doc: Any) -> Any:
    """``doc`` as it reads back from JSON (tuples as lists, paths as text), so that two fingerprints compare."""
    return json.loads(json.dumps(doc, default=_jsonable))


#: Plan fields that do not determine a cell: where the run is, the other rows and seeds, the report's notes
NOT_IN_FINGERPRINT = ("out", "specs", "seeds", "notes")


def fingerprint(plan: Plan, spec: RowSpec, seed: int) -> dict[str, Any]:
    """What determines a cell's result: the plan (task, budget, epochs, sizes, views, data, protocol...),
    the row (encoding, flags, resize modes) and the seed.

    Every :class:`Plan` field but :data:`NOT_IN_FINGERPRINT` is in it, so a field added to the plan
    later (a new evaluation setting) is too.  Two runs with the same fingerprint train the same
    model on the same data and evaluate it the same way, so the stored result of one stands for the other.
    """
    doc = {
        f.name: getattr(plan, f.name) for f in dataclasses.fields(plan) if f.name not in NOT_IN_FINGERPRINT
    }
    doc["budget"] = dataclasses.asdict(plan.budget)
    return _normal(
        {"version": FINGERPRINT_VERSION, "plan": doc, "row": dataclasses.asdict(spec), "seed": seed}
    )


def save_cell(path: Path, fp: dict[str, Any], result: CellResult) -> None:
    """Write ``{"fingerprint": fp, "result": asdict(result)}`` to ``path`` (whole or not at all)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"fingerprint": fp, "result": dataclasses.asdict(result)}, indent=1, default=_jsonable)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text + "\n")
    tmp.replace(path)  # a crash mid-write leaves no half file to be read as a finished cell


def load_cell(path: Path, fp: dict[str, Any]) -> CellResult | None:
    """The stored result at ``path`` when its fingerprint is ``fp`` and it passes :func:`read_cell`; ``None`` otherwise."""
    return read_cell(path, fp)[0]


def read_cell(path: Path, fp: dict[str, Any]) -> tuple[CellResult | None, str | None]:
    """``(result, None)`` when ``path`` holds a finished cell of fingerprint ``fp``, else ``(None, why)``.

    ``why`` is ``None`` when there is no file, else one line: the file cannot be read as JSON
    (:func:`~peg_core.jsonfile.read_json`: not a file, too large, nested too deep, not JSON), it
    was written for other settings, or a field of its result is wrong (:func:`_check_result`).
    """
    if not path.exists() and not path.is_symlink():
        return None, None
    try:
        doc = read_json(path, CELL_FILE, max_bytes=MAX_CELL_BYTES, kind=dict)
    except JsonError as e:
        return None, e.what
    if doc.get("fingerprint") != fp:
        return None, "written for other settings (task, row, seed, budget, sizes or data)"
    try:
        return _check_result(doc.get("result"), fp), None
    except ValueError as e:
        return None, str(e)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _metric(v: Any, where: str) -> None:
    """A score: a fraction in [0, 1], or COCO's -1 (no ground truth to score)."""
    if not _is_number(v) or not (0.0 <= v <= 1.0 or v == -1):
        raise ValueError(f"{where} is {_shown(v)}, not a score in [0, 1]")


def _shown(v: Any) -> str:
    if isinstance(v, dict | list):
        return f"a JSON {'object' if isinstance(v, dict) else 'array'}"
    text = json.dumps(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _object(v: Any, where: str) -> dict:
    if not isinstance(v, dict):
        raise ValueError(f"{where} is {_shown(v)}, not a JSON object")
    return v


def _by_label(v: Any, labels: list[str], where: str, check: Callable[[Any, str], None] = _metric) -> None:
    """``{label: score}`` with every one of ``labels`` (and any other key a score too)."""
    table = _object(v, where)
    missing = [lab for lab in labels if lab not in table]
    if missing:
        raise ValueError(f"{where} has no {missing[0]!r} (the plan's test sizes: {', '.join(labels)})")
    for lab, value in table.items():
        check(value, f"{where}[{lab!r}]")


def _count(v: Any, where: str) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 2**63:
        raise ValueError(f"{where} is {_shown(v)}, not a count >= 0")


def _check_result(result: Any, fp: dict[str, Any]) -> CellResult:
    """The :class:`CellResult` of a stored ``result``, each field's type and range checked.

    The row's resize modes and the plan's test-size labels come from the fingerprint (which already
    matched): ``scores`` holds exactly those modes, each with every label; ``extra[mode]`` per metric
    every label (keys that are no mode are carried, never read); ``int8`` nothing or every label;
    scores are fractions (or COCO's -1); ``params`` / ``flops`` counts; ``seconds`` a finite time
    >= 0; ``diagnostics`` per label (of the plan) ``entropy`` and ``distance``, one finite value
    >= 0 per layer, the same depth everywhere.  A ``ValueError`` naming the first wrong field.
    """
    result = _object(result, "'result'")
    fields = {f.name: f for f in dataclasses.fields(CellResult)}
    unknown = sorted(set(result) - set(fields))
    if unknown:
        raise ValueError(f"'result' has fields this code does not know: {', '.join(map(repr, unknown))}")
    for name, f in fields.items():
        if (
            name not in result
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        ):
            raise ValueError(f"'result' has no {name!r}")
    plan, row = fp.get("plan") or {}, fp.get("row") or {}
    labels = [str(lab) for lab in plan.get("labels") or ()]
    modes = [str(m) for m in row.get("modes") or (None,)]
    scores = _object(result["scores"], "scores")
    if sorted(scores) != sorted(modes):
        raise ValueError(f"scores has the modes {sorted(scores)}, not the row's {modes}")
    for mode in modes:
        _by_label(scores[mode], labels, f"scores[{mode!r}]")
    extra = _object(result["extra"], "extra")
    for mode in modes:
        for metric, table in _object(extra.get(mode, {}), f"extra[{mode!r}]").items():
            _by_label(table, labels, f"extra[{mode!r}][{metric!r}]")
    if result.get("int8"):
        _by_label(result["int8"], labels, "int8")
    else:
        _object(result.get("int8", {}), "int8")
    _count(result["params"], "params")
    _count(result["flops"], "flops")
    seconds = result.get("seconds", 0.0)
    if not _is_number(seconds) or seconds < 0:
        raise ValueError(f"seconds is {_shown(seconds)}, not a time >= 0")
    depths = set()
    for lab, stats in _object(result.get("diagnostics", {}), "diagnostics").items():
        where = f"diagnostics[{lab!r}]"
        if lab not in labels:
            raise ValueError(f"{where}: no such test size in the plan ({', '.join(labels)})")
        if sorted(_object(stats, where)) != ["distance", "entropy"]:
            raise ValueError(f"{where} must hold 'entropy' and 'distance' only")
        for q, values in stats.items():
            if (
                not isinstance(values, list)
                or not values
                or not all(_is_number(v) and v >= 0 for v in values)
            ):
                raise ValueError(f"{where}[{q!r}] is not a list of values >= 0, one per layer")
            depths.add(len(values))
    if len(depths) > 1:
        raise ValueError(f"diagnostics has layer counts {sorted(depths)}; one model has one depth")
    return CellResult(**result)


def _remove(path: Path) -> None:
    """Remove whatever is at ``path`` (a file, a link or a folder named like the cell file)."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


# ---------------------------------------------------------------------------------------------- lock


def _holder(fd: int) -> str:
    """The pid written in an open lock file ('unknown' when it holds none)."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return "unknown"
    return text if text.isdigit() else "unknown"


@contextlib.contextmanager
def out_lock(out: Path) -> Iterator[Path]:
    """Hold ``<out>/.study.lock`` for the block: one study per ``--out``.

    An exclusive, non-blocking ``flock`` on the file, which holds this process's pid.  A second
    runner is an :class:`~peg_core.errors.InputError` naming the first's pid.  The kernel releases
    the lock when its process ends (killed or not), so a file left by a dead runner is taken over
    (one line).  The file is removed when the block ends.  Without ``fcntl`` (not POSIX) there is no lock.
    """
    path = out / LOCK_FILE
    if fcntl is None:  # pragma: no cover
        yield path
        return
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
    while True:
        try:
            fd = os.open(path, flags, 0o644)
        except OSError as e:
            raise InputError(f"cannot lock --out ({e.strerror or e})", path) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _holder(fd)
            os.close(fd)
            raise InputError(
                f"another study is running on this --out (pid {pid}); wait for it to end or give another --out",
                path,
            ) from None
        except OSError as e:
            os.close(fd)
            raise InputError(f"cannot lock --out ({e.strerror or e})", path) from None
        try:  # the holder before us may have removed the file between our open and our lock
            same = os.path.samestat(os.fstat(fd), os.stat(path, follow_symlinks=False))
        except OSError:
            same = False
        if same:
            break
        os.close(fd)
    stale = _holder(fd)
    if stale not in ("unknown", str(os.getpid())):
        print(
            f"[study] {path}: the lock of pid {stale} is stale (that runner has ended): taken over",
            flush=True,
        )
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)


def row_seconds(plan: Plan, cells: dict[tuple[str, int], CellResult | None]) -> dict[str, float]:
    """Training seconds per trained row, the mean over its seeds that finished (reused cells: when trained)."""
    out = {}
    for spec in cells_of(plan):
        times = [r.seconds for s in plan.seeds if (r := cells.get((spec.name, s))) is not None]
        if times:
            out[spec.name] = round(statistics.fmean(times), 1)
    return out


def _scores_text(result: CellResult) -> str:
    return ", ".join(f"{k} {v:.3f}" for k, v in next(iter(result.scores.values()), {}).items())


# --------------------------------------------------------------------------------------------- cells


def run_cells(
    plans: list[Plan], jobs: int, threads: int, done: Done, devices: Sequence[str] = ("cpu",), *,
    retrain: bool = False, cell: Cell | None = None,
) -> list[tuple[str, str, int]]:  # fmt: skip
    """Train every cell of ``plans``; call ``done(plan, cells, seconds)`` as each plan completes.

    Returns the cells that failed, as ``(plan key, row name, seed)`` (empty: every cell is in).

    ``devices``: ``["cpu"]`` (``jobs`` worker processes when ``jobs > 1``) or one ``"cuda:N"`` per
    GPU worker (:func:`resolve_devices`).  ``cells`` maps ``(row name, seed)`` to its
    :class:`CellResult`, ``None`` for a cell that failed; ``seconds``: the plan's training seconds
    (a reused cell counts the seconds it took when it was trained).  ``retrain``: ignore stored
    cells.  ``cell``: what trains one cell (default :func:`~tools.study_tasks.run_cell`; a
    module-level function when there are workers).
    """
    cell = cell or run_cell
    slots = _slots(devices, jobs)
    if jobs > 1 and slots[0] != "cpu":
        print(
            f"[study] --jobs {jobs} is for CPU workers: one worker per GPU ({', '.join(slots)})", flush=True
        )
    todo = [(p, s, seed) for p in plans for s in cells_of(p) for seed in p.seeds]
    if len(slots) > 1:  # the longest cells first, so that the last ones to finish are short
        todo.sort(key=lambda c: LONGEST_FIRST.get(c[0].task, 0))
    results: dict[str, dict] = {p.key: {} for p in plans}
    seconds: dict[str, float] = {p.key: 0.0 for p in plans}
    need = {p.key: sum(1 for c in todo if c[0] is p) for p in plans}
    failed: list[tuple[str, str, int]] = []

    def collect(plan: Plan, name: str, seed: int, res: CellResult | None) -> None:
        if res is not None:
            seconds[plan.key] += res.seconds
        else:
            failed.append((plan.key, name, seed))
        results[plan.key][name, seed] = res
        if len(results[plan.key]) == need[plan.key]:
            done(plan, results[plan.key], seconds[plan.key])

    def finish(item: tuple[Plan, RowSpec, int], run: Callable[[], CellResult], where: str = "") -> None:
        plan, spec, seed = item
        try:
            res: CellResult | None = run()
        except (Exception, SystemExit) as e:  # one failed cell drops its row, not the hours of the others
            print(
                f"[study {plan.key}] {spec.name} seed {seed}{where} FAILED: {type(e).__name__}: {e}",
                flush=True,
            )
            res = None
        else:
            try:
                save_cell(cell_dir(plan, spec, seed) / CELL_FILE, fingerprint(plan, spec, seed), res)
            except (OSError, TypeError, ValueError) as e:  # the result stands; only a later resume loses it
                print(f"[study {plan.key}] {spec.name} seed {seed}: {CELL_FILE} not written: {e}", flush=True)
        collect(plan, spec.name, seed, res)

    pending: deque[tuple[Plan, RowSpec, int]] = deque()
    for plan, spec, seed in todo:
        path = cell_dir(plan, spec, seed) / CELL_FILE
        stored, why = (None, None) if retrain else read_cell(path, fingerprint(plan, spec, seed))
        if stored is None:
            if why is not None:
                print(f"[study {plan.key}] {spec.name} seed {seed}: {path} not reused ({why}): trained again",
                      flush=True)  # fmt: skip
            try:
                _remove(path)  # a stale result must not outlive a retraining that fails
            except OSError as e:
                print(f"[study {plan.key}] {spec.name} seed {seed}: {path} cannot be removed ({e.strerror or e})",
                      flush=True)  # fmt: skip
            pending.append((plan, spec, seed))
            continue
        print(f"[study {plan.key}] {spec.name} seed {seed}: reused {path} (trained in {stored.seconds} s): "
              f"{_scores_text(stored)}", flush=True)  # fmt: skip
        collect(plan, spec.name, seed, stored)

    if slots == ["cpu"]:
        for item in pending:
            finish(item, lambda i=item: cell(*i, threads, "cpu"))
    else:
        _run_in_workers(pending, slots, threads, cell, finish)
    return failed


def _run_in_workers(
    pending: deque[tuple[Plan, RowSpec, int]], slots: list[str], threads: int, cell: Cell,
    finish: Callable[..., None],
) -> None:  # fmt: skip
    """Train ``pending`` in one single-process pool per slot; a pool takes the next cell when it is free.

    One pool per slot (not one pool of ``len(slots)`` processes) so that each process is started
    under its own ``CUDA_VISIBLE_DEVICES``: a pool starts its process on its first ``submit``.
    """
    ctx = multiprocessing.get_context("spawn")  # a fresh torch per worker: no fork of a threaded runtime
    pins = [_visible_id(s) for s in slots]
    pools = [ProcessPoolExecutor(1, mp_context=ctx, initializer=_init_worker, initargs=(s, v))
             for s, v in zip(slots, pins, strict=True)]  # fmt: skip
    running: dict[Future, tuple[int, tuple[Plan, RowSpec, int]]] = {}
    live = set(range(len(pools)))

    def feed(i: int) -> None:
        """Give pool ``i`` the next cell (a pool whose process died takes no more)."""
        while pending and i in live:
            item = pending.popleft()
            try:
                with _environment("CUDA_VISIBLE_DEVICES", pins[i]):
                    running[pools[i].submit(_work, cell, *item, threads)] = (i, item)
                return
            except RuntimeError:  # BrokenProcessPool: the worker died; its cell fails below
                live.discard(i)
                pending.appendleft(item)

    try:
        for i in range(len(pools)):
            feed(i)
        while running:
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in finished:
                i, item = running.pop(fut)
                feed(i)  # the next cell first: the worker is busy while this one is written down
                where = "" if slots[i] == "cpu" else f" on {slots[i]}"
                finish(item, fut.result, where)
            if not running and pending and not live:  # every worker died: the rest cannot run
                while pending:
                    finish(pending.popleft(), _no_worker)
    except BaseException:  # Ctrl-C (or a bug): the cells in flight are not waited for
        for pool in pools:
            _stop(pool)
        raise
    for pool in pools:
        pool.shutdown(wait=True, cancel_futures=True)


def _stop(pool: ProcessPoolExecutor) -> None:
    """Terminate ``pool``'s worker process and drop its queued cells, without waiting for its cell."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    for proc in processes:
        with contextlib.suppress(Exception):
            proc.terminate()
    for proc in processes:
        with contextlib.suppress(Exception):
            proc.join(timeout=10)
    with contextlib.suppress(Exception):
        pool.shutdown(wait=False, cancel_futures=True)


def _no_worker() -> CellResult:
    raise RuntimeError("no worker process left (each one died)")
