"""``python -m MODULE ARGS`` (or ``-c CODE``) in a fork of a process that has imported torch and torchvision already.

A fresh interpreter spends seconds importing torch and torchvision (whose ``ops`` import
``torch._dynamo``) before a command does anything; a test that runs many cheap commands
(``tests/docs/test_doc_commands.py``: the docs' ``make-data``, ``configs``, ``models`` ...) pays it
for each.  :class:`Prewarmed` starts one server process that imports those two third-party
packages once, then forks it per command: each command is a process of its own (own working
directory, environment, ``sys.argv``, stdout / stderr files, exit status), and imports the
project's modules itself, from scratch, as ``python -m`` does.  What differs from a fresh
interpreter is only that torch and torchvision are in ``sys.modules`` before the command starts;
tests of what a fresh process imports (``tests/core/test_import_light.py``) or of its start-up
keep their own ``subprocess`` calls.

The child runs :func:`runpy.run_module`; its exit is the interpreter's (``SystemExit``'s code, an
uncaught exception's traceback and status 1, non-daemon threads joined, atexit handlers run, the
streams flushed) but for the teardown of every module, skipped (``os._exit``: seconds with torch
loaded, and nothing a command's output depends on).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

#: the server: one JSON request per stdin line, answered by {"pid": ...} then {"rc": ...} on stdout
_SERVER = r"""
import json, os, runpy, sys

import torch, torchvision  # noqa: F401  the heavy third-party imports, once

def pythonpath(env):
    return [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]

own = pythonpath(os.environ)

child = None
for line in sys.stdin:
    request = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        child = request
        break
    print(json.dumps({"pid": pid}), flush=True)
    print(json.dumps({"rc": os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])}), flush=True)
if child is not None:
    os.chdir(child["cwd"])
    os.environ.clear()
    os.environ.update(child["env"])
    for fd, name, flags in ((0, os.devnull, os.O_RDONLY), (1, child["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                            (2, child["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
        opened = os.open(name, flags, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    module, code = child["module"], child["code"]
    sys.argv = ["-c" if module is None else module, *child["args"]]
    # what python -c / -m put first, then the command's PYTHONPATH (in place of the server's)
    sys.path[:] = ["" if module is None else os.getcwd(), *pythonpath(os.environ),
                   *(p for p in sys.path[1:] if p not in own)]
    del child, request, line, pid
    try:
        if module is None:
            exec(compile(code, "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        else:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:  # as the interpreter reads it
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        if not isinstance(e.code, int) and e.code is not None:
            print(e.code, file=sys.stderr)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    # the interpreter's exit, less tearing down the modules (seconds with torch loaded): non-daemon
    # threads joined, atexit handlers, the streams flushed
    import atexit, threading
    threading._shutdown()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
"""


class Prewarmed:
    """One warm server; :meth:`run` is ``subprocess.run([python, "-m", module, *args], ...)`` through it."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self._server = subprocess.Popen(
            [sys.executable, "-c", _SERVER], env=dict(env), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, bufsize=1,
        )  # fmt: skip
        self._tmp = tempfile.TemporaryDirectory(prefix="prewarmed-")
        self._count = 0

    def _reply(self, timeout: float) -> dict:
        ready, _, _ = select.select([self._server.stdout], [], [], timeout)
        line = self._server.stdout.readline() if ready else ""
        if not line:
            raise TimeoutError(f"no reply from the prewarmed server in {timeout:.0f} s")
        return json.loads(line)

    def run(
        self,
        module: str | None,
        args: list[str],
        cwd: Path,
        env: Mapping[str, str],
        timeout: float = 600,
        code: str | None = None,
    ) -> subprocess.CompletedProcess:
        """Run ``python -m module *args`` (``module`` None: ``python -c code *args``) in ``cwd`` with ``env``:
        its exit status, stdout and stderr."""
        self._count += 1
        out, err = (Path(self._tmp.name) / f"{self._count}.{name}" for name in ("out", "err"))
        request = dict(module=module, code=code, args=list(args), cwd=str(cwd), env=dict(env), stdout=str(out),
                       stderr=str(err))  # fmt: skip
        self._server.stdin.write(json.dumps(request) + "\n")
        self._server.stdin.flush()
        pid = self._reply(60)["pid"]
        try:
            rc = self._reply(timeout)["rc"]
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
            self._reply(60)  # the killed child's status: the next request's replies come next
            raise
        argv = [sys.executable, *(["-c", code] if module is None else ["-m", module]), *args]
        return subprocess.CompletedProcess(
            argv, rc, out.read_text(errors="replace"), err.read_text(errors="replace")
        )

    def close(self) -> None:
        """Stop the server (killed: it holds nothing to save, and its own exit would tear torch down, seconds)."""
        self._server.stdin.close()
        self._server.kill()
        self._server.wait(timeout=30)
        self._tmp.cleanup()
