"""A warm launcher: a process that makes a script's heavy imports once and forks each run of the script from there,
so a run starts in milliseconds instead of paying the imports again.

    python tests/warm.py MODULE ...     (started by WarmLauncher, below, in any interpreter: a venv's too)

Two users: the resume tests' training-loop children (``tests/torch/children.py``: torch, torchdata and wds_async,
1.5-2 s of CPU per child) and the third-party runs of open_clip and timm (``tests/compat/test_thirdparty.py``: torch,
torchvision, numpy, PIL and pandas in their own venv, about 6 of each run's 7-8 CPU seconds; the file's 13 tests
took 170 s started from nothing and 26 s forked).

Requests come on standard input, one JSON line each: ``{"script", "argv", "env", "stderr"}`` and optionally
``"stdout"`` (a file; ``/dev/null`` without it). For each, the launcher forks; the child starts a session of its
own (so the caller can SIGKILL its process group, DataLoader workers included), points its standard streams at
those files, takes ``env`` as its whole environment, puts the script's folder and ``env``'s ``PYTHONPATH`` at the
head of ``sys.path`` (what ``python SCRIPT`` does) and runs ``script`` as ``__main__`` with ``argv``, then ends as
the interpreter would (non-daemon threads joined, ``atexit`` handlers run; an exception prints its traceback and
exits 1). With ``"quick_exit": true`` it does the same and then ``os._exit()``s rather than tear the interpreter
down (about a second with torch loaded): for a script whose output is closed by then, and whose objects' finalizers
need not run. The launcher answers ``{"pid"}`` at once and ``{"status"}`` (the exit code, ``-9`` for SIGKILL) when
the child has ended. Every child is a fork of the launcher that only imported: no state passes between runs.

What may be preloaded: modules that are the same for every run. Whatever a run chooses through its ``PYTHONPATH``
or environment must be imported by the run itself (the third-party runs choose between webdataset 1.0.2, 0.2.86
and the wds-async shim, and open_clip and timm import webdataset: none of them is preloaded). The string hash seed
is fixed when an interpreter starts: every child has the launcher's.

A fork copies the one thread that calls it, so the launcher refuses to start (it answers ``{"refused": why}``)
when the imports left any other thread running; the callers then start each run from nothing.

The launcher's side uses the standard library alone, as it runs in interpreters that may lack this repository's
test dependencies.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import runpy
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

SCRIPT = str(Path(__file__).resolve())


# -- the caller's side ------------------------------------------------------------------------------------------
class WarmLauncher:
    """``python tests/warm.py MODULES`` as a subprocess of ``python`` with ``env`` (its ``PYTHONHASHSEED`` is every
    child's): children forked one at a time from a process that imported ``modules`` (see the module docstring).
    ``refused`` says why it did not start (None when it did)."""

    def __init__(self, python: str | os.PathLike[str], modules: Sequence[str], env: Mapping[str, str],
                 cwd: str | None = None, *, timeout: float = 120) -> None:
        self.hash_seed = env.get("PYTHONHASHSEED")
        self.proc = subprocess.Popen([str(python), SCRIPT, *modules], env=dict(env), cwd=cwd, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, bufsize=0)
        self._pending = b""  # what was read of the answers and not yet taken (the status can come with the pid)
        self.refused: str | None = None
        answer = self._answer(timeout)
        if answer is None or "ready" not in answer:
            self.refused = str(answer.get("refused") if answer else "no answer")
            self.close()
        self._status: int | None = None

    def _answer(self, timeout: float) -> dict[str, Any] | None:
        """The launcher's next answer line, waiting up to ``timeout`` for it (None: none yet, or it has gone)."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._pending:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                return None
            more = os.read(fd, 4096)
            if not more:
                return None
            self._pending += more
        line, self._pending = self._pending.split(b"\n", 1)
        return json.loads(line)  # type: ignore[no-any-return]

    def start(self, script: str, argv: Sequence[str], env: Mapping[str, str], stderr: str,
              stdout: str | None = None, *, quick_exit: bool = False) -> int:
        """Fork a child running ``script`` (as ``__main__``) with ``argv`` and ``env``; its pid. ``quick_exit``: the
        child ends without tearing the interpreter down (see the module docstring)."""
        if env.get("PYTHONHASHSEED", self.hash_seed) != self.hash_seed:
            raise ValueError(f"a child asks for PYTHONHASHSEED={env.get('PYTHONHASHSEED')!r}, which is fixed at "
                             f"the launcher's start ({self.hash_seed!r})")
        request = {"script": script, "argv": list(argv), "env": dict(env), "stderr": stderr}
        if stdout is not None:
            request["stdout"] = stdout
        if quick_exit:
            request["quick_exit"] = True
        self.send(request)
        answer = self._answer(30)
        assert answer is not None and "pid" in answer, f"the warm launcher did not start a child: {answer}"
        self._status = None
        return int(answer["pid"])

    def send(self, request: dict[str, Any]) -> None:
        """Write one request line (whole: a pipe may take a large environment in several writes)."""
        assert self.proc.stdin is not None
        data = memoryview((json.dumps(request) + "\n").encode())
        while data:
            data = data[os.write(self.proc.stdin.fileno(), data):]

    def ended(self) -> int | None:
        """The exit code of the last child (``-9``: killed), or None while it runs."""
        if self._status is None:
            answer = self._answer(0)
            if answer is not None:
                self._status = int(answer["status"])
        return self._status

    def run(self, script: str, argv: Sequence[str], env: Mapping[str, str], folder: Path, timeout: float, *,
            quick_exit: bool = False) -> subprocess.CompletedProcess[str]:
        """``python SCRIPT ARGV`` as ``subprocess.run`` with ``capture_output=True, text=True`` would give it, its
        output kept in ``folder``; a run past ``timeout`` seconds is killed (its process group) and raises
        ``subprocess.TimeoutExpired``. ``quick_exit`` as for :meth:`start`."""
        folder.mkdir(parents=True, exist_ok=True)
        out, err = (self._file(folder, suffix) for suffix in (".out", ".err"))
        pid = self.start(script, argv, env, err, stdout=out, quick_exit=quick_exit)
        answer = self._answer(timeout)
        if answer is None and self.proc.poll() is not None:
            raise RuntimeError(f"the warm launcher ended (exit status {self.proc.returncode}) while running {script}")
        if answer is None:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:  # it ended just now
                pass
            self._answer(30)
            raise subprocess.TimeoutExpired([script, *argv], timeout)
        self._status = int(answer["status"])
        return subprocess.CompletedProcess([script, *argv], self._status, Path(out).read_text(errors="replace"),
                                           Path(err).read_text(errors="replace"))

    @staticmethod
    def _file(folder: Path, suffix: str) -> str:
        fd, path = tempfile.mkstemp(suffix, dir=folder)
        os.close(fd)
        return path

    def close(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class ColdRunner:
    """:meth:`WarmLauncher.run`'s call with each run started from nothing (``python SCRIPT ARGV`` in ``cwd``): what a
    caller runs with where a launcher refused to start. ``folder`` and ``quick_exit`` are accepted and unused."""

    def __init__(self, python: str | os.PathLike[str], cwd: str | os.PathLike[str] | None = None) -> None:
        self.python, self.cwd = python, cwd

    def run(self, script: str, argv: Sequence[str], env: Mapping[str, str], folder: Path, timeout: float, *,
            quick_exit: bool = False) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.python), script, *argv], env=dict(env), cwd=self.cwd, capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def close(self) -> None:
        """Nothing to stop (as :meth:`WarmLauncher.close`, so a caller closes whichever runner it got)."""


#: What runs a script: forked from a launcher, or started from nothing.
Runner = WarmLauncher | ColdRunner


def warm_runner(python: str | os.PathLike[str], modules: Sequence[str], env: Mapping[str, str],
                cwd: str | None = None, *, timeout: float = 120) -> Runner:
    """A :class:`WarmLauncher` that imported ``modules``, or, where it refused to start, a :class:`ColdRunner` of
    the same interpreter and folder: the runner a caller uses either way, and closes when done."""
    launcher = WarmLauncher(python, modules, env, cwd, timeout=timeout)
    return ColdRunner(python, cwd) if launcher.refused else launcher


def close_launchers(launchers: list[Any], folders: list[Any]) -> None:
    """Stop the runners in ``launchers`` a module started (None: a launcher that refused) and remove its temporary
    ``folders``; both lists are emptied, so the module's next test starts afresh."""
    for launcher in launchers:
        if launcher is not None:
            launcher.close()
    launchers.clear()
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
    folders.clear()


# -- the launcher's side ----------------------------------------------------------------------------------------
def _threads() -> int:
    return len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1


def _child(request: dict[str, Any], base_path: list[str]) -> None:
    """In the forked child: become the script (never returns into the launcher's loop)."""
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    err = os.open(str(request["stderr"]), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    out = os.open(str(request["stdout"]), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) if "stdout" in request \
        else null
    for fd, target in ((0, null), (1, out), (2, err)):
        os.dup2(target, fd)
    for target in {null, out, err}:
        os.close(target)
    env = {str(k): str(v) for k, v in dict(request["env"]).items()}
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None  # looked up again from this environment's TMPDIR, as a fresh interpreter does
    script = str(request["script"])
    sys.argv = [script, *(str(a) for a in request["argv"])]
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.path.dirname(os.path.abspath(script)), *extra, *base_path]  # what `python script` builds
    if not request.get("quick_exit"):
        runpy.run_path(script, run_name="__main__")
        sys.exit(0)
    code = 1
    try:
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
        if not isinstance(exc.code, int | None):
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            for thread in threading.enumerate():  # non-daemon threads joined, as an exit does
                if thread is not threading.current_thread() and not thread.daemon:
                    thread.join()
            atexit._run_exitfuncs()  # multiprocessing's among them: DataLoader workers stopped and joined
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def main(modules: Sequence[str]) -> None:
    del sys.path[0]  # this file's folder, tests/, whose tests/torch would stand in for torch itself
    own = {p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    base_path = [p for p in sys.path if p not in own]
    for name in modules:
        importlib.import_module(name)
    out = sys.stdout
    if _threads() != 1:
        out.write(json.dumps({"refused": f"{_threads()} threads after the imports"}) + "\n")
        out.flush()
        return
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request, base_path)
        out.write(json.dumps({"pid": pid}) + "\n")
        out.flush()
        _, status = os.waitpid(pid, 0)
        out.write(json.dumps({"status": os.waitstatus_to_exitcode(status)}) + "\n")
        out.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
