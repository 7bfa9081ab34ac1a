"""Ctrl-C during a 2-worker ``python -m peg_video prepare``: one line, exit 130, no worker traceback.

A terminal sends SIGINT to the whole process group, workers included; they used to die with a
``KeyboardInterrupt`` traceback each (``Process ForkPoolWorker-1: Traceback ...``).  The test runs
``prepare`` in its own session with a job that waits (so the signal lands while both workers are
busy, on any machine) and sends SIGINT to the group, as a terminal does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from peg_core.engine import EXIT_INTERRUPTED

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not hasattr(os, "killpg") or sys.platform == "win32", reason="POSIX process groups"),
]

# prepare with a job that marks its start and waits: forked workers inherit the replacement, and
# pickling finds it under the module's own name.
SCRIPT = """
import signal, sys, time
from pathlib import Path

# A terminal's shell starts a foreground job with Ctrl-C live; this process inherits the test
# runner's disposition instead, and a runner started in the background (``make test &``, nohup,
# CI harnesses) ignores SIGINT, which an exec keeps: restore what a terminal gives.
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

import peg_video.prepare as prepare
from peg_video.__main__ import main

def _prepare_job(job):
    Path(sys.argv[1], job[0].name + ".started").touch()
    time.sleep(60)

_prepare_job.__module__, _prepare_job.__qualname__ = prepare.__name__, "_prepare_job"
prepare._prepare_job = _prepare_job
sys.exit(main(["prepare", sys.argv[2], sys.argv[3], "--workers", "2", "--no-progress"]))
"""


def test_ctrl_c_with_two_workers_is_one_line_and_exit_130(tmp_path: Path):
    src, marks = tmp_path / "src", tmp_path / "marks"
    (src / "train").mkdir(parents=True)
    marks.mkdir()
    for i in range(4):
        (src / "train" / f"v{i}.mp4").write_bytes(b"never read: the job only waits")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(marks), str(src), str(tmp_path / "dst")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while len(list(marks.iterdir())) < 2:  # both workers are in a job
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the workers did not start"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == EXIT_INTERRUPTED, err
    assert err == "error: interrupted\n" and out == ""
